"""The CUDA fused update with half-precision optimizer slots (``segment_sum_apply_lowp`` given
slots in the values' format: ``segment_sum_apply_lowp_half_slots`` in cuda/lowp.cu) against
the numpy reference, bit for bit, on gradients whose sums are exact in any order (so no
backend's summation order shows); slots of another dtype are refused by name and nothing
changes. On the CPU executor (tests/cuda_cpu) at small sizes, on a GPU at full size.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from evdb.errors import InvalidTypeError
from evdb.kernels import OptimizerKind, backend
from evdb.kernels.reference.lowp import widen

from ..kernels.test_lowp_slots import HALF, KINDS, rounded, update_case
from .conftest import Device

DIM = 11


def update(
    kernels: Any, args: tuple[Any, ...], kind: int, stochastic: bool, slots: Any = None
) -> tuple[np.ndarray, np.ndarray]:
    """(values, slots) after one update of copies of a case's arrays (slots: the case's, or
    these instead); numpy arrays in and out, device copies for the gpu backend."""
    on_device = kernels is backend("gpu")
    grads, positions, bounds, rows, keys, hyper, values, case_slots = args
    arrays = [grads, positions, bounds, rows, keys, values, case_slots if slots is None else slots]
    if on_device:
        import cupy as cp

        dev = [cp.asarray(a) for a in arrays]
    else:
        dev = [a.copy() for a in arrays]
    *inputs, values_out, slots_out = dev
    kernels.segment_sum_apply_lowp(*inputs, kind, hyper, 5, 7, stochastic, values_out, slots_out)
    if on_device:
        return cp.asnumpy(values_out), cp.asnumpy(slots_out)
    return values_out, slots_out


@pytest.mark.parametrize("fmt", sorted(HALF))
@pytest.mark.parametrize("stochastic", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_the_cuda_half_slot_update_is_the_reference_bit_for_bit(
    device: Device, gpu, reference, rng, fmt: str, stochastic: bool, kind: int
) -> None:
    args = update_case(rng, fmt, device.size(5000, 60), DIM, kind, 2)
    start, slots0 = args[6].view(np.uint16), args[7].view(np.uint16)
    want = [a.view(np.uint16) for a in update(reference, args, kind, stochastic)]
    got = [a.view(np.uint16) for a in update(gpu, args, kind, stochastic)]
    assert (want[0] != start).mean() > 0.5  # the rows moved
    if kind != OptimizerKind.SGD:
        live = args[3][args[3] >= 0]
        assert (want[1][live] != slots0[live]).mean() > 0.5  # and their slots
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize("fmt", sorted(HALF))
def test_half_slots_are_the_float32_slots_rounded_on_the_device(
    device: Device, gpu, rng, fmt: str
) -> None:
    # One rule on the device too: float32 slots holding the widened half slots give the same
    # row, and those slots rounded to nearest are the half-slot update's (nearest) slots
    kind = OptimizerKind.ADAGRAD
    args = update_case(rng, fmt, device.size(2000, 50), DIM, kind, 2)
    half_values, half_slots = update(gpu, args, kind, False)
    values, full_slots = update(gpu, args, kind, False, slots=widen(args[7]))
    assert full_slots.dtype == np.float32
    np.testing.assert_array_equal(half_values.view(np.uint16), values.view(np.uint16))
    want = rounded(full_slots, fmt)
    np.testing.assert_array_equal(half_slots.view(np.uint16), want.view(np.uint16))


def test_slots_of_another_dtype_are_refused_and_nothing_changes(device: Device, gpu) -> None:
    import cupy as cp

    args = [
        cp.asarray(a)
        for a in (
            np.ones((1, 3), np.float32), np.zeros(1, np.int64), np.array([0, 1]),
            np.zeros(1, np.int64), np.zeros(2, np.int64),
        )
    ]  # fmt: skip
    for values_dtype, slots_dtype in (
        (np.uint16, np.float16),  # bfloat16 values, float16 slots
        (np.float16, np.uint16),
        (np.float16, np.float64),
    ):
        values, slots = cp.zeros((2, 3), values_dtype), cp.zeros((2, 3), slots_dtype)
        with pytest.raises(InvalidTypeError, match=r"slots: expected float32, or the values'"):
            gpu.segment_sum_apply_lowp(
                *args, OptimizerKind.ADAGRAD, np.ones(8), 0, 0, True, values, slots
            )
        assert not bool(values.view(np.uint16).any()) and not bool(slots.any())
