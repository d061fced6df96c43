"""A growable int64 -> row map on the numba index kernels.

Used by the DRAM tier (key -> slab row) and by counter admission (key -> pending count slot).
The slot arrays are power-of-two sized and rebuilt at twice the size when the load factor would
pass ``MAX_LOAD``: at 0.7 a linear probe run stays short (about 1.6 probes on a hit and 6 on a
miss, Knuth's formulas), and the index costs 16 bytes / load = 23 to 46 bytes per key.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from evdb._types import Int64Array
from evdb.kernels import backend

MAX_LOAD = 0.7
MOVE_SLOTS = 1 << 16  # old slots moved per call while growing (about 45k keys: a few ms)
PREPARE_LOAD = 0.5  # past this load the next table's empty slots are written, a part per call
_MIN_SLOTS = 1024


def _empty_slots(cap: int, xp: Any = np) -> Int64Array:
    slots: Int64Array = xp.empty((cap, 2), dtype=np.int64)
    slots[:, 1] = -1
    return slots


def _slots_for(n_keys: int) -> int:
    cap = _MIN_SLOTS
    while cap * MAX_LOAD < n_keys:
        cap *= 2
    return cap


def index_bytes(n_keys: int) -> int:
    """Bytes of the slot table of an index sized for n_keys (16 per slot, load <= MAX_LOAD)."""
    return 16 * _slots_for(n_keys)


class HashIndex:
    """int64 keys -> int64 rows; every int64 is a valid key (occupancy lives in the rows).

    Growing does not stop the world: past ``MAX_LOAD`` the index starts a twice-as-large
    table and moves the old one's keys over ``MOVE_SLOTS`` old slots per call (Redis moves a
    bucket range per operation) while both answer: a key is looked up in the new table,
    then in the old. Rehashing 740k keys at once stalled a training step for 20-90 ms here
    (random inserts into a fresh 32 MB table). ``slots`` (what the fused read kernels probe)
    and ``remove`` finish a move first, so those always see one table.

    Marking the slots of a new table empty writes every page of it (8M slots: 128 MB, 220 ms
    of page faults here), so that is spread too: past ``PREPARE_LOAD`` each insert of m keys
    marks about 10 m slots of the next table, which is ready by the time the load reaches
    ``MAX_LOAD``. An index sized up front (``expected_keys``: a table's capacity or
    ``initial_rows``) prepares none until it holds more keys than that.

    ``xp`` and ``kernels`` are the array module and kernel backend the slots live with (numpy
    and the cpu kernels by default; a device tier passes its own): keys and rows in and out
    are arrays of that module.
    """

    def __init__(
        self, expected_keys: int = 0, *, xp: Any = np, kernels: ModuleType | None = None
    ) -> None:
        self._xp = xp
        self._kernels = backend("cpu") if kernels is None else kernels
        self._table: Int64Array = _empty_slots(_slots_for(expected_keys), xp)
        self._expected = expected_keys  # sized for these up front: no next table below them
        self._old: Int64Array | None = None  # the table being moved out of, while growing
        self._moved = 0  # old slots moved so far
        self._next: Int64Array | None = None  # the next, larger table, being prepared
        self._prepared = 0  # its slots marked empty so far
        self.size = 0

    @property
    def slots(self) -> Int64Array:
        """The one table of (key, row) slots, after finishing any move in progress."""
        self._finish_move()
        return self._table

    @property
    def moving(self) -> bool:
        """Whether a move into a bigger slot table is in progress: then a probe (``find``,
        ``slots``) advances it, so even a read changes the index."""
        return self._old is not None

    @property
    def nbytes(self) -> int:
        extra = sum(0 if t is None else t.nbytes for t in (self._old, self._next))
        return int(self._table.nbytes + extra)

    def find(self, keys: Int64Array, out: Int64Array | None = None) -> Int64Array:
        """Rows of keys (n,), -1 where absent."""
        if out is None:
            out = self._xp.empty(keys.shape[0], dtype=np.int64)
        keys = self._xp.ascontiguousarray(keys)
        self._kernels.hash_find(self._table, keys, out)
        if self._old is not None:
            miss = self._xp.flatnonzero(out < 0)
            if miss.size:
                found = self._xp.empty(miss.shape[0], dtype=np.int64)
                self._kernels.hash_find(self._old, self._xp.ascontiguousarray(keys[miss]), found)
                out[miss] = found
            self._move()
        return out

    def insert(self, keys: Int64Array, rows: Int64Array) -> None:
        """Add keys that are not in the index yet (the caller deduplicates)."""
        self.reserve(self.size + keys.shape[0])
        self._kernels.hash_insert(
            self._table, self._xp.ascontiguousarray(keys), self._xp.ascontiguousarray(rows)
        )
        self.size += int(keys.shape[0])
        if self._old is not None:
            self._move()
        elif self.size > max(PREPARE_LOAD * self._table.shape[0], self._expected):
            self._prepare(10 * int(keys.shape[0]))

    def remove(self, keys: Int64Array) -> Int64Array:
        """Remove keys; returns the rows they had (-1 where absent). A move in progress
        finishes first: removal shifts a probe run's later keys back (backward-shift
        deletion), which in the old table could carry a key not moved yet behind the move's
        cursor. A table that grows does not evict (it is under capacity), so moves still
        spread over the calls that grow it."""
        self._finish_move()
        out: Int64Array = self._xp.empty(keys.shape[0], dtype=np.int64)
        self._kernels.hash_remove(self._table, self._xp.ascontiguousarray(keys), out)
        self.size -= int(self._xp.count_nonzero(out >= 0))
        return out

    def reserve(self, n_keys: int) -> None:
        """Make room for n_keys under MAX_LOAD: start moving into a larger power of two (a
        move still in progress finishes first)."""
        cap = _slots_for(n_keys)
        if cap <= self._table.shape[0]:
            return
        self._finish_move()
        self._old, self._moved = self._table, 0
        if self._next is not None and self._next.shape[0] == cap:
            self._prepare(cap)  # the rest of it
            self._table, self._next = self._next, None
        else:
            self._table, self._next = _empty_slots(cap, self._xp), None
        if self.size <= MOVE_SLOTS:  # small: at once (nothing to spread)
            self._finish_move()

    def _move(self, n_slots: int = 0) -> None:
        """Move the keys of the next old slots (MOVE_SLOTS by default) into the new table."""
        old = self._old
        assert old is not None
        stop = (
            old.shape[0]
            if n_slots < 0
            else min(old.shape[0], self._moved + (n_slots or MOVE_SLOTS))
        )
        chunk = old[self._moved : stop]
        used = chunk[chunk[:, 1] >= 0]
        if used.shape[0]:
            keys = self._xp.ascontiguousarray(used[:, 0])
            have = self._xp.empty(keys.shape[0], dtype=np.int64)
            self._kernels.hash_find(self._table, keys, have)
            new = have < 0  # a key inserted anew since the move began keeps its new row
            self._kernels.hash_insert(
                self._table,
                self._xp.ascontiguousarray(keys[new]),
                self._xp.ascontiguousarray(used[new, 1]),
            )
        self._moved = stop
        if stop == old.shape[0]:
            self._old = None

    def _prepare(self, n_slots: int) -> None:
        """Mark the next n_slots slots of the next table (twice this one) empty."""
        if self._next is None:
            self._next, self._prepared = self._xp.empty((2 * self._table.shape[0], 2), np.int64), 0
        stop = min(self._next.shape[0], self._prepared + max(n_slots, 1))
        self._next[self._prepared : stop, 1] = -1
        self._prepared = stop

    def _finish_move(self) -> None:
        if self._old is not None:
            self._move(-1)

    def live_rows(self) -> Int64Array:
        """Rows of every key in the index, in slot order."""
        table = self.slots
        rows: Int64Array = table[table[:, 1] >= 0, 1]
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
