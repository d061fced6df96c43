"""Half-precision and quantised rows on the device (``cuda/lowp.cu``; the formats, random
bits and quantisation rule are ``reference.lowp``'s).

A float16 slab is handed to the kernels as its uint16 view with ``fmt`` 1 (bfloat16 slabs
are uint16 already, ``fmt`` 0), and float32 rows a second time as their uint32 view where a
kernel needs their bits, so the CUDA C needs no bit-cast intrinsic.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from evdb.errors import InvalidArgumentError, InvalidTypeError
from evdb.kernels.gpu.runtime import (
    BLOCK,
    SHARED_BYTES,
    check_array,
    check_slots,
    cuda_kernel,
    cupy_module,
    f64,
    i32,
    i64,
    launch,
    u64,
)
from evdb.kernels.reference.lowp import (
    FLOAT16_MAX,
    check_bits,
    check_quantize_args,
    unquantizable_row_error,
)
from evdb.kernels.reference.lowp_optim import check_lowp_kind, check_row_keys, has_half_slots

__all__ = [
    "dequantize_rows",
    "probe_gather_combine_dequantized",
    "probe_gather_combine_widened",
    "probe_gather_dequantized",
    "probe_gather_widened",
    "quantize_rows",
    "round_rows",
    "segment_sum_apply_lowp",
    "widen_rows",
]


def _half(name: str, a: Any) -> tuple[Any, np.int32]:
    """(a as uint16 bits, fmt) of a bfloat16 (uint16) or float16 slab, checked."""
    cupy_module()
    if a.dtype not in (np.uint16, np.float16):
        raise InvalidTypeError(
            f"{name}: expected uint16 (bfloat16 bits) or float16 storage, got {a.dtype}"
        )
    check_array(name, a, a.dtype, 2)
    return a.view(np.uint16), i32(0 if a.dtype == np.uint16 else 1)


def round_rows(
    values: Any, rows: Any, keys: Any, seed: int, step: int, stochastic: bool, out: Any
) -> None:
    """Round float32 rows into a half-precision slab (see reference.lowp.round_rows)."""
    bits, fmt = _half("out", out)
    n, dim = check_array("values", values, np.float32, 2).shape
    check_array("rows", rows, np.int64, 1)
    check_array("keys", keys, np.int64, 1)
    args = (values, values.view(np.uint32), i64(n), i64(dim), rows, keys, u64(seed), i64(step))
    launch(cuda_kernel("lowp", "round_rows"), n * dim, (*args, i32(bool(stochastic)), fmt, bits))


def widen_rows(src: Any, rows: Any, out: Any) -> None:
    """Gather half-precision rows as float32 (see reference.lowp.widen_rows)."""
    bits, fmt = _half("src", src)
    n = check_array("rows", rows, np.int64, 1).shape[0]
    dim = check_array("out", out, np.float32, 2).shape[1]
    args = (bits, i64(dim), rows, i64(n), fmt, out.view(np.uint32))
    launch(cuda_kernel("lowp", "widen_rows"), n * dim, args)


def quantize_rows(values: Any, bits: int, out: Any) -> None:
    """Quantise float32 rows row-wise (see reference.lowp.quantize_rows); raises before
    writing when bits, out's shape or a value is invalid."""
    cp = cupy_module()
    n, dim = check_array("values", values, np.float32, 2).shape
    check_array("out", out, np.uint8, 2)
    check_quantize_args(n, dim, bits, out.shape)
    ok = (cp.abs(values) <= FLOAT16_MAX).all(axis=1)  # NaN compares False
    if n and not bool(ok.all()):
        raise unquantizable_row_error(int(cp.argmin(ok)))
    args = (values, i64(n), i64(dim), i32(bits), out, i64(out.shape[1]))
    launch(cuda_kernel("lowp", "quantize_rows"), n, args)


