"""The fused half-precision update with half-precision optimizer slots (``slot_dtype``).

The cpu kernel (both drivers) equals the reference bit for bit; with round-to-nearest it is
the float32-slot update with the slots then rounded (one rule); the row's own rounding does
not depend on where its slots live; stochastic rounding lets an accumulator's tiny
increments add up where round-to-nearest loses them; slots of another dtype are refused.
"""

from __future__ import annotations

import numpy as np
import pytest

from evdb.errors import InvalidTypeError
from evdb.kernels import BACKENDS, OptimizerKind, backend
from evdb.kernels.reference.lowp import widen

HALF = {"bfloat16": np.uint16, "float16": np.float16}
KINDS = [
    OptimizerKind.SGD,
    OptimizerKind.ADAGRAD,
    OptimizerKind.ADAM,
    OptimizerKind.ROWWISE_ADAGRAD,
]
HYPER = {
    OptimizerKind.SGD: [0.1, 0.01, 0.05],  # lr, weight decay, group lasso
    OptimizerKind.ADAGRAD: [0.1, 1e-10, 0.01, 0.05],
    OptimizerKind.ADAM: [0.01, 0.9, 0.999, 1e-8],  # step size, betas, eps
    OptimizerKind.ROWWISE_ADAGRAD: [0.1, 1e-8],
}


def n_slots(kind: int, dim: int) -> int:
    return {0: 0, 1: dim, 2: 2 * dim, 6: 1}[int(kind)]


def rounded(x: np.ndarray, fmt: str) -> np.ndarray:
    """float32 x stored in fmt, to nearest even."""
    out = np.zeros(x.shape, HALF[fmt])
    rows = np.arange(x.shape[0], dtype=np.int64)
    backend("reference").round_rows(x.astype(np.float32), rows, rows, 0, 0, False, out)
    return out


def update_case(rng: np.random.Generator, fmt: str, n: int, dim: int, kind: int, reps: int):  # type: ignore[no-untyped-def]
    """(grads, positions, bounds, rows, row_keys, hyper, values, slots): n rows in a table of
    n + 7 (row_keys: a key for each), each with ``reps`` positions (so both drivers' sums
    run), half values and half slots (positive: accumulators and second moments are)."""
    n_rows = n + 7
    values = rounded(rng.standard_normal((n_rows, dim)), fmt)
    slots = rounded(rng.uniform(0.05, 2.0, (n_rows, n_slots(kind, dim))), fmt)
    rows = rng.permutation(n_rows)[:n].astype(np.int64)
    rows[1] = -1  # a dropped row: untouched
    keys = rng.integers(-(2**63), 2**63 - 1, n_rows, dtype=np.int64)
    inverse = np.repeat(np.arange(n, dtype=np.int64), reps)
    positions = rng.permutation(inverse.shape[0]).astype(np.int64)
    order = np.argsort(inverse[positions], kind="stable")
    positions = positions[order]
    bounds = np.arange(0, n * reps + 1, reps, dtype=np.int64)
    # gradients exact in float32 sums of 2 (reps=2): every backend sums to the same float64
    grads = (rng.integers(-64, 64, (n * reps, dim)) / 64.0).astype(np.float32)
    hyper = np.array(HYPER[kind] + [0.0] * (8 - len(HYPER[kind])))
    return grads, positions, bounds, rows, keys, hyper, values, slots


@pytest.mark.parametrize("fmt", sorted(HALF))
@pytest.mark.parametrize("stochastic", [False, True])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [40, 1500])  # the serial and the parallel driver (>= 1,024 keys)
def test_half_slots_update_is_the_reference_bit_for_bit(
    rng, fmt: str, stochastic: bool, kind: int, n: int
) -> None:
    grads, positions, bounds, rows, keys, hyper, start, slots0 = update_case(
        rng, fmt, n, 11, kind, 2
    )
    got = {}
    for name in BACKENDS:
        values, slots = start.copy(), slots0.copy()
        backend(name).segment_sum_apply_lowp(
            grads, positions, bounds, rows, keys, kind, hyper, 5, 7, stochastic, values, slots
        )
        got[name] = (values.view(np.uint16), slots.view(np.uint16))
    want = got["reference"]
    assert (want[0] != start.view(np.uint16)).mean() > 0.5  # the rows moved
    if kind != OptimizerKind.SGD:
        live = rows[rows >= 0]
        assert (want[1][live] != slots0.view(np.uint16)[live]).mean() > 0.5  # the slots too
    dropped = np.setdiff1d(np.arange(start.shape[0]), rows)  # rows[1] = -1 among them
    np.testing.assert_array_equal(want[0][dropped], start.view(np.uint16)[dropped])
    for name in BACKENDS:
        np.testing.assert_array_equal(got[name][0], want[0])
        np.testing.assert_array_equal(got[name][1], want[1])


