"""A growable int64 -> row map on the numba index kernels.

Used by the DRAM tier (key -> slab row) and by counter admission (key -> pending count slot).
On the host the slots are the kernels' pairs layout (``evdb.kernels.cpu.index``: 12 bytes a
slot, a zeroed array is empty), any number of them (fastrange homes), grown 1.25x when the
load would pass ``MAX_LOAD``: 12 / 0.7 = 17 to 21 bytes per key (1.5x would be 17 to 26).
At 0.7 a linear probe run stays short (about 1.6 probes on a hit and 6 on a miss, Knuth's
formulas). A device tier's index (and an emulated one's) keeps the wide layout the CUDA
sources read: 16-byte slots, a power of two of them, doubled: 23 to 46 bytes per key.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import sys
from types import ModuleType
from typing import Any

import numpy as np

from evdb._types import Int64Array
from evdb.errors import CapacityError
from evdb.kernels import backend

MAX_LOAD = 0.7
GROWTH = 1.25  # host slot tables grow by this factor (device ones double: powers of two)
MOVE_SLOTS = 1 << 16  # old slots moved per call while growing (about 45k keys: a few ms)
MOVE_PER_KEY = 8  # ... or this many per key inserted, if more: the move ends within 1/8 of
# the keys the old table held (load 0.56 -> 0.63 of the new one), so the old table is not
# kept for long (it was held through a 1M-key fill: 17 of the 58 index bytes a row)
PAIR_WORDS = 3  # int64 words per two slots in the pairs layout
MAX_ROW = 2**32 - 2  # the largest row a host index holds (row + 1 in a uint32)
_MIN_SLOTS = 1024
_RELEASE_UNIT = 2 << 20  # moved-out parts of an old table go back to the system in these


def _pairs_slots(n_keys: int) -> int:
    """Slots of a host index sized for n_keys up front: the fewest under MAX_LOAD (even)."""
    cap = max(_MIN_SLOTS, math.ceil(n_keys / MAX_LOAD))
    return cap + (cap & 1)


def _wide_slots(n_keys: int) -> int:
    cap = _MIN_SLOTS
    while cap * MAX_LOAD < n_keys:
        cap *= 2
    return cap


def index_bytes(n_keys: int, *, device: bool = False) -> int:
    """Bytes of the slot table of an index sized for n_keys: a host one (12 per slot, load
    <= MAX_LOAD; grown to n_keys by inserts, up to GROWTH times that), or a device one (16
    per slot, a power of two of them)."""
    return 16 * _wide_slots(n_keys) if device else 12 * _pairs_slots(n_keys)


def empty_slots(n_keys: int) -> Int64Array:
    """An empty host slot table (pairs layout) sized for n_keys, for the index kernels."""
    slots: Int64Array = np.zeros((_pairs_slots(n_keys) // 2, PAIR_WORDS), dtype=np.int64)
    return slots


def _release(table: np.ndarray, start: int, stop: int) -> tuple[int, int]:
    """Give the whole ``_RELEASE_UNIT``s (aligned: huge pages are not split) within table's
    bytes [start, stop) back to the system; they read as zeros again (empty slots). Returns
    where the bytes released end (start if none were) and how many there were."""
    base = table.ctypes.data
    lo = -(-(base + start) // _RELEASE_UNIT) * _RELEASE_UNIT
    hi = (base + stop) // _RELEASE_UNIT * _RELEASE_UNIT
    if hi <= lo or _madvise is None:
        return start, 0
    if _madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), _MADV_DONTNEED) != 0:
        return start, 0
    return hi - base, hi - lo


_MADV_DONTNEED = 4  # Linux: private anonymous pages are dropped and read as zeros after
_madvise: Any = None
if sys.platform == "linux":
    with contextlib.suppress(OSError, AttributeError):
        _madvise = ctypes.CDLL(None, use_errno=True).madvise
        _madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        _madvise.restype = ctypes.c_int


class HashIndex:
    """int64 keys -> int64 rows; every int64 is a valid key (occupancy lives in the rows).

    Growing does not stop the world: past ``MAX_LOAD`` the index starts a larger table and
    moves the old one's keys over ``MOVE_SLOTS`` old slots per call (or ``MOVE_PER_KEY`` per
    key inserted, if more; Redis moves a bucket range per operation) while both answer: a key
    is looked up in the new table, then in the old. Rehashing 740k keys at once stalled a
    training step for 20-90 ms here (random inserts into a fresh 32 MB table). ``slots`` (what
    the fused read kernels probe) and ``remove`` finish a move first, so those always see one
    table.

    On the host a new table is a zeroed allocation, so it costs no writes up front (the
    kernel maps zero pages on first touch, as inserts and the move reach them), and the
    moved-out part of the old one goes back to the system as the move passes it: the two
    tables together stay near the new one's size. That is safe because a move chunk ends at
    an empty slot: a key left in the old table has its whole probe run there, and a probe
    that runs into a released part reads empty slots, so it ends as it would have.

    ``xp`` and ``kernels`` are the array module and kernel backend the slots live with (numpy
    and the cpu kernels by default; a device tier passes its own): keys and rows in and out
    are arrays of that module. ``wide`` picks the layout (default: wide off the host).
    """

    def __init__(
        self,
        expected_keys: int = 0,
        *,
        xp: Any = np,
        kernels: ModuleType | None = None,
        wide: bool | None = None,
    ) -> None:
        self._xp = xp
        self._kernels = backend("cpu") if kernels is None else kernels
        # the host layout, unless told (an emulated device tier) or on a device: its kernels
        # read the wide one
        self._pairs = xp is np if wide is None else not wide
        size = _pairs_slots if self._pairs else _wide_slots
        self._table: Int64Array = self._new_table(size(expected_keys))
        self._old: Int64Array | None = None  # the table being moved out of, while growing
        self._moved = 0  # old slots moved so far
        self._released = 0  # bytes of the old table given back to the system so far
        self._release_at = 0  # and where in it they end
        self.size = 0

    def _new_table(self, cap: int) -> Int64Array:
        if self._pairs:
            table: Int64Array = np.zeros((cap // 2, PAIR_WORDS), dtype=np.int64)
        else:
            table = self._xp.empty((cap, 2), dtype=np.int64)
            table[:, 1] = -1
        return table

    def _cap(self, table: Int64Array) -> int:
        return int(2 * table.shape[0] if self._pairs else table.shape[0])

    def _slot_rows(self, table: Int64Array, lo: int, hi: int) -> Int64Array:
        """Rows of slots [lo, hi) of a table, -1 where empty (a copy on the host)."""
        if not self._pairs:
            return table[lo:hi, 1]
        words = np.ascontiguousarray(table[lo // 2 : (hi + 1) // 2, 2])
        halves = words.view(np.uint32)[lo % 2 : lo % 2 + hi - lo]  # little-endian: 2p first
        rows: Int64Array = halves.astype(np.int64) - 1
        return rows

    def _slot_keys(self, table: Int64Array, lo: int, hi: int) -> Int64Array:
        if not self._pairs:
            return table[lo:hi, 0]
        keys: Int64Array = table[lo // 2 : (hi + 1) // 2, :2].reshape(-1)
        return keys[lo % 2 : lo % 2 + hi - lo]

    @property
    def slots(self) -> Int64Array:
        """The one table of slots, after finishing any move in progress."""
        self._finish_move()
        return self._table

    @property
    def moving(self) -> bool:
        """Whether a move into a bigger slot table is in progress: then a probe (``find``,
        ``slots``) advances it, so even a read changes the index."""
        return self._old is not None

    @property
    def nbytes(self) -> int:
        old = 0 if self._old is None else self._old.nbytes - self._released
        return int(self._table.nbytes + old)

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
            self._move(MOVE_SLOTS)
        return out

    def insert(self, keys: Int64Array, rows: Int64Array) -> None:
        """Add keys that are not in the index yet (the caller deduplicates)."""
        n = int(keys.shape[0])
        if self._pairs and n and not 0 <= int(rows.min()) <= int(rows.max()) <= MAX_ROW:
            bad = int(np.flatnonzero((rows < 0) | (rows > MAX_ROW))[0])
            raise CapacityError(
                f"rows: the index holds rows 0..{MAX_ROW}, got rows[{bad}] = {int(rows[bad])}"
            )
        self.reserve(self.size + n)
        self._kernels.hash_insert(
            self._table, self._xp.ascontiguousarray(keys), self._xp.ascontiguousarray(rows)
        )
        self.size += n
        if self._old is not None:
            self._move(max(MOVE_SLOTS, MOVE_PER_KEY * n))

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
        """Make room for n_keys under MAX_LOAD: start moving into a larger table (a move
        still in progress finishes first)."""
        cap = self._cap(self._table)
        if n_keys <= cap * MAX_LOAD:
            return
        if self._pairs:
            new_cap = max(_pairs_slots(n_keys), 2 * math.ceil(cap * GROWTH / 2))
        else:
            new_cap = _wide_slots(n_keys)
        self._finish_move()
        self._old, self._moved, self._released, self._release_at = self._table, 0, 0, 0
        self._table = self._new_table(new_cap)
        if self.size <= MOVE_SLOTS:  # small: at once (nothing to spread)
            self._finish_move()

    def _move(self, n_slots: int) -> None:
        """Move the keys of the next n_slots old slots (all if negative), and on to the next
        empty slot, into the new table."""
        old = self._old
        assert old is not None
        cap = self._cap(old)
        start = self._moved
        stop = cap if n_slots < 0 else min(cap, start + n_slots)
        while stop < cap:  # end the chunk at an empty slot (see the class docstring)
            ahead = self._xp.flatnonzero(self._slot_rows(old, stop, min(cap, stop + 64)) < 0)
            if ahead.shape[0]:
                stop += int(ahead[0]) + 1
                break
            stop = min(cap, stop + 64)
        rows = self._slot_rows(old, start, stop)
        used = self._xp.flatnonzero(rows >= 0)
        if used.shape[0]:
            keys = self._xp.ascontiguousarray(self._slot_keys(old, start, stop)[used])
            have = self._xp.empty(keys.shape[0], dtype=np.int64)
            self._kernels.hash_find(self._table, keys, have)
            new = have < 0  # a key inserted anew since the move began keeps its new row
            self._kernels.hash_insert(
                self._table,
                self._xp.ascontiguousarray(keys[new]),
                self._xp.ascontiguousarray(rows[used][new]),
            )
        self._moved = stop
        if stop == cap:
            self._old = None
        elif self._pairs:  # the pairs before the one holding slot stop are all moved
            self._release_at, n = _release(old, self._release_at, (stop // 2) * old.strides[0])
            self._released += n

    def _finish_move(self) -> None:
        if self._old is not None:
            self._move(-1)

    def live_rows(self) -> Int64Array:
        """Rows of every key in the index, in slot order."""
        table = self.slots
        rows = self._slot_rows(table, 0, self._cap(table))
        live: Int64Array = rows[rows >= 0]
        return live


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