def dequantize_rows(q: Any, bits: int, rows: Any, out: Any) -> None:
    """Gather quantised rows as float32 (see reference.lowp.dequantize_rows)."""
    check_bits(bits)
    check_array("q", q, np.uint8, 2)
    n = check_array("rows", rows, np.int64, 1).shape[0]
    dim = check_array("out", out, np.float32, 2).shape[1]
    args = (q, i64(q.shape[1]), i32(bits), rows, i64(n), i64(dim), out)
    launch(cuda_kernel("lowp", "dequantize_rows"), n * dim, args)


def probe_gather_dequantized(
    slots: Any,
    q: Any,
    bits: int,
    last_step: Any,
    keys: Any,
    min_live_step: int,
    out: Any,
    out_rows: Any,
) -> int:
    """probe_gather over quantised rows (see reference.lowp.probe_gather_dequantized)."""
    cp = cupy_module()
    check_bits(bits)
    slots, cap = check_slots(slots)
    check_array("q", q, np.uint8, 2)
    check_array("last_step", last_step, np.int64, 1)
    n = check_array("keys", keys, np.int64, 1).shape[0]
    dim = check_array("out", out, np.float32, 2).shape[1]
    check_array("out_rows", out_rows, np.int64, 1)
    missing = cp.zeros(1, np.uint64)
    args = (slots, cap, q, i64(q.shape[1]), i32(bits), last_step, keys, i64(n), i64(dim))
    tail = (i64(min_live_step), out, out_rows, missing)
    launch(cuda_kernel("lowp", "probe_gather_dequantized"), n, (*args, *tail))
    return int(missing.get()[0]) if n else 0


def probe_gather_widened(
    slots: Any,
    values: Any,
    last_step: Any,
    keys: Any,
    min_live_step: int,
    out: Any,
    out_rows: Any,
) -> int:
    """probe_gather over half-precision rows (see reference.lowp.probe_gather_widened)."""
    cp = cupy_module()
    half, fmt = _half("values", values)
    slots, cap = check_slots(slots)
    check_array("last_step", last_step, np.int64, 1)
    n = check_array("keys", keys, np.int64, 1).shape[0]
    dim = check_array("out", out, np.float32, 2).shape[1]
    check_array("out_rows", out_rows, np.int64, 1)
    missing = cp.zeros(1, np.uint64)
    args = (slots, cap, half, fmt, last_step, keys, i64(n), i64(dim), i64(min_live_step))
    tail = (out.view(np.uint32), out_rows, missing)
    launch(cuda_kernel("lowp", "probe_gather_widened"), n, (*args, *tail))
    return int(missing.get()[0]) if n else 0


def _combine_args(
    slots: Any, last_step: Any, keys: Any, bounds: Any, weights: Any, combiner: int, out: Any
) -> tuple[Any, np.int64, int, int]:
    """(slots, cap, n_bags, dim) after checking a fused combine's common arguments."""
    slots, cap = check_slots(slots)
    check_array("last_step", last_step, np.int64, 1)
    check_array("keys", keys, np.int64, 1)
    n_bags = check_array("bounds", bounds, np.int64, 1).shape[0] - 1
    check_array("weights", weights, np.float32, 1)
    dim = check_array("out", out, np.float32, 2).shape[1]
    if combiner not in (0, 1, 2):
        raise InvalidArgumentError(
            f"combiner: expected 0 (sum), 1 (mean) or 2 (sqrtn), got {combiner}"
        )
    return slots, cap, int(n_bags), int(dim)


def probe_gather_combine_dequantized(
    slots: Any,
    q: Any,
    bits: int,
    last_step: Any,
    keys: Any,
    bounds: Any,
    weights: Any,
    min_live_step: int,
    combiner: int,
    max_norm: float,
    init_kind: int,
    init_seed: int,
    init_a: float,
    init_b: float,
    out: Any,
) -> int:
    """Fused probe + dequantise + combine (see reference.lowp.probe_gather_combine_dequantized)."""
    cp = cupy_module()
    check_bits(bits)
    check_array("q", q, np.uint8, 2)
    slots, cap, n_bags, dim = _combine_args(slots, last_step, keys, bounds, weights, combiner, out)
    if n_bags <= 0:
        return 0
    missing = cp.zeros(1, np.uint64)
    args = (slots, cap, q, i64(q.shape[1]), i32(bits), last_step, keys, bounds, weights)
    scalars = (i64(n_bags), i64(dim), i64(min_live_step), i32(combiner), f64(max_norm))
    init = (i32(init_kind), u64(init_seed), f64(init_a), f64(init_b))
    kernel = cuda_kernel("lowp", "probe_gather_combine_dequantized")
    launch(kernel, n_bags, (*args, *scalars, *init, out, missing))
    return int(missing.get()[0])