@pytest.mark.parametrize("stochastic", [False, True])
@pytest.mark.parametrize("n", [40, 1500])
def test_float16_subnormal_slots_are_the_reference_bit_for_bit(
    rng, stochastic: bool, n: int
) -> None:
    # Adam's moments of tiny gradients fall among float16's subnormals, which the cpu kernel
    # redoes after its vectorised rounding: in the slots' columns of the record too.
    grads, positions, bounds, rows, keys, hyper, start, slots0 = update_case(
        rng, "float16", n, 11, OptimizerKind.ADAM, 2
    )
    grads *= np.float32(2.0**-12)
    slots0[:] = 0
    got = {}
    for name in BACKENDS:
        values, slots = start.copy(), slots0.copy()
        backend(name).segment_sum_apply_lowp(
            grads, positions, bounds, rows, keys, OptimizerKind.ADAM, hyper, 5, 7, stochastic,
            values, slots,
        )  # fmt: skip
        got[name] = slots.view(np.uint16)
    first_moments = got["reference"][rows[rows >= 0], :11]
    subnormal = ((first_moments & 0x7C00) == 0) & ((first_moments & 0x3FF) != 0)
    assert subnormal.mean() > 0.5
    for name in BACKENDS:
        np.testing.assert_array_equal(got[name], got["reference"])


@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.parametrize("fmt", sorted(HALF))
@pytest.mark.parametrize("kind", KINDS[1:])
def test_half_slots_are_the_float32_slots_rounded(
    rng, backend_name: str, fmt: str, kind: int
) -> None:
    # One rule: the update with float32 slots holding the widened half slots gives the same
    # row; its slots, rounded to nearest, are the half-slot update's slots (nearest). With
    # stochastic rounding the row's bits are its own columns' bits either way.
    k = backend(backend_name)
    grads, positions, bounds, rows, keys, hyper, start, slots0 = update_case(
        rng, fmt, 300, 9, kind, 2
    )
    for stochastic in (False, True):
        half, half_slots = start.copy(), slots0.copy()
        k.segment_sum_apply_lowp(
            grads, positions, bounds, rows, keys, kind, hyper, 3, 4, stochastic, half, half_slots
        )
        full, full_slots = start.copy(), widen(slots0)
        k.segment_sum_apply_lowp(
            grads, positions, bounds, rows, keys, kind, hyper, 3, 4, stochastic, full, full_slots
        )
        np.testing.assert_array_equal(half.view(np.uint16), full.view(np.uint16))
        if not stochastic:
            want = rounded(full_slots, fmt)
            np.testing.assert_array_equal(half_slots.view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.parametrize("fmt", sorted(HALF))
def test_stochastic_slots_let_tiny_increments_add_up(backend_name: str, fmt: str) -> None:
    # Row-wise Adagrad adds mean(g^2) to its accumulator: here a tenth of the accumulator's
    # ulp a step. Rounded to nearest, every increment is lost; stochastically rounded, the
    # accumulator follows the float64 sum on average.
    k = backend(backend_name)
    n, dim, steps = 2048, 4, 30
    acc0 = 1.5  # ulp: 2^-7 (bfloat16), 2^-10 (float16)
    one_ulp = 2.0 ** -(7 if fmt == "bfloat16" else 10)
    inc = 0.1 * one_ulp
    grads = np.full((n, dim), np.sqrt(inc), np.float32)
    inc = float(np.float64(grads[0, 0]) ** 2)  # the float32 gradient's own square
    hyper = np.array([1e-30, 0.0] + [0.0] * 6)  # lr tiny: the values stay put
    keys = np.arange(n, dtype=np.int64) * 31 + 7
    pos = np.arange(n, dtype=np.int64)
    bounds = np.arange(n + 1, dtype=np.int64)
    means = {}
    for sr in (False, True):
        values = rounded(np.ones((n, dim)), fmt)
        slots = rounded(np.full((n, 1), acc0), fmt)
        for s in range(steps):
            k.segment_sum_apply_lowp(
                grads, pos, bounds, pos, keys, OptimizerKind.ROWWISE_ADAGRAD, hyper, 9, s, sr,
                values, slots,
            )  # fmt: skip
        means[sr] = widen(slots).astype(np.float64).mean()
    drift = steps * inc
    assert means[False] == acc0  # every increment was lost
    assert abs((means[True] - acc0) - drift) < 0.1 * drift  # within 10% of the true drift


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_slots_of_another_dtype_are_refused_and_nothing_changes(backend_name: str) -> None:
    k = backend(backend_name)
    args = (np.ones((1, 3), np.float32), np.zeros(1, np.int64), np.array([0, 1]))
    rest = (np.zeros(1, np.int64), np.zeros(2, np.int64), OptimizerKind.ADAGRAD, np.ones(8))
    for values, slots in (
        (np.zeros((2, 3), np.uint16), np.zeros((2, 3), np.float16)),  # bfloat16 / float16
        (np.zeros((2, 3), np.float16), np.zeros((2, 3), np.float64)),
    ):
        with pytest.raises(InvalidTypeError, match=r"slots: expected float32, or the values'"):
            k.segment_sum_apply_lowp(*args, *rest, 0, 0, True, values, slots)
        assert not values.view(np.uint16).any() and not slots.any()
