"""Numba versions of the kernels in ``reference.py``: same names, same argument order.

Every kernel is compiled eagerly from an explicit signature with ``nogil=True, cache=True``, so
the first import pays compilation once per machine and later imports load from the cache.
Parallel kernels (``prange``) use numba's thread pool; NUMBA_NUM_THREADS caps it.

Index layout (shared with the reference and the CUDA sources): open addressing with linear
probing over power-of-two ``slot_keys``/``slot_rows``; a slot is occupied iff its row is >= 0;
the home slot of a key is ``mix64(key) & (cap - 1)``. Deletion shifts later entries of the
probe run back into the hole (no tombstones), so lookups never slow down with churn.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange, types

i8, u8, f4 = types.int64, types.uint64, types.float32
I8 = types.Array(types.int64, 1, "C")
U1 = types.Array(types.uint8, 1, "C")
F4_2D = types.Array(types.float32, 2, "C")

_OPTS = {"nogil": True, "cache": True}

# Below this many keys the serial variant wins: waking numba's thread pool costs about 1.5 ms
# per call here (measured on 10-key batches), more than probing thousands of keys.
PARALLEL_MIN_KEYS = 16384

__all__ = [
    "hash_find",
    "hash_insert",
    "hash_remove",
    "probe_gather",
    "sketch_add",
    "unique_inverse",
]


@njit(u8(u8), inline="always", **_OPTS)
def _mix64(x):  # type: ignore[no-untyped-def]
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


@njit(i8(i8, i8), inline="always", **_OPTS)
def _home(key, mask):  # type: ignore[no-untyped-def]
    return np.int64(_mix64(np.uint64(key)) & np.uint64(mask))


@njit(i8(I8, I8, i8, i8), inline="always", **_OPTS)
def _probe(slot_keys, slot_rows, mask, key):  # type: ignore[no-untyped-def]
    j = _home(key, mask)
    while True:
        r = slot_rows[j]
        if r < 0:
            return np.int64(-1)
        if slot_keys[j] == key:
            return r
        j = (j + 1) & mask


def _hash_find(slot_keys, slot_rows, keys, out):  # type: ignore[no-untyped-def]
    mask = slot_keys.shape[0] - 1
    for i in prange(keys.shape[0]):
        out[i] = _probe(slot_keys, slot_rows, mask, keys[i])


_hash_find_serial = njit(types.void(I8, I8, I8, I8), **_OPTS)(_hash_find)
_hash_find_parallel = njit(types.void(I8, I8, I8, I8), parallel=True, **_OPTS)(_hash_find)


def hash_find(
    slot_keys: np.ndarray, slot_rows: np.ndarray, keys: np.ndarray, out: np.ndarray
) -> None:
    """out[i] = row of keys[i] or -1 (see reference.hash_find)."""
    kernel = _hash_find_parallel if keys.shape[0] >= PARALLEL_MIN_KEYS else _hash_find_serial
    kernel(slot_keys, slot_rows, keys, out)


@njit(types.void(I8, I8, I8, I8), **_OPTS)
def hash_insert(slot_keys, slot_rows, keys, rows):  # type: ignore[no-untyped-def]
    mask = slot_keys.shape[0] - 1
    for i in range(keys.shape[0]):
        key = keys[i]
        j = _home(key, mask)
        while slot_rows[j] >= 0 and slot_keys[j] != key:
            j = (j + 1) & mask
        slot_keys[j] = key
        slot_rows[j] = rows[i]


@njit(types.void(I8, I8, I8, I8), **_OPTS)
def hash_remove(slot_keys, slot_rows, keys, out):  # type: ignore[no-untyped-def]
    mask = slot_keys.shape[0] - 1
    for i in range(keys.shape[0]):
        key = keys[i]
        j = _home(key, mask)
        out[i] = -1
        while slot_rows[j] >= 0:
            if slot_keys[j] == key:
                out[i] = slot_rows[j]
                # Backward-shift deletion: pull later members of the run into the hole when
                # the hole lies on their probe path (distance home->j >= distance hole->j).
                hole = j
                k = j
                while True:
                    k = (k + 1) & mask
                    if slot_rows[k] < 0:
                        break
                    home = _home(slot_keys[k], mask)
                    if ((k - home) & mask) >= ((k - hole) & mask):
                        slot_keys[hole] = slot_keys[k]
                        slot_rows[hole] = slot_rows[k]
                        hole = k
                slot_rows[hole] = -1
                break
            j = (j + 1) & mask


def _probe_gather(  # type: ignore[no-untyped-def]
    slot_keys, slot_rows, values, last_step, keys, min_live_step, out, out_rows
):
    mask = slot_keys.shape[0] - 1
    dim = values.shape[1]
    missing = 0
    for i in prange(keys.shape[0]):
        r = _probe(slot_keys, slot_rows, mask, keys[i])
        if r >= 0 and last_step[r] < min_live_step:
            r = -1
        out_rows[i] = r
        if r >= 0:
            for c in range(dim):
                out[i, c] = values[r, c]
        else:
            missing += 1
    return missing


_PG_SIG = i8(I8, I8, F4_2D, I8, I8, i8, F4_2D, I8)
_probe_gather_serial = njit(_PG_SIG, **_OPTS)(_probe_gather)
_probe_gather_parallel = njit(_PG_SIG, parallel=True, **_OPTS)(_probe_gather)


def probe_gather(
    slot_keys: np.ndarray,
    slot_rows: np.ndarray,
    values: np.ndarray,
    last_step: np.ndarray,
    keys: np.ndarray,
    min_live_step: int,
    out: np.ndarray,
    out_rows: np.ndarray,
) -> int:
    """Fused probe + TTL check + gather (see reference.probe_gather); returns keys missing."""
    parallel = keys.shape[0] >= PARALLEL_MIN_KEYS
    kernel = _probe_gather_parallel if parallel else _probe_gather_serial
    return int(kernel(slot_keys, slot_rows, values, last_step, keys, min_live_step, out, out_rows))


@njit(i8(I8, I8, I8, I8), **_OPTS)
def unique_inverse(keys, out_unique, out_inverse, out_counts):  # type: ignore[no-untyped-def]
    n = keys.shape[0]
    cap = 16
    while cap < 2 * n:
        cap *= 2
    mask = cap - 1
    # A private scratch index: slot -> position in out_unique (-1 empty).
    tkeys = np.empty(cap, np.int64)
    trows = np.full(cap, -1, np.int64)
    u = 0
    for i in range(n):
        key = keys[i]
        j = _home(key, mask)
        while True:
            r = trows[j]
            if r < 0:
                tkeys[j] = key
                trows[j] = u
                out_unique[u] = key
                out_counts[u] = 1
                out_inverse[i] = u
                u += 1
                break
            if tkeys[j] == key:
                out_inverse[i] = r
                out_counts[r] += 1
                break
            j = (j + 1) & mask
    return u


@njit(types.void(U1, I8, I8, i8, u8, I8), **_OPTS)
def sketch_add(counters, keys, counts, n_hashes, seed, out):  # type: ignore[no-untyped-def]
    width = np.uint64(counters.shape[0])
    n = keys.shape[0]
    for i in range(n):
        h1 = _mix64(np.uint64(keys[i]) ^ seed)
        h2 = _mix64(h1) | np.uint64(1)
        for h in range(n_hashes):
            p = np.int64((h1 + np.uint64(h) * h2) % width)
            c = np.int64(counters[p]) + counts[i]
            counters[p] = np.uint8(c if c < 255 else 255)
    # Query after the whole batch, as the reference does.
    for i in range(n):
        h1 = _mix64(np.uint64(keys[i]) ^ seed)
        h2 = _mix64(h1) | np.uint64(1)
        best = np.int64(255)
        for h in range(n_hashes):
            p = np.int64((h1 + np.uint64(h) * h2) % width)
            best = min(best, np.int64(counters[p]))
        out[i] = best if n_hashes > 0 else 0
