"""Numba lookups over low-precision rows (see ``reference.lowp``): the fused probe + gather
and probe + gather + combine of ``cpu.index`` / ``cpu.bags``, reading half-precision rows
(``*_widened``) or quantised rows (``*_dequantized``) and converting each as it is read, so no
float32 copy of the table and no (n, dim) matrix exists; and a pull's pass over its rows
(``stamp_widen_pulled``: ``cpu.stamp``'s stamps with each row widened as it is copied).

One compiled driver serves every format: ``fmt`` 0 bfloat16, 1 float16 (rows from ``half``,
uint16 bits), 8 int8, 4 int4 (rows from ``q``, uint8); the array not used is an empty dummy.
"""

from __future__ import annotations

import numpy as np
from numba import prange, types

from evdb.kernels.cpu._common import (
    B1,
    F4,
    F4_2D,
    I8,
    I8_2D,
    PARALLEL_MIN_KEYS,
    U4,
    U8,
    f8,
    i8,
    lazy_njit,
    prefetch,
    u8,
)
from evdb.kernels.cpu.bags import _clip_scale, _divisor
from evdb.kernels.cpu.index import probe_range
from evdb.kernels.cpu.init import default_row
from evdb.kernels.cpu.lowp import U1_2D, U2_2D, U4_2D, widen_row
from evdb.kernels.cpu.quantize import dequantize_row
from evdb.kernels.cpu.stamp import prefetch_stamp, stamp_pulled_row
from evdb.kernels.reference.lowp import check_bits, half_format

__all__ = [
    "probe_gather_combine_dequantized",
    "probe_gather_combine_widened",
    "probe_gather_dequantized",
    "probe_gather_widened",
    "stamp_widen_pulled",
]

BAG_CHUNK = 32  # bags per task, as cpu.bags
GATHER_CHUNK = 32  # keys probed together, as cpu.index
_NO_Q = np.zeros((0, 0), np.uint8)
_NO_HALF = np.zeros((0, 0), np.uint16)


@lazy_njit(types.void(U1_2D, U2_2D, i8, i8, F4_2D, U4_2D, i8), inline="always")
def load_row(q, half, fmt, r, out, out_bits, i):  # type: ignore[no-untyped-def]
    """out[i] = row r as float32 (out_bits: the same memory as uint32)."""
    if fmt >= 4:
        dequantize_row(q, r, fmt, out, i)
    else:
        widen_row(half, r, fmt, out_bits, i)


_PG_ARGS = (I8_2D, U1_2D, U2_2D, i8, I8, I8, i8, F4_2D, U4_2D, I8)


@lazy_njit(i8(i8, *_PG_ARGS), inline="always")
def _pg_chunk(c, slots, q, half, fmt, last_step, keys, min_live_step, out, out_bits, out_rows):  # type: ignore[no-untyped-def]
    lo = c * GATHER_CHUNK
    hi = min(lo + GATHER_CHUNK, keys.shape[0])
    # A loop over the rows for each kind: with both conversions in one loop (load_row) a
    # bfloat16 lookup took 54 ns a key against 21 this way and float32's 18 (256 keys of
    # 200k rows, dim 64, one thread): LLVM no longer vectorised the widening.
    if fmt >= 4:  # the rows' array only says which lines to prefetch
        probe_range(slots, q, last_step, keys, lo, hi, min_live_step, out_rows[lo:hi])
        for i in range(lo, hi):
            if out_rows[i] >= 0:
                dequantize_row(q, out_rows[i], fmt, out, i)
    else:
        probe_range(slots, half, last_step, keys, lo, hi, min_live_step, out_rows[lo:hi])
        for i in range(lo, hi):
            if out_rows[i] >= 0:
                widen_row(half, out_rows[i], fmt, out_bits, i)
    missing = 0
    for i in range(lo, hi):
        missing += out_rows[i] < 0
    return missing


