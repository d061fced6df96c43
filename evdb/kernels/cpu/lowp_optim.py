"""Numba fused update of half-precision rows (see ``reference.lowp_optim``): the gradient of
each row summed in float64, the rule applied in float64 (``cpu.optim.update_row``, the float32
update's own rules, inlined), the row rounded to float32 and then to its half format
(stochastically, with the bits of reference.lowp) in the same pass. Half-precision slots
(in the values' format) are widened into float32 scratch, updated by the same rule, and
rounded with the row as one record of dim + n_slots columns. Each chunk's updated rows are
rounded together after its updates (cpu.lowp.narrow_chunk), then stored."""

from __future__ import annotations

import numpy as np
from numba import njit, prange, types

from evdb.kernels.cpu._common import (
    F4_2D,
    F8,
    I8,
    I8_2D,
    OPTS,
    PARALLEL_MIN_KEYS,
    b1,
    i8,
    lazy_njit,
    prefetch,
    u8,
)
from evdb.kernels.cpu.lowp import (
    ROW_CHUNK,
    U2_2D,
    bits_float32,
    chunk_scratch,
    float32_bits,
    narrow_chunk,
    row_base,
    step_salt,
    widen_bits,
)
from evdb.kernels.cpu.optim import sum_gradient, update_row
from evdb.kernels.reference.lowp import half_format
from evdb.kernels.reference.lowp_optim import check_lowp_kind, check_row_keys, has_half_slots

__all__ = ["segment_sum_apply_lowp"]

PREFETCH_AHEAD = 8  # rows between a prefetch and its use, as cpu.optim

# row_keys comes as its (R, 1) view: the prefetch intrinsic addresses 2-d arrays
_ARGS = (F4_2D, I8, I8, I8, I8_2D, i8, F8, u8, i8, b1, i8, U2_2D, F4_2D)


@njit(inline="always", **OPTS)
def widen_into(src, r, fmt, out):  # type: ignore[no-untyped-def]
    """out[j] = half row src[r] widened, as float32 or float64 (a loop per format)."""
    if fmt == 0:
        for j in range(src.shape[1]):
            out[j] = bits_float32(widen_bits(src[r, j], 0))
    else:
        for j in range(src.shape[1]):
            out[j] = bits_float32(widen_bits(src[r, j], 1))


@lazy_njit(types.void(i8, *_ARGS), inline="always")
def _apply_lowp_chunk(  # type: ignore[no-untyped-def]
    c, grads, positions, bounds, rows, row_keys, kind, hyper, seed, step, stochastic, fmt,
    values, slots,
):  # fmt: skip
    # Rows are distinct, so chunks never touch the same row: no atomics (as cpu.optim).
    dim = values.shape[1]
    g = np.empty(dim, np.float64)
    w = np.empty(dim, np.float64)
    xbits, bases, hs = chunk_scratch(dim)
    salt = step_salt(seed, step)
    lo = c * ROW_CHUNK
    hi = min(lo + ROW_CHUNK, rows.shape[0])
    for u in range(lo, hi):
        # The rows' misses overlap as in cpu.optim: a half row is 32 values a cache line
        if u + PREFETCH_AHEAD < hi and rows[u + PREFETCH_AHEAD] >= 0:
            ahead = rows[u + PREFETCH_AHEAD]
            for j in range(0, dim, 32):
                prefetch(values, ahead, j)
            for j in range(0, slots.shape[1], 16):
                prefetch(slots, ahead, j)
            prefetch(row_keys, ahead, 0)  # the row's key: a random read like the row's
        r = rows[u]
        if r < 0:
            continue
        sum_gradient(grads, positions, bounds, u, g)
        widen_into(values, r, fmt, w)
        update_row(kind, hyper, w, g, slots, r)
        i = u - lo
        for j in range(dim):
            xbits[i, j] = float32_bits(np.float32(w[j]))
        if stochastic:
            bases[i] = row_base(salt, row_keys[r, 0])
    narrow_chunk(xbits, bases, hi - lo, stochastic, fmt, hs, rows, lo, values, values)


# The same, slots stored in the values' half format
_ARGS_HALF_SLOTS = (*_ARGS[:-1], U2_2D)


