"""Reference lookups in a frozen table: the layout of a quantised serving snapshot
(``evdb.tiers.frozen``), the specification the numba kernels in ``cpu.frozen`` are tested
against.

A frozen table never changes, so it needs no hash table with empty slots: its rows are
stored in the order of ``mix64(key)`` (as uint64), and a directory of ``B`` buckets (B a
power of two, >= 2) says where each bucket's rows start::

    keys       (n,) int64        ordered by mix64(key)
    directory  (B + 1,) int64    rows of bucket b: directory[b] .. directory[b + 1] - 1,
                                 b = mix64(key) >> (64 - log2 B) (the hash's top bits)
    q          (n, stride) uint8 quantised rows in the same order (``reference.lowp``)

    key 42 -> mix64 = 0xB7.. -> bucket 0b1011 (B = 16) -> directory[11] = 20, [12] = 23
           -> compare keys[20], keys[21], keys[22] with 42 -> row 21 -> dequantise q[21]

At 2 rows a bucket (B the power of two >= n / 2) the directory costs 4-8 bytes a row, and a
lookup reads the directory, one line of keys and the row: what a hash probe reads, without the
slots a hash table leaves empty (16-byte slots at load 0.7 cost 23 bytes a row). At 8 rows a
bucket (1 byte a row) the scan of a bucket's keys cost int8 lookups 10-15% (4,096 random keys
of 1M, dim 64, one thread: 0.86-0.92x float32 serving's keys/s, 1.04-1.06x at 2, 0.95-1.02x at
4). Readers take any B a snapshot's header names, so older snapshots open as they were.
"""

from __future__ import annotations

import numpy as np

from evdb.kernels.hashing import mix64_np
from evdb.kernels.reference.bags import default_rows, gather_combine
from evdb.kernels.reference.lowp import check_bits, dequantize_rows

__all__ = [
    "bucket_count",
    "frozen_order",
    "search_gather_combine_dequantized",
    "search_gather_dequantized",
    "search_rows",
]

ROWS_PER_BUCKET = 2


def bucket_count(n: int) -> int:
    """Buckets for n rows: the power of two >= n / ROWS_PER_BUCKET, at least 2."""
    return max(2, 1 << max(0, -(-n // ROWS_PER_BUCKET) - 1).bit_length())


def _buckets(keys: np.ndarray, n_buckets: int) -> np.ndarray:
    """(n,) int64 bucket of each key: the top log2(n_buckets) bits of mix64(key)."""
    shift = np.uint64(64 - (n_buckets.bit_length() - 1))
    h = mix64_np(np.ascontiguousarray(keys, np.int64).view(np.uint64))
    return (h >> shift).astype(np.int64)


def frozen_order(keys: np.ndarray, n_buckets: int) -> tuple[np.ndarray, np.ndarray]:
    """(order, directory) of distinct keys (n,) int64: ``keys[order]`` is the stored key
    order (by mix64, a bijection, so no ties), directory (n_buckets + 1,) int64."""
    h = mix64_np(np.ascontiguousarray(keys, np.int64).view(np.uint64))
    order = np.argsort(h, kind="stable")
    counts = np.bincount(_buckets(keys, n_buckets), minlength=n_buckets)
    directory = np.zeros(n_buckets + 1, np.int64)
    np.cumsum(counts, out=directory[1:])
    return order, directory


def search_rows(
    directory: np.ndarray, table_keys: np.ndarray, keys: np.ndarray, out_rows: np.ndarray
) -> int:
    """out_rows (n,) int64 gets each key's row in the frozen table, or -1; returns the
    number of keys without one."""
    n_buckets = directory.shape[0] - 1
    b = _buckets(keys, n_buckets)
    lo, hi = directory[b], directory[b + 1]
    out_rows[:] = -1
    # every key's bucket, scanned column by column: at most the fullest bucket's length
    width = int((hi - lo).max()) if keys.shape[0] else 0
    for j in range(width):
        at = lo + j
        open_ = (at < hi) & (out_rows < 0)
        hit = open_.copy()
        hit[open_] = table_keys[at[open_]] == keys[open_]
        out_rows[hit] = at[hit]
    return int(np.count_nonzero(out_rows < 0))


def search_gather_dequantized(
    directory: np.ndarray,
    table_keys: np.ndarray,
    q: np.ndarray,
    bits: int,
    keys: np.ndarray,
    out: np.ndarray,
    out_rows: np.ndarray,
) -> int:
    """Find each key (n,) int64 in the frozen table and dequantise its row: out (n, dim)
    float32 gets the row of each key found (untouched for the others), out_rows (n,) int64
    its row or -1; returns the number of keys not found."""
    check_bits(bits)
    missing = search_rows(directory, table_keys, keys, out_rows)
    dequantize_rows(q, bits, out_rows, out)
    return missing


def search_gather_combine_dequantized(
    directory: np.ndarray,
    table_keys: np.ndarray,
    q: np.ndarray,
    bits: int,
    keys: np.ndarray,
    bounds: np.ndarray,
    weights: np.ndarray,
    combiner: int,
    max_norm: float,
    init_kind: int,
    init_seed: int,
    init_a: float,
    init_b: float,
    out: np.ndarray,
) -> int:
    """Bags over a frozen table: out (B, dim) float32 gets each bag's combined vectors
    (``probe_gather_combine``'s bounds, weights, combiner, max_norm and default value of a
    key not found); returns the number of keys not found. (This reference builds the (n,
    dim) matrix; kernels must not.)"""
    n, dim = keys.shape[0], out.shape[1]
    x = np.empty((n, dim), np.float32)
    rows = np.empty(n, np.int64)
    missing = search_gather_dequantized(directory, table_keys, q, bits, keys, x, rows)
    absent = rows < 0
    x[absent] = default_rows(keys[absent], dim, init_kind, init_seed, init_a, init_b)
    gather_combine(x, np.arange(n, dtype=np.int64), bounds, weights, combiner, max_norm, out)
    return missing
