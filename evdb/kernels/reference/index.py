"""Reference hash index kernels: find, insert, remove, fused probe + gather, dedup, sketch.

The index is open addressing with linear probing over ``cap`` slots, in one of two layouts
(``cpu/index.py`` describes them; the shape tells which):

* wide, ``slots (cap, 2) int64``: ``slots[j, 0]`` a key and ``slots[j, 1]`` its row, -1 empty;
* pairs, ``slots (cap / 2, 3) int64``: slots 2p and 2p+1 keep their keys in ``slots[p, 0]``
  and ``slots[p, 1]`` and ``row + 1`` as the low / high uint32 half of ``slots[p, 2]``, 0
  empty (12 bytes a slot; a zeroed array is an empty index).

A slot is occupied iff it holds a row; every int64 is a valid key, occupancy never borrows a
key value. A key's probe starts at its home slot: ``mix64(key) & (cap - 1)`` where cap is a
power of two, else ``((mix64(key) >> 32) * cap) >> 32`` (``mix64(key) % cap`` past 2^32 slots).
"""

from __future__ import annotations

import numpy as np

from evdb.kernels.hashing import SAMPLE_BITS, mix64_np

_SAMPLE_SHIFT = np.uint64(64 - SAMPLE_BITS)  # unique_sampled: a key's sampling hash

PAIR_WORDS = 3  # slots.shape[1] of the pairs layout


def n_slots(slots: np.ndarray) -> int:
    """The number of slots of an index in either layout."""
    return int(2 * slots.shape[0] if slots.shape[1] == PAIR_WORDS else slots.shape[0])


def slot_rows(slots: np.ndarray) -> np.ndarray:
    """The row of every slot (cap,) int64, -1 where empty."""
    if slots.shape[1] != PAIR_WORDS:
        return slots[:, 1].copy()
    halves = slots[:, 2].copy().view(np.uint32)  # little-endian: slot 2p's (low) half first
    return halves.astype(np.int64) - 1


def slot_keys(slots: np.ndarray) -> np.ndarray:
    """The key of every slot (cap,) int64 (meaningless where the slot is empty)."""
    if slots.shape[1] != PAIR_WORDS:
        return slots[:, 0].copy()
    return slots[:, :2].reshape(-1).copy()


def home_slots(keys: np.ndarray, cap: int) -> np.ndarray:
    """The home slot of each key in an index of cap slots."""
    h = mix64_np(np.ascontiguousarray(keys, dtype=np.int64).view(np.uint64))
    if cap & (cap - 1) == 0:
        return (h & np.uint64(cap - 1)).astype(np.int64)
    if cap <= 2**32:
        return (((h >> np.uint64(32)) * np.uint64(cap)) >> np.uint64(32)).astype(np.int64)
    return (h % np.uint64(cap)).astype(np.int64)


def _set_slot(slots: np.ndarray, j: int, key: int, row: int) -> None:
    if slots.shape[1] != PAIR_WORDS:
        slots[j] = key, row
        return
    slots[j >> 1, j & 1] = key
    halves = slots[j >> 1, 2:3].view(np.uint32)  # a view: writes land in the word
    halves[j & 1] = row + 1


def _row_of(slots: np.ndarray, j: int) -> int:
    if slots.shape[1] != PAIR_WORDS:
        return int(slots[j, 1])
    return int(slots[j >> 1, 2:3].view(np.uint32)[j & 1]) - 1


def _key_of(slots: np.ndarray, j: int) -> int:
    return int(slots[j >> 1, j & 1] if slots.shape[1] == PAIR_WORDS else slots[j, 0])


def _occupied_map(slots: np.ndarray) -> dict[int, int]:
    rows = slot_rows(slots)
    used = rows >= 0
    return dict(zip(slot_keys(slots)[used].tolist(), rows[used].tolist(), strict=True))


def hash_find(slots: np.ndarray, keys: np.ndarray, out: np.ndarray) -> None:
    """out[i] = the row stored for keys[i], or -1 when the index does not hold keys[i].

    keys (n,) int64, out (n,) int64.
    """
    table = _occupied_map(slots)
    out[:] = [table.get(k, -1) for k in keys.tolist()]


def hash_insert(slots: np.ndarray, keys: np.ndarray, rows: np.ndarray) -> None:
    """Insert or assign: afterwards ``hash_find(keys)`` returns ``rows`` (the last one wins
    for a key given twice). The caller guarantees room (load stays below 1) and, in the pairs
    layout, rows below 2^32 - 1.

    Linear probing from the home slot; this layout is shared with ``cpu.py`` so that an index
    built by one backend can be read by the other.
    """
    cap = n_slots(slots)
    homes = home_slots(keys, cap)
    for key, row, home in zip(keys.tolist(), rows.tolist(), homes.tolist(), strict=True):
        j = home
        while _row_of(slots, j) >= 0 and _key_of(slots, j) != key:
            j = (j + 1) % cap
        _set_slot(slots, j, key, row)


def hash_remove(slots: np.ndarray, keys: np.ndarray, out: np.ndarray) -> None:
    """Remove keys; out[i] = the row keys[i] had, or -1 if it was absent (or removed earlier in
    this same call). Afterwards the remaining keys are still found (no tombstones are left:
    the index is rebuilt here; ``cpu.py`` shifts entries back instead)."""
    table = _occupied_map(slots)
    for i, key in enumerate(keys.tolist()):
        out[i] = table.pop(key, -1)
    if slots.shape[1] == PAIR_WORDS:
        slots[:, 2] = 0
    else:
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


def unique_sampled(
    keys: np.ndarray,
    salt: np.uint64,
    threshold: np.uint64,
    scratch: np.ndarray,
    out_unique: np.ndarray,
    out_inverse: np.ndarray,
    out_counts: np.ndarray,
    out_kept: np.ndarray,
    out_hashes: np.ndarray,
) -> tuple[int, int, int]:
    """``unique_inverse`` and a key trace's sample in one call (a recorded pull's dedup).

    Besides ``unique_inverse``'s outputs, ``out_kept[:k]`` are the keys (in order, repeats
    kept) whose sampling hash ``mix64(key ^ salt) >> (64 - SAMPLE_BITS)`` is under
    ``threshold``, and ``out_hashes[:m]`` (uint64) the hashes of the distinct kept keys in
    first-occurrence order. Returns (u, k, m). ``scratch`` as for ``unique_inverse``.
    """
    u = unique_inverse(keys, scratch, out_unique, out_inverse, out_counts)
    hashes = mix64_np(out_unique[:u].view(np.uint64) ^ np.uint64(salt)) >> _SAMPLE_SHIFT
    keep = hashes < np.uint64(threshold)
    kept = keys[keep[out_inverse]]
    out_kept[: kept.shape[0]] = kept
    m = int(np.count_nonzero(keep))
    out_hashes[:m] = hashes[keep]
    return u, kept.shape[0], m


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