@lazy_njit(types.void(i8, *_ARGS_HALF_SLOTS), inline="always")
def _apply_lowp_slots_chunk(  # type: ignore[no-untyped-def]
    c, grads, positions, bounds, rows, row_keys, kind, hyper, seed, step, stochastic, fmt,
    values, slots,
):  # fmt: skip
    # _apply_lowp_chunk with half slots: the slots are widened into float32 scratch (the
    # rule stores float32 slots, as the reference rounds them) and the row and its slots are
    # rounded as one record, so the slots draw columns dim.. of the row's random bits.
    dim, n_slots = values.shape[1], slots.shape[1]
    g = np.empty(dim, np.float64)
    w = np.empty(dim, np.float64)
    s = np.empty((1, n_slots), np.float32)
    xbits, bases, hs = chunk_scratch(dim + n_slots)
    salt = step_salt(seed, step)
    lo = c * ROW_CHUNK
    hi = min(lo + ROW_CHUNK, rows.shape[0])
    for u in range(lo, hi):
        if u + PREFETCH_AHEAD < hi and rows[u + PREFETCH_AHEAD] >= 0:
            ahead = rows[u + PREFETCH_AHEAD]
            for j in range(0, dim, 32):
                prefetch(values, ahead, j)
            for j in range(0, n_slots, 32):
                prefetch(slots, ahead, j)
            prefetch(row_keys, ahead, 0)
        r = rows[u]
        if r < 0:
            continue
        sum_gradient(grads, positions, bounds, u, g)
        widen_into(values, r, fmt, w)
        widen_into(slots, r, fmt, s[0])
        update_row(kind, hyper, w, g, s, 0)
        i = u - lo
        for j in range(dim):
            xbits[i, j] = float32_bits(np.float32(w[j]))
        for j in range(n_slots):
            xbits[i, dim + j] = float32_bits(s[0, j])
        if stochastic:
            bases[i] = row_base(salt, row_keys[r, 0])
    narrow_chunk(xbits, bases, hi - lo, stochastic, fmt, hs, rows, lo, values, slots)


@lazy_njit(types.void(*_ARGS_HALF_SLOTS))
def _segment_sum_apply_lowp_slots_serial(  # type: ignore[no-untyped-def]
    grads, positions, bounds, rows, row_keys, kind, hyper, seed, step, stochastic, fmt,
    values, slots,
):  # fmt: skip
    for c in range((rows.shape[0] + ROW_CHUNK - 1) // ROW_CHUNK):
        _apply_lowp_slots_chunk(
            c, grads, positions, bounds, rows, row_keys, kind, hyper, seed, step, stochastic, fmt,
            values, slots,
        )  # fmt: skip


@lazy_njit(types.void(*_ARGS_HALF_SLOTS), parallel=True)
def _segment_sum_apply_lowp_slots_parallel(  # type: ignore[no-untyped-def]
    grads, positions, bounds, rows, row_keys, kind, hyper, seed, step, stochastic, fmt,
    values, slots,
):  # fmt: skip
    for c in prange((rows.shape[0] + ROW_CHUNK - 1) // ROW_CHUNK):
        _apply_lowp_slots_chunk(
            c, grads, positions, bounds, rows, row_keys, kind, hyper, seed, step, stochastic, fmt,
            values, slots,
        )  # fmt: skip


@lazy_njit(types.void(*_ARGS))
def _segment_sum_apply_lowp_serial(  # type: ignore[no-untyped-def]
    grads, positions, bounds, rows, row_keys, kind, hyper, seed, step, stochastic, fmt,
    values, slots,
):  # fmt: skip
    for c in range((rows.shape[0] + ROW_CHUNK - 1) // ROW_CHUNK):
        _apply_lowp_chunk(
            c, grads, positions, bounds, rows, row_keys, kind, hyper, seed, step, stochastic, fmt,
            values, slots,
        )  # fmt: skip


@lazy_njit(types.void(*_ARGS), parallel=True)
def _segment_sum_apply_lowp_parallel(  # type: ignore[no-untyped-def]
    grads, positions, bounds, rows, row_keys, kind, hyper, seed, step, stochastic, fmt,
    values, slots,
):  # fmt: skip
    for c in prange((rows.shape[0] + ROW_CHUNK - 1) // ROW_CHUNK):
        _apply_lowp_chunk(
            c, grads, positions, bounds, rows, row_keys, kind, hyper, seed, step, stochastic, fmt,
            values, slots,
        )  # fmt: skip


def segment_sum_apply_lowp(  # type: ignore[no-untyped-def]
    grads, positions, bounds, rows, row_keys, kind, hyper, seed, step, stochastic, values, slots
) -> None:
    """Fused segment-sum + update of half-precision rows (see reference.lowp_optim); slots
    float32 or in the values' format."""
    fmt = 0 if half_format("values", values) == "bfloat16" else 1
    kind = check_lowp_kind(kind)
    check_row_keys(row_keys, values)
    big = positions.shape[0] >= PARALLEL_MIN_KEYS
    if has_half_slots(values, slots):
        kernel = (
            _segment_sum_apply_lowp_slots_parallel if big else _segment_sum_apply_lowp_slots_serial
        )
        slots = slots.view(np.uint16)
    else:
        kernel = _segment_sum_apply_lowp_parallel if big else _segment_sum_apply_lowp_serial
    seed = np.uint64(int(seed) & (2**64 - 1))
    kernel(
        grads, positions, bounds, rows, row_keys.reshape(-1, 1), kind, hyper, seed, step,
        bool(stochastic), fmt, values.view(np.uint16), slots,
    )  # fmt: skip
