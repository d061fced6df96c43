"""A growable int64 -> row map on the numba index kernels.

Used by the DRAM tier (key -> slab row) and by counter admission (key -> pending count slot).
The slot arrays are power-of-two sized and rebuilt at twice the size when the load factor would
pass ``MAX_LOAD``: at 0.7 a linear probe run stays short (about 1.6 probes on a hit and 6 on a
miss, Knuth's formulas), and the index costs 16 bytes / load = 23 to 46 bytes per key.
"""

from __future__ import annotations

import numpy as np

from evdb._types import Int64Array
from evdb.kernels import cpu

MAX_LOAD = 0.7
_MIN_SLOTS = 1024


def _empty_slots(cap: int) -> Int64Array:
    slots = np.empty((cap, 2), dtype=np.int64)
    slots[:, 1] = -1
    return slots


def _slots_for(n_keys: int) -> int:
    cap = _MIN_SLOTS
    while cap * MAX_LOAD < n_keys:
        cap *= 2
    return cap


class HashIndex:
    """int64 keys -> int64 rows; every int64 is a valid key (occupancy lives in the rows)."""

    def __init__(self, expected_keys: int = 0) -> None:
        self.slots: Int64Array = _empty_slots(_slots_for(expected_keys))
        self.size = 0

    @property
    def nbytes(self) -> int:
        return int(self.slots.nbytes)

    def find(self, keys: Int64Array, out: Int64Array | None = None) -> Int64Array:
        """Rows of keys (n,), -1 where absent."""
        if out is None:
            out = np.empty(keys.shape[0], dtype=np.int64)
        cpu.hash_find(self.slots, np.ascontiguousarray(keys), out)
        return out

    def insert(self, keys: Int64Array, rows: Int64Array) -> None:
        """Add keys that are not in the index yet (the caller deduplicates)."""
        self.reserve(self.size + keys.shape[0])
        cpu.hash_insert(self.slots, np.ascontiguousarray(keys), np.ascontiguousarray(rows))
        self.size += int(keys.shape[0])

    def remove(self, keys: Int64Array) -> Int64Array:
        """Remove keys; returns the rows they had (-1 where absent)."""
        out = np.empty(keys.shape[0], dtype=np.int64)
        cpu.hash_remove(self.slots, np.ascontiguousarray(keys), out)
        self.size -= int(np.count_nonzero(out >= 0))
        return out

    def reserve(self, n_keys: int) -> None:
        """Grow (rehash into a larger power of two) so n_keys fit under MAX_LOAD."""
        cap = _slots_for(n_keys)
        if cap <= self.slots.shape[0]:
            return
        used = self.slots[self.slots[:, 1] >= 0]
        self.slots = _empty_slots(cap)
        cpu.hash_insert(
            self.slots, np.ascontiguousarray(used[:, 0]), np.ascontiguousarray(used[:, 1])
        )

    def live_rows(self) -> Int64Array:
        """Rows of every key in the index, in slot order."""
        rows: Int64Array = self.slots[self.slots[:, 1] >= 0, 1]
        return rows


class RowAllocator:
    """Hands out row numbers of a slab: freed rows first (LIFO), then fresh ones at the top.

    ``high_water`` is one past the highest row ever handed out; slabs size themselves to it.
    """

    def __init__(self) -> None:
        self.free: Int64Array = np.empty(0, dtype=np.int64)
        self.n_free = 0
        self.high_water = 0

    def allocate(self, n: int) -> Int64Array:
        reuse = min(n, self.n_free)
        rows = np.empty(n, dtype=np.int64)
        rows[:reuse] = self.free[self.n_free - reuse : self.n_free]
        self.n_free -= reuse
        rows[reuse:] = np.arange(self.high_water, self.high_water + n - reuse, dtype=np.int64)
        self.high_water += n - reuse
        return rows

    def release(self, rows: Int64Array) -> None:
        need = self.n_free + rows.shape[0]
        if need > self.free.shape[0]:
            grown = np.empty(max(need, 2 * self.free.shape[0]), dtype=np.int64)
            grown[: self.n_free] = self.free[: self.n_free]
            self.free = grown
        self.free[self.n_free : need] = rows
        self.n_free = need
