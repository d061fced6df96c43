"""Reference hash index kernels: find, insert, remove, fused probe + gather, dedup, sketch.

The index is open addressing over ``slots (cap, 2) int64`` with ``cap`` a power of two:
``slots[j, 0]`` is a key and ``slots[j, 1]`` its row (key and row share a cache line, so a
probe costs one miss). A slot is occupied iff its row is ``>= 0``; every int64 is a valid key,
occupancy never borrows a key value.
"""

from __future__ import annotations

import numpy as np

from evdb.kernels.hashing import mix64_np


def _occupied_map(slots: np.ndarray) -> dict[int, int]:
    used = slots[:, 1] >= 0
    return dict(zip(slots[used, 0].tolist(), slots[used, 1].tolist(), strict=True))


def hash_find(slots: np.ndarray, keys: np.ndarray, out: np.ndarray) -> None:
    """out[i] = the row stored for keys[i], or -1 when the index does not hold keys[i].

    keys (n,) int64, out (n,) int64.
    """
    table = _occupied_map(slots)
    out[:] = [table.get(k, -1) for k in keys.tolist()]


def hash_insert(slots: np.ndarray, keys: np.ndarray, rows: np.ndarray) -> None:
    """Insert or assign: afterwards ``hash_find(keys)`` returns ``rows`` (the last one wins
    for a key given twice). The caller guarantees room (load stays below 1).

    Linear probing from ``mix64(key) & (cap - 1)``; this layout is shared with ``cpu.py`` so that
    an index built by one backend can be read by the other.
    """
    mask = slots.shape[0] - 1
    for key, row in zip(keys.tolist(), rows.tolist(), strict=True):
        j = int(mix64_np(np.array([key], dtype=np.int64).view(np.uint64))[0]) & mask
        while slots[j, 1] >= 0 and slots[j, 0] != key:
            j = (j + 1) & mask
        slots[j] = key, row


def hash_remove(slots: np.ndarray, keys: np.ndarray, out: np.ndarray) -> None:
    """Remove keys; out[i] = the row keys[i] had, or -1 if it was absent (or removed earlier in
    this same call). Afterwards the remaining keys are still found (no tombstones are left:
    the index is rebuilt here; ``cpu.py`` shifts entries back instead)."""
    table = _occupied_map(slots)
    for i, key in enumerate(keys.tolist()):
        out[i] = table.pop(key, -1)
    slots[:, 1] = -1
    if table:
        hash_insert(
            slots,
            np.fromiter(table.keys(), dtype=np.int64, count=len(table)),
            np.fromiter(table.values(), dtype=np.int64, count=len(table)),
        )


def probe_gather(
    slots: np.ndarray,
    values: np.ndarray,
    last_step: np.ndarray,
    keys: np.ndarray,
    min_live_step: int,
    out: np.ndarray,
    out_rows: np.ndarray,
) -> int:
    """Fused hash probe + TTL check + gather.

    For each key: its row r if present and live (``last_step[r] >= min_live_step``), else -1,
    into out_rows (n,) int64; out[i] = values[r] for found keys, untouched for the others.
    Returns the number of keys not found. values (rows, dim) float32, out (n, dim) float32.
    """
    hash_find(slots, keys, out_rows)
    found = out_rows >= 0
    found[found] = last_step[out_rows[found]] >= min_live_step
    out_rows[~found] = -1
    out[found] = values[out_rows[found]]
    return int(np.count_nonzero(~found))


def unique_inverse(
    keys: np.ndarray,
    scratch: np.ndarray,
    out_unique: np.ndarray,
    out_inverse: np.ndarray,
    out_counts: np.ndarray,
) -> int:
    """Deduplicate keys in order of first occurrence.

    Returns u, the number of distinct keys; out_unique[:u] are the distinct keys in the order
    they first appear, out_inverse (n,) maps each position to its index in out_unique, and
    out_counts[:u] is how often each distinct key occurs. ``out_unique[out_inverse] == keys``.
    ``scratch (cap, 2) int64`` is the caller's empty index (every row -1 in column 1, cap a
    power of two >= 2 n) for backends that hash; it must be empty again on return.
    """
    uniq, first, inverse, counts = np.unique(
        keys, return_index=True, return_inverse=True, return_counts=True
    )
    order = np.argsort(first, kind="stable")  # sorted order -> first-occurrence order
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    u = uniq.size
    out_unique[:u] = uniq[order]
    out_counts[:u] = counts[order]
    out_inverse[:] = rank[inverse.reshape(-1)]
    return int(u)