@lazy_njit(i8(*_PG_ARGS))
def _probe_gather_lowp_serial(
    slots, q, half, fmt, last_step, keys, min_live_step, out, out_bits, out_rows
):  # type: ignore[no-untyped-def]
    missing = 0
    for c in range((keys.shape[0] + GATHER_CHUNK - 1) // GATHER_CHUNK):
        missing += _pg_chunk(
            c, slots, q, half, fmt, last_step, keys, min_live_step, out, out_bits, out_rows
        )
    return missing


@lazy_njit(i8(*_PG_ARGS), parallel=True)
def _probe_gather_lowp_parallel(
    slots, q, half, fmt, last_step, keys, min_live_step, out, out_bits, out_rows
):  # type: ignore[no-untyped-def]
    missing = 0
    for c in prange((keys.shape[0] + GATHER_CHUNK - 1) // GATHER_CHUNK):
        missing += _pg_chunk(
            c, slots, q, half, fmt, last_step, keys, min_live_step, out, out_bits, out_rows
        )
    return missing


def _probe_gather(slots, q, half, fmt, last_step, keys, min_live_step, out, out_rows) -> int:  # type: ignore[no-untyped-def]
    big = keys.shape[0] >= PARALLEL_MIN_KEYS
    kernel = _probe_gather_lowp_parallel if big else _probe_gather_lowp_serial
    args = (last_step, keys, min_live_step, out, out.view(np.uint32), out_rows)
    return int(kernel(slots, q, half, fmt, *args))


def probe_gather_dequantized(slots, q, bits, last_step, keys, min_live_step, out, out_rows) -> int:  # type: ignore[no-untyped-def]
    """probe_gather over quantised rows (see reference.lowp.probe_gather_dequantized)."""
    check_bits(bits)
    return _probe_gather(slots, q, _NO_HALF, bits, last_step, keys, min_live_step, out, out_rows)


def probe_gather_widened(slots, values, last_step, keys, min_live_step, out, out_rows) -> int:  # type: ignore[no-untyped-def]
    """probe_gather over half-precision rows (see reference.lowp.probe_gather_widened)."""
    fmt = 0 if half_format("values", values) == "bfloat16" else 1
    half = values.view(np.uint16)
    return _probe_gather(slots, _NO_Q, half, fmt, last_step, keys, min_live_step, out, out_rows)


_PGC_ARGS = (I8_2D, U1_2D, U2_2D, i8, I8, I8, I8, F4, i8, i8, f8, i8, u8, f8, f8, F4_2D)


@lazy_njit(i8(i8, *_PGC_ARGS), inline="always")
def _pgc_chunk(  # type: ignore[no-untyped-def]
    c, slots, q, half, fmt, last_step, keys, bounds, weights, min_live_step, combiner,
    max_norm, init_kind, init_seed, init_a, init_b, out,
):  # fmt: skip
    # cpu.bags._pgc_chunk with each row converted into a one-row scratch as it is read
    n_bags = bounds.shape[0] - 1
    dim = out.shape[1]
    b0 = c * BAG_CHUNK
    b_end = min(b0 + BAG_CHUNK, n_bags)
    lo, hi = bounds[b0], bounds[b_end]
    rows = np.empty(hi - lo, np.int64)
    if fmt >= 4:
        probe_range(slots, q, last_step, keys, lo, hi, min_live_step, rows)
    else:
        probe_range(slots, half, last_step, keys, lo, hi, min_live_step, rows)
    scratch_bits = np.empty((1, dim), np.uint32)
    scratch = scratch_bits.view(np.float32)
    missing = 0
    for b in range(b0, b_end):
        for j in range(dim):
            out[b, j] = 0.0
        div = _divisor(weights, bounds, b, combiner)
        for p in range(bounds[b], bounds[b + 1]):
            r = rows[p - lo]
            if r < 0:
                missing += 1
            if div == 0.0:
                continue
            if r < 0:
                default_row(init_kind, init_seed, init_a, init_b, np.uint64(keys[p]), scratch, 0)
            else:
                load_row(q, half, fmt, r, scratch, scratch_bits, 0)
            scale = np.float32(_clip_scale(scratch, 0, max_norm) * weights[p] / div)
            for j in range(dim):
                out[b, j] += scale * scratch[0, j]
    return missing


@lazy_njit(i8(*_PGC_ARGS))
def _probe_gather_combine_lowp_serial(  # type: ignore[no-untyped-def]
    slots, q, half, fmt, last_step, keys, bounds, weights, min_live_step, combiner, max_norm,
    init_kind, init_seed, init_a, init_b, out,
):  # fmt: skip
    missing = 0
    for c in range((bounds.shape[0] - 1 + BAG_CHUNK - 1) // BAG_CHUNK):
        missing += _pgc_chunk(
            c, slots, q, half, fmt, last_step, keys, bounds, weights, min_live_step, combiner,
            max_norm, init_kind, init_seed, init_a, init_b, out,
        )  # fmt: skip
    return missing


@lazy_njit(i8(*_PGC_ARGS), parallel=True)
def _probe_gather_combine_lowp_parallel(  # type: ignore[no-untyped-def]
    slots, q, half, fmt, last_step, keys, bounds, weights, min_live_step, combiner, max_norm,
    init_kind, init_seed, init_a, init_b, out,
):  # fmt: skip
    missing = 0
    for c in prange((bounds.shape[0] - 1 + BAG_CHUNK - 1) // BAG_CHUNK):
        missing += _pgc_chunk(
            c, slots, q, half, fmt, last_step, keys, bounds, weights, min_live_step, combiner,
            max_norm, init_kind, init_seed, init_a, init_b, out,
        )  # fmt: skip
    return missing


def _probe_gather_combine(q, half, fmt, slots, last_step, keys, bounds, rest) -> int:  # type: ignore[no-untyped-def]
    big = keys.shape[0] >= PARALLEL_MIN_KEYS
    kernel = _probe_gather_combine_lowp_parallel if big else _probe_gather_combine_lowp_serial
    weights, min_live_step, combiner, max_norm, init_kind, init_seed, init_a, init_b, out = rest
    seed = np.uint64(int(init_seed) & (2**64 - 1))
    return int(
        kernel(
            slots,
            q,
            half,
            fmt,
            last_step,
            keys,
            bounds,
            weights,
            min_live_step,
            combiner,
            max_norm,
            init_kind,
            seed,
            init_a,
            init_b,
            out,
        )
    )


def probe_gather_combine_dequantized(slots, q, bits, last_step, keys, bounds, *rest) -> int:  # type: ignore[no-untyped-def]
    """Fused probe + dequantise + combine (see reference.lowp.probe_gather_combine_dequantized);
    ``rest`` is probe_gather_combine's from ``weights`` on."""
    check_bits(bits)
    return _probe_gather_combine(q, _NO_HALF, bits, slots, last_step, keys, bounds, rest)


def probe_gather_combine_widened(slots, values, last_step, keys, bounds, *rest) -> int:  # type: ignore[no-untyped-def]
    """Fused probe + widen + combine (see reference.lowp.probe_gather_combine_widened);
    ``rest`` is probe_gather_combine's from ``weights`` on."""
    fmt = 0 if half_format("values", values) == "bfloat16" else 1
    half = values.view(np.uint16)
    return _probe_gather_combine(_NO_Q, half, fmt, slots, last_step, keys, bounds, rest)


# -- a pull's stamps and rows --------------------------------------------------------------

PULL_CHUNK = 256  # rows a task stamps at a time, their lines prefetched first (as cpu.stamp)


@lazy_njit(i8(i8, I8, I8, i8, u8, i8, U4, I8, U8, B1, B1, U2_2D, i8, U4_2D), inline="always")
def _stamp_widen_chunk(  # type: ignore[no-untyped-def]
    c, rows, counts, step, ver, freq_max,
    freq, last_step, versions, is_dirty, is_pinned, half, fmt, out,
):  # fmt: skip
    lo = c * PULL_CHUNK
    hi = min(lo + PULL_CHUNK, rows.shape[0])
    for i in range(lo, hi):  # every line the second loop touches, in flight first
        r = rows[i]
        if r >= 0:
            for col in range(0, half.shape[1], 32):
                prefetch(half, r, col)
            prefetch_stamp(freq, last_step, versions, r)
    n = 0
    for i in range(lo, hi):
        r = rows[i]
        if r < 0:
            continue
        stamp_pulled_row(
            r, counts[i], step, ver, freq_max, freq, last_step, versions, is_dirty, is_pinned
        )
        widen_row(half, r, fmt, out, i)
        n += 1
    return n


_SW_SIG = i8(I8, I8, i8, i8, i8, U4, I8, U8, B1, B1, U2_2D, i8, U4_2D)


@lazy_njit(_SW_SIG)
def _stamp_widen_pulled_serial(  # type: ignore[no-untyped-def]
    rows, counts, step, version, freq_max,
    freq, last_step, versions, is_dirty, is_pinned, half, fmt, out,
):  # fmt: skip
    ver = np.uint64(version)
    n = 0
    for c in range((rows.shape[0] + PULL_CHUNK - 1) // PULL_CHUNK):
        n += _stamp_widen_chunk(
            c, rows, counts, step, ver, freq_max,
            freq, last_step, versions, is_dirty, is_pinned, half, fmt, out,
        )  # fmt: skip
    return n


@lazy_njit(_SW_SIG, parallel=True)
def _stamp_widen_pulled_parallel(  # type: ignore[no-untyped-def]
    rows, counts, step, version, freq_max,
    freq, last_step, versions, is_dirty, is_pinned, half, fmt, out,
):  # fmt: skip
    ver = np.uint64(version)
    n = 0
    for c in prange((rows.shape[0] + PULL_CHUNK - 1) // PULL_CHUNK):
        n += _stamp_widen_chunk(
            c, rows, counts, step, ver, freq_max,
            freq, last_step, versions, is_dirty, is_pinned, half, fmt, out,
        )  # fmt: skip
    return n


def stamp_widen_pulled(  # type: ignore[no-untyped-def]
    rows, counts, step, version, freq_max,
    freq, last_step, versions, is_dirty, is_pinned, values, out,
) -> int:  # fmt: skip
    """A pull's pass over half-precision rows (see reference.lowp.stamp_widen_pulled): the
    stamps of cpu.stamp.stamp_gather_pulled and each row widened into out in the same pass,
    its lines prefetched with the metadata's (it was a stamping pass, then a widening one
    that missed on every row again)."""
    fmt = 0 if half_format("values", values) == "bfloat16" else 1
    big = rows.shape[0] >= PARALLEL_MIN_KEYS
    kernel = _stamp_widen_pulled_parallel if big else _stamp_widen_pulled_serial
    n = kernel(
        rows, counts, step, version, freq_max,
        freq, last_step, versions, is_dirty, is_pinned, values.view(np.uint16), fmt,
        out.view(np.uint32),
    )  # fmt: skip
    return int(n)
