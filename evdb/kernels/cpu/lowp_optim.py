"""Numba fused update of half-precision rows (see ``reference.lowp_optim``): the gradient of
each row summed in float64, the rule applied in float64 (``cpu.optim.update_row``, the float32
update's own rules, inlined), the row rounded to float32 and then to its half format
(stochastically, with the bits of reference.lowp) in the same pass."""

from __future__ import annotations

import numpy as np
from numba import prange, types

from evdb.kernels.cpu._common import (
    F4_2D,
    F8,
    I8,
    PARALLEL_MIN_KEYS,
    b1,
    i8,
    lazy_njit,
    prefetch,
    u8,
)
from evdb.kernels.cpu.lowp import (
    U2_2D,
    bits_float32,
    narrow_row,
    row_base,
    step_salt,
    widen_bits,
)
from evdb.kernels.cpu.optim import sum_gradient, update_row
from evdb.kernels.reference.lowp import half_format
from evdb.kernels.reference.lowp_optim import check_lowp_kind

__all__ = ["segment_sum_apply_lowp"]

ROW_CHUNK = 64  # rows per task: the scratch rows are allocated once per chunk
PREFETCH_AHEAD = 8  # rows between a prefetch and its use, as cpu.optim

_ARGS = (F4_2D, I8, I8, I8, I8, i8, F8, u8, i8, b1, i8, U2_2D, F4_2D)


@lazy_njit(types.void(i8, *_ARGS), inline="always")
def _apply_lowp_chunk(  # type: ignore[no-untyped-def]
    c, grads, positions, bounds, rows, keys, kind, hyper, seed, step, stochastic, fmt,
    values, slots,
):  # fmt: skip
    # Rows are distinct, so chunks never touch the same row: no atomics (as cpu.optim).
    dim = values.shape[1]
    g = np.empty(dim, np.float64)
    w = np.empty(dim, np.float64)
    salt = step_salt(seed, step)
    hi = min((c + 1) * ROW_CHUNK, rows.shape[0])
    for u in range(c * ROW_CHUNK, hi):
        # The rows' misses overlap as in cpu.optim: a half row is 32 values a cache line
        if u + PREFETCH_AHEAD < hi and rows[u + PREFETCH_AHEAD] >= 0:
            ahead = rows[u + PREFETCH_AHEAD]
            for j in range(0, dim, 32):
                prefetch(values, ahead, j)
            for j in range(0, slots.shape[1], 16):
                prefetch(slots, ahead, j)
        r = rows[u]
        if r < 0:
            continue
        sum_gradient(grads, positions, bounds, u, g)
        if fmt == 0:  # one loop per format: each vectorises
            for j in range(dim):
                w[j] = bits_float32(widen_bits(values[r, j], 0))
        else:
            for j in range(dim):
                w[j] = bits_float32(widen_bits(values[r, j], 1))
        update_row(kind, hyper, w, g, slots, r)
        base = row_base(salt, keys[u]) if stochastic else np.uint64(0)
        narrow_row(w, base, stochastic, fmt, values, r)


@lazy_njit(types.void(*_ARGS))
def _segment_sum_apply_lowp_serial(  # type: ignore[no-untyped-def]
    grads, positions, bounds, rows, keys, kind, hyper, seed, step, stochastic, fmt, values, slots
):
    for c in range((rows.shape[0] + ROW_CHUNK - 1) // ROW_CHUNK):
        _apply_lowp_chunk(
            c, grads, positions, bounds, rows, keys, kind, hyper, seed, step, stochastic, fmt,
            values, slots,
        )  # fmt: skip


@lazy_njit(types.void(*_ARGS), parallel=True)
def _segment_sum_apply_lowp_parallel(  # type: ignore[no-untyped-def]
    grads, positions, bounds, rows, keys, kind, hyper, seed, step, stochastic, fmt, values, slots
):
    for c in prange((rows.shape[0] + ROW_CHUNK - 1) // ROW_CHUNK):
        _apply_lowp_chunk(
            c, grads, positions, bounds, rows, keys, kind, hyper, seed, step, stochastic, fmt,
            values, slots,
        )  # fmt: skip


def segment_sum_apply_lowp(  # type: ignore[no-untyped-def]
    grads, positions, bounds, rows, keys, kind, hyper, seed, step, stochastic, values, slots
) -> None:
    """Fused segment-sum + update of half-precision rows (see reference.lowp_optim)."""
    fmt = 0 if half_format("values", values) == "bfloat16" else 1
    kind = check_lowp_kind(kind)
    big = positions.shape[0] >= PARALLEL_MIN_KEYS
    kernel = _segment_sum_apply_lowp_parallel if big else _segment_sum_apply_lowp_serial
    seed = np.uint64(int(seed) & (2**64 - 1))
    kernel(
        grads, positions, bounds, rows, keys, kind, hyper, seed, step, bool(stochastic), fmt,
        values.view(np.uint16), slots,
    )  # fmt: skip
