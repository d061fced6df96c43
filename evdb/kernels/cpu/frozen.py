"""Numba lookups in a frozen table (the layout is ``reference.frozen``'s): find each key
through the bucket directory and dequantise its row into the caller's float32 ``out`` as
it is read, alone or combined into bags, so no float32 copy of the table and no (n, dim)
matrix exists.

Keys are searched GATHER_CHUNK at a time in three passes, so the cache misses of a chunk
overlap instead of following one another: hash every key and prefetch its directory entry;
read the entries and prefetch each bucket's first keys; scan the buckets and prefetch each
row found. The directory and keys arrive as (m, 1) views for the prefetch intrinsic.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange, types

from evdb.kernels.cpu._common import (
    F4,
    F4_2D,
    I8,
    I8_2D,
    PARALLEL_MIN_KEYS,
    f4,
    f8,
    i8,
    lazy_njit,
    mix64,
    prefetch,
    u8,
)
from evdb.kernels.cpu.bags import _clip_scale, _divisor
from evdb.kernels.cpu.init import default_row
from evdb.kernels.cpu.lowp import U1_2D
from evdb.kernels.cpu.quantize import dequantize_row, half_at
from evdb.kernels.reference.lowp import check_bits

__all__ = ["search_gather_combine_dequantized", "search_gather_dequantized"]

GATHER_CHUNK = 32  # keys searched together, as cpu.index
# Bags per task, whose keys are searched together: fewer than cpu.bags' 32, since a frozen
# search has one dependent miss more (directory, then keys, then row) and 640 keys' worth of
# prefetched lines did not stay in L1 (bags of 20, 4,096 keys, 1M rows, dim 64, int8 / int4
# keys/s over float32 serving's, one thread: 32 bags 0.87-0.91 / 0.83x, 16: 0.92-1.06 /
# 0.85-0.91x, 8: 0.99-1.02 / 0.81-0.96x; two threads at 8: 1.12 / 1.08x).
BAG_CHUNK = 8


@lazy_njit(types.void(I8_2D, I8_2D, U1_2D, I8, i8, i8, I8), inline="always")
def search_range(directory, table_keys, q, keys, lo, hi, out):  # type: ignore[no-untyped-def]
    """out[p - lo] = the row of keys[p] or -1, for p in [lo, hi)."""
    n_buckets = directory.shape[0] - 1
    log2 = 0
    while (1 << log2) < n_buckets:
        log2 += 1
    shift = np.uint64(64 - log2)
    for p in range(lo, hi):
        b = np.int64(mix64(np.uint64(keys[p])) >> shift)
        out[p - lo] = b
        prefetch(directory, b, 0)
    for p in range(lo, hi):
        b = out[p - lo]
        first, end = directory[b, 0], directory[b + 1, 0]
        if first < end:  # a bucket's keys may span two lines: fetch both
            prefetch(table_keys, first, 0)
            prefetch(table_keys, end - 1, 0)
    for p in range(lo, hi):
        b = out[p - lo]
        r = -1
        for at in range(directory[b, 0], directory[b + 1, 0]):
            if table_keys[at, 0] == keys[p]:
                r = at
                break
        if r >= 0:  # every line the row touches: rows are not line-aligned (int4 at dim 64:
            for col in range(0, q.shape[1], 64):  # 36 bytes, on two lines more often than not)
                prefetch(q, r, col)
            prefetch(q, r, q.shape[1] - 1)
        out[p - lo] = r


_SG_ARGS = (I8_2D, I8_2D, U1_2D, i8, I8, F4_2D, I8)


@lazy_njit(i8(i8, *_SG_ARGS), inline="always")
def _sg_chunk(c, directory, table_keys, q, bits, keys, out, out_rows):  # type: ignore[no-untyped-def]
    lo = c * GATHER_CHUNK
    hi = min(lo + GATHER_CHUNK, keys.shape[0])
    search_range(directory, table_keys, q, keys, lo, hi, out_rows[lo:hi])
    missing = 0
    for i in range(lo, hi):
        if out_rows[i] >= 0:
            dequantize_row(q, out_rows[i], bits, out, i)
        else:
            missing += 1
    return missing


@lazy_njit(i8(*_SG_ARGS))
def _search_gather_serial(directory, table_keys, q, bits, keys, out, out_rows):  # type: ignore[no-untyped-def]
    missing = 0
    for c in range((keys.shape[0] + GATHER_CHUNK - 1) // GATHER_CHUNK):
        missing += _sg_chunk(c, directory, table_keys, q, bits, keys, out, out_rows)
    return missing


@lazy_njit(i8(*_SG_ARGS), parallel=True)
def _search_gather_parallel(directory, table_keys, q, bits, keys, out, out_rows):  # type: ignore[no-untyped-def]
    missing = 0
    for c in prange((keys.shape[0] + GATHER_CHUNK - 1) // GATHER_CHUNK):
        missing += _sg_chunk(c, directory, table_keys, q, bits, keys, out, out_rows)
    return missing


def _parallel(n_keys: int) -> bool:
    """Whether n keys go to the prange kernel: enough of them, and more than one numba thread
    (with one, the parallel launch alone cost ~10-15 us a call: 4,096-key lookups, 1M rows,
    int8 / int4, 229-252 us parallel, 217-236 serial)."""
    return n_keys >= PARALLEL_MIN_KEYS and numba.get_num_threads() > 1


def search_gather_dequantized(directory, table_keys, q, bits, keys, out, out_rows) -> int:  # type: ignore[no-untyped-def]
    """Find and dequantise (see reference.frozen.search_gather_dequantized)."""
    check_bits(bits)
    kernel = _search_gather_parallel if _parallel(keys.shape[0]) else _search_gather_serial
    d, tk = directory.reshape(-1, 1), table_keys.reshape(-1, 1)
    return int(kernel(d, tk, q, bits, keys, out, out_rows))


_SGC_ARGS = (I8_2D, I8_2D, U1_2D, i8, I8, I8, F4, i8, f8, i8, u8, f8, f8, F4_2D)


@lazy_njit(types.void(U1_2D, i8, f4, F4_2D, i8), inline="always")
def add_dequantized_int8(q, r, w, out, b):  # type: ignore[no-untyped-def]
    """out[b] += w * (int8 row r of q dequantised), in one pass over the codes: (w * scale) *
    code + w * bias, so no dequantised row is written and read back."""
    a = w * half_at(q, r, 0)
    c = w * half_at(q, r, 2)
    for j in range(out.shape[1]):
        out[b, j] += np.float32(q[r, 4 + j]) * a + c


@lazy_njit(i8(i8, *_SGC_ARGS), inline="always")
def _sgc_chunk(  # type: ignore[no-untyped-def]
    c, directory, table_keys, q, bits, keys, bounds, weights, combiner, max_norm,
    init_kind, init_seed, init_a, init_b, out,
):  # fmt: skip
    # cpu.lowp_gather._pgc_chunk over a frozen table. Without max_norm, each row is
    # dequantised straight into its bag's sum (add_dequantized_int8, or the int4 loop here);
    # with it, into a one-row scratch first, whose norm says the row's scale. int4 codes are
    # unpacked into ``codes`` before the sum (adding two strided halves cost int4 bags 25-35%
    # over int8's: 4,096 keys, 1M rows, one thread), in this body: an inline callee writing
    # ``codes`` cost every bag ~25 ns a key, int8 ones too (256 keys: 21 -> 28 us).
    n_bags = bounds.shape[0] - 1
    dim = out.shape[1]
    b0 = c * BAG_CHUNK
    b_end = min(b0 + BAG_CHUNK, n_bags)
    lo, hi = bounds[b0], bounds[b_end]
    rows = np.empty(hi - lo, np.int64)
    search_range(directory, table_keys, q, keys, lo, hi, rows)
    scratch = np.empty((1, dim), np.float32)
    codes = np.empty(dim + 1, np.uint8)
    clip = max_norm != np.inf
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
            if r >= 0 and not clip and bits == 8:
                add_dequantized_int8(q, r, np.float32(weights[p] / div), out, b)
                continue
            if r >= 0 and not clip:  # int4: as add_dequantized_int8, its codes unpacked first
                w = np.float32(weights[p] / div)
                a = w * half_at(q, r, 0)
                cw = w * half_at(q, r, 2)
                for k in range((dim + 1) // 2):
                    byte = q[r, 4 + k]
                    codes[2 * k] = byte & np.uint8(0x0F)
                    codes[2 * k + 1] = byte >> np.uint8(4)
                for j in range(dim):
                    out[b, j] += np.float32(codes[j]) * a + cw
                continue
            if r < 0:
                default_row(init_kind, init_seed, init_a, init_b, np.uint64(keys[p]), scratch, 0)
            else:
                dequantize_row(q, r, bits, scratch, 0)
            scale = np.float32(_clip_scale(scratch, 0, max_norm) * weights[p] / div)
            for j in range(dim):
                out[b, j] += scale * scratch[0, j]
    return missing


@lazy_njit(i8(*_SGC_ARGS))
def _search_gather_combine_serial(  # type: ignore[no-untyped-def]
    directory, table_keys, q, bits, keys, bounds, weights, combiner, max_norm,
    init_kind, init_seed, init_a, init_b, out,
):  # fmt: skip
    missing = 0
    for c in range((bounds.shape[0] - 1 + BAG_CHUNK - 1) // BAG_CHUNK):
        missing += _sgc_chunk(
            c,
            directory,
            table_keys,
            q,
            bits,
            keys,
            bounds,
            weights,
            combiner,
            max_norm,
            init_kind,
            init_seed,
            init_a,
            init_b,
            out,
        )
    return missing


@lazy_njit(i8(*_SGC_ARGS), parallel=True)
def _search_gather_combine_parallel(  # type: ignore[no-untyped-def]
    directory, table_keys, q, bits, keys, bounds, weights, combiner, max_norm,
    init_kind, init_seed, init_a, init_b, out,
):  # fmt: skip
    missing = 0
    for c in prange((bounds.shape[0] - 1 + BAG_CHUNK - 1) // BAG_CHUNK):
        missing += _sgc_chunk(
            c,
            directory,
            table_keys,
            q,
            bits,
            keys,
            bounds,
            weights,
            combiner,
            max_norm,
            init_kind,
            init_seed,
            init_a,
            init_b,
            out,
        )
    return missing


def search_gather_combine_dequantized(  # type: ignore[no-untyped-def]
    directory, table_keys, q, bits, keys, bounds, weights, combiner, max_norm,
    init_kind, init_seed, init_a, init_b, out,
) -> int:  # fmt: skip
    """Find, dequantise and combine bags (see
    reference.frozen.search_gather_combine_dequantized)."""
    check_bits(bits)
    parallel = _parallel(keys.shape[0])
    kernel = _search_gather_combine_parallel if parallel else _search_gather_combine_serial
    seed = np.uint64(int(init_seed) & (2**64 - 1))
    d, tk = directory.reshape(-1, 1), table_keys.reshape(-1, 1)
    return int(
        kernel(
            d,
            tk,
            q,
            bits,
            keys,
            bounds,
            weights,
            combiner,
            float(max_norm),
            int(init_kind),
            seed,
            float(init_a),
            float(init_b),
            out,
        )
    )