def sketch_positions(keys: np.ndarray, n_hashes: int, seed: int, width: int) -> np.ndarray:
    """Counter positions (n, n_hashes) of each key in a counting Bloom filter of `width`
    counters: double hashing ``h1 + i * h2 (mod width)`` (Kirsch & Mitzenmacher 2006)."""
    h1 = mix64_np(keys.view(np.uint64) ^ np.uint64(seed))
    h2 = mix64_np(h1) | np.uint64(1)
    i = np.arange(n_hashes, dtype=np.uint64)
    return ((h1[:, None] + i[None, :] * h2[:, None]) % np.uint64(width)).astype(np.int64)


def sketch_add(
    counters: np.ndarray,
    keys: np.ndarray,
    counts: np.ndarray,
    n_hashes: int,
    seed: int,
    out: np.ndarray,
) -> None:
    """Counting Bloom filter update and query.

    Adds counts[i] to each of the n_hashes counters of keys[i] (uint8, saturating at 255), then
    out[i] = the minimum of keys[i]'s counters *after the whole batch*: never below the true
    total of keys[i] (until saturation), above it only where other keys share all its counters.
    counters (width,) uint8, keys (n,) int64, counts (n,) int64, out (n,) int64.
    """
    pos = sketch_positions(keys, n_hashes, seed, counters.shape[0])
    acc = counters.astype(np.int64)
    np.add.at(acc, pos.reshape(-1), np.repeat(counts, n_hashes))
    np.minimum(acc, 255, out=acc)
    counters[:] = acc
    out[:] = acc[pos].min(axis=1) if n_hashes else 0


def bloom_add(bits: np.ndarray, keys: np.ndarray, n_hashes: int, seed: int) -> None:
    """Set the n_hashes bits of each key in a Bloom filter of ``bits (words,) uint64``
    (bit p is bit p % 64 of word p // 64; positions as ``sketch_positions`` over 64 * words)."""
    pos = sketch_positions(keys, n_hashes, seed, 64 * bits.shape[0]).reshape(-1)
    np.bitwise_or.at(bits, pos >> 6, np.uint64(1) << (pos & 63).astype(np.uint64))


def bloom_query(
    bits: np.ndarray, keys: np.ndarray, n_hashes: int, seed: int, out: np.ndarray
) -> None:
    """out[i] = whether every bit of keys[i] is set: False means never added."""
    pos = sketch_positions(keys, n_hashes, seed, 64 * bits.shape[0])
    word = bits[pos >> 6] >> (pos & 63).astype(np.uint64)
    out[:] = (word & np.uint64(1)).astype(bool).all(axis=1)


def unique_rows(
    keys: np.ndarray,
    rows: np.ndarray,
    mark: np.ndarray,
    scratch: np.ndarray,
    out_unique: np.ndarray,
    out_inverse: np.ndarray,
    out_counts: np.ndarray,
    out_rows: np.ndarray,
) -> int:
    """unique_inverse for keys whose rows (n,) the index already gave (-1 = no row), which
    also returns out_rows[:u], the row of each distinct key. Backends may deduplicate keys that
    have a row through ``mark`` (one int32 per slab row, all -1 on entry and on return) and
    the others through ``scratch`` (as in unique_inverse); the result is the same."""
    u = unique_inverse(keys, scratch, out_unique, out_inverse, out_counts)
    first = np.full(u, -1, dtype=np.int64)
    first[out_inverse[::-1]] = np.arange(keys.shape[0])[::-1]  # first position of each key
    out_rows[:u] = rows[first]
    return u