def probe_gather_combine_widened(
    slots: Any,
    values: Any,
    last_step: Any,
    keys: Any,
    bounds: Any,
    weights: Any,
    min_live_step: int,
    combiner: int,
    max_norm: float,
    init_kind: int,
    init_seed: int,
    init_a: float,
    init_b: float,
    out: Any,
) -> int:
    """Fused probe + widen + combine (see reference.lowp.probe_gather_combine_widened)."""
    cp = cupy_module()
    half, fmt = _half("values", values)
    slots, cap, n_bags, dim = _combine_args(slots, last_step, keys, bounds, weights, combiner, out)
    if n_bags <= 0:
        return 0
    missing = cp.zeros(1, np.uint64)
    args = (slots, cap, half, fmt, last_step, keys, bounds, weights)
    scalars = (i64(n_bags), i64(dim), i64(min_live_step), i32(combiner), f64(max_norm))
    init = (i32(init_kind), u64(init_seed), f64(init_a), f64(init_b))
    kernel = cuda_kernel("lowp", "probe_gather_combine_widened")
    launch(kernel, n_bags, (*args, *scalars, *init, out, missing))
    return int(missing.get()[0])


def segment_sum_apply_lowp(
    grads: Any,
    positions: Any,
    bounds: Any,
    rows: Any,
    row_keys: Any,
    kind: int,
    hyper: Any,
    seed: int,
    step: int,
    stochastic: bool,
    values: Any,
    slots: Any,
) -> None:
    """Fused segment-sum + update of half-precision rows (see reference.lowp_optim); slots
    float32, or the values' own storage (uint16 bfloat16 bits, float16): half slots, rounded
    with the row (columns dim..)."""
    cp = cupy_module()
    bits, fmt = _half("values", values)
    kind = check_lowp_kind(kind)
    check_array("grads", grads, np.float32, 2)
    check_array("positions", positions, np.int64, 1)
    check_array("bounds", bounds, np.int64, 1)
    u = check_array("rows", rows, np.int64, 1).shape[0]
    check_array("row_keys", row_keys, np.int64, 1)
    check_row_keys(row_keys, values)
    dim = values.shape[1]
    n_slots = check_array("slots", slots, getattr(slots, "dtype", np.float32), 2).shape[1]
    half_slots = has_half_slots(values, slots)  # or InvalidTypeError naming slots
    host = cp.asnumpy(hyper) if isinstance(hyper, cp.ndarray) else np.asarray(hyper)
    h = [float(x) for x in np.asarray(host, dtype=np.float64).ravel()[:4]]
    h += [0.0] * (4 - len(h))
    per_thread = 2 * dim * 8  # float64 gradient and row of one thread
    if per_thread > SHARED_BYTES:
        raise InvalidArgumentError(
            f"values: dim {dim} exceeds the gpu half update's limit of {SHARED_BYTES // 16}"
        )
    if u == 0:
        return
    block = max(1, min(BLOCK, SHARED_BYTES // max(per_thread, 1)))
    args = (grads, i64(dim), positions, bounds, rows, row_keys, i64(u), i32(kind))
    slot_arg = slots.view(np.uint16) if half_slots else slots
    tail = (u64(seed), i64(step), i32(bool(stochastic)), fmt, bits, slot_arg, i64(n_slots))
    kernel = (
        cuda_kernel("lowp", "segment_sum_apply_lowp_half_slots")
        if half_slots
        else cuda_kernel("lowp", "segment_sum_apply_lowp")
    )
    launch(
        kernel,
        u,
        (*args, *(f64(x) for x in h), *tail),
        block=block,
        shared=block * per_thread,
    )
