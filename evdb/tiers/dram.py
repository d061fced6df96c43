"""The DRAM tier: rows in numpy column slabs, found through a numba hash index.

Layout::

    index (HashIndex)        key -> row            16 bytes / slot, load <= 0.7
    row_keys   (cap,)        int64                 the key of each row (scans, eviction)
    values     (cap, dim)    float32               what lookups gather
    slots      (cap, k)      float32               optimizer state
    freq, last_step, version (cap,) u4, i8, u8     record metadata
    flags                    (cap,) u1             record flags (records.FROZEN)
    is_live, is_pinned       (cap,) bool           occupancy (never a sentinel key)
    is_dirty, below          (cap,) bool           the chain's bits: changed since written
    below_step               (cap,) int64          down; the tier below holds a copy (and
                                                   that copy's last_step)

Rows are numbered by a free-list allocator, so a deleted row's storage is reused at once. The
slabs grow by 1.5x. Past ``RESERVE_FROM_ROWS`` rows each column is a prefix of an anonymous
mapping reserved far ahead (16 GiB of address space, not memory: the kernel maps a page on its
first write), so growing is taking a longer prefix: no row is copied. Growing by copying every
column stalled a step of a table growing to 1M rows (dim 64, Adagrad) for 400-600 ms at each
1.5x; it still stands where the system refuses the reservation, and below the threshold.
"""

from __future__ import annotations

import contextlib
import mmap
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np

from evdb._types import BoolArray, Float32Array, Int64Array
from evdb.config import DramConfig
from evdb.hashindex import HashIndex, RowAllocator
from evdb.kernels import cpu
from evdb.kernels.cpu.evict import victim_candidates
from evdb.kernels.cpu.stamp import clear_flags
from evdb.records import RecordBatch
from evdb.tiers.base import Tier

_COLUMNS = (
    "row_keys",
    "values",
    "slots",
    "freq",
    "last_step",
    "version",
    "flags",
    "is_live",
    "is_pinned",
    "is_dirty",
    "below",
    "below_step",
)


RESERVE_FROM_ROWS = 1 << 16  # smaller slabs grow by copying (cheap); bigger ones by reservation
_RESERVE_BYTES = 16 << 30  # address space reserved per column (doubled when outgrown)
_MAP_NORESERVE = 0x4000  # Linux's flag (the mmap module does not name it): reserve, don't commit
_HUGE_FROM = 64 << 20  # bytes of a column on 4 KiB pages before huge pages are asked for


def _reserve(column: np.ndarray, rows: int) -> np.ndarray | None:
    """A zeroed array of ``rows`` rows shaped like column's, over an anonymous mapping whose
    pages the kernel provides on first write; None where the system refuses the reservation
    (not Linux, strict overcommit, no address space)."""
    width = int(np.prod(column.shape[1:], dtype=np.int64))
    if sys.platform != "linux" or width == 0:
        return None
    try:
        mapping = mmap.mmap(
            -1,
            rows * width * column.dtype.itemsize,
            flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE,
        )
    except (OSError, ValueError, OverflowError):
        return None
    if hasattr(mmap, "MADV_HUGEPAGE") and len(mapping) > _HUGE_FROM:
        # 2 MiB pages past the first 64 MiB (numpy asks the same for its own big arrays): a
        # random row of a big table then costs no 4 KiB TLB walk (lookup of 65,536 keys in a
        # 10M-row table: 21-24 -> 35-40M keys/s). Not below it: moving a slab in at 65,536 rows
        # then faulted 2 MiB pages for every column at once (a 170 ms step in bench_growth).
        with contextlib.suppress(OSError):
            mapping.madvise(mmap.MADV_HUGEPAGE, _HUGE_FROM, len(mapping) - _HUGE_FROM)
    return np.frombuffer(mapping, dtype=column.dtype).reshape(rows, *column.shape[1:])


class DramTier(Tier):
    """Rows in process memory; the top (and, until RocksDB is configured, bottom) tier."""

    name = "dram"
    _evict_scratch: tuple[Int64Array, np.ndarray, BoolArray, BoolArray] | None = None

    def __init__(self, dim: int, n_slots: int, config: DramConfig) -> None:
        self.dim = dim
        self.n_slots = n_slots
        self.config = config
        self.index = HashIndex(max(config.capacity_rows or 0, config.initial_rows))
        self.alloc = RowAllocator()
        self.row_keys: Int64Array = np.empty(0, dtype=np.int64)
        self.values: Float32Array = np.empty((0, dim), dtype=np.float32)
        self.slots: Float32Array = np.empty((0, n_slots), dtype=np.float32)
        self.freq = np.empty(0, dtype=np.uint32)
        self.last_step: Int64Array = np.empty(0, dtype=np.int64)
        self.version = np.empty(0, dtype=np.uint64)
        self.flags = np.empty(0, dtype=np.uint8)
        self.is_live: BoolArray = np.zeros(0, dtype=bool)
        self.is_pinned: BoolArray = np.zeros(0, dtype=bool)
        self.is_dirty: BoolArray = np.zeros(0, dtype=bool)
        self.below: BoolArray = np.zeros(0, dtype=bool)
        self.below_step: Int64Array = np.empty(0, dtype=np.int64)
        self._pinned_rows: Int64Array = np.empty(0, dtype=np.int64)
        self.evictions = 0
        # Calls that freed rows: a row number handed out earlier still names the same key as
        # long as this has not changed (rows move only when freed and reused).
        self.frees = 0
        self.expired_evictions = 0
        self._reserved: dict[str, np.ndarray] = {}  # the columns' reservations (see _fit)
        self._fit(config.initial_rows)

    # -- capabilities ---------------------------------------------------------------------
    @property
    def persistent(self) -> bool:
        return False

    @property
    def device(self) -> str:
        return "cpu"

    @property
    def capacity_rows(self) -> int | None:
        return self.config.capacity_rows

    def __len__(self) -> int:
        return self.index.size

    # -- storage --------------------------------------------------------------------------
    def _fit(self, n_rows: int) -> None:
        old = self.row_keys.shape[0]
        if n_rows <= old:
            return
        cap = max(n_rows, old + old // 2, 1024)
        for name in _COLUMNS:
            setattr(self, name, self._grown(name, getattr(self, name), cap))

    def _grown(self, name: str, col: np.ndarray, cap: int) -> np.ndarray:
        """Column ``name`` with room for cap rows: a longer prefix of its reservation, or a
        copy into a new array (zeroed where it is a bool column)."""
        reserved = self._reserved.get(name)
        if reserved is None or reserved.shape[0] < cap:
            if cap >= RESERVE_FROM_ROWS:
                row_bytes = max(1, col.itemsize * int(np.prod(col.shape[1:], dtype=np.int64)))
                reserved = _reserve(col, max(2 * cap, _RESERVE_BYTES // row_bytes))
            if reserved is None or reserved.shape[0] < cap:
                alloc = np.zeros if col.dtype == bool else np.empty
                grown = alloc((cap, *col.shape[1:]), dtype=col.dtype)
                grown[: col.shape[0]] = col
                return grown
            reserved[: col.shape[0]] = col  # once per reservation: moving in
            self._reserved[name] = reserved
        return reserved[:cap]

    def locate(self, keys: Int64Array, out: Int64Array | None = None) -> Int64Array:
        """Row of each key (n,), -1 where absent (expired rows are still located)."""
        return self.index.find(keys, out)

    def probe_gather(
        self, keys: Int64Array, min_live_step: int, out: Float32Array, out_rows: Int64Array
    ) -> int:
        """Fused probe + TTL check + gather into out; returns how many keys were missing."""
        return int(
            cpu.probe_gather(
                self.index.slots,
                self.values,
                self.last_step,
                keys,
                min_live_step,
                out,
                out_rows,
            )
        )

    def insert(
        self,
        keys: Int64Array,
        records: RecordBatch,
        *,
        dirty: bool = True,
        below_step: Int64Array | None = None,
    ) -> Int64Array:
        """Store records of distinct keys that are absent; returns their rows.

        ``below_step``: the ``last_step`` of the copy the tier below holds, when it holds one
        (the row then came up from it); ``dirty``: whether this copy differs from it.
        """
        rows = self.alloc.allocate(keys.shape[0])
        self._fit(self.alloc.high_water)
        self.index.insert(keys, rows)
        self.row_keys[rows] = keys
        self.is_live[rows] = True
        self.is_dirty[rows] = dirty
        self.below[rows] = below_step is not None
        if below_step is not None:
            self.below_step[rows] = below_step
        self.write(rows, records)
        return rows

    def write(self, rows: Int64Array, records: RecordBatch) -> None:
        self.values[rows] = records.values
        self.slots[rows] = records.slots
        self.freq[rows] = records.freq
        self.last_step[rows] = records.last_step
        self.version[rows] = records.version
        self.flags[rows] = records.flags

    def read(self, rows: Int64Array) -> RecordBatch:
        return RecordBatch(
            values=self.values[rows],
            slots=self.slots[rows],
            freq=self.freq[rows],
            last_step=self.last_step[rows],
            version=self.version[rows],
            flags=self.flags[rows],
        )

    def remove_rows(self, rows: Int64Array) -> None:
        """Free rows (distinct, live)."""
        self.index.remove(self.row_keys[rows])
        self._free(rows)

    def _free(self, rows: Int64Array) -> None:
        if rows.shape[0]:
            self.is_live[rows] = False
            self.is_pinned[rows] = False
            self.is_dirty[rows] = False
            self.below[rows] = False
            self.alloc.release(rows)
            self.frees += 1

    def live_rows(self) -> Int64Array:
        return np.flatnonzero(self.is_live[: self.alloc.high_water])

    # -- Tier contract --------------------------------------------------------------------
    def get(self, keys: Int64Array) -> tuple[BoolArray, RecordBatch]:
        rows = self.locate(keys)
        found = rows >= 0
        return found, self.read(rows[found])

    def put(self, keys: Int64Array, records: RecordBatch, existed: BoolArray | None = None) -> None:
        rows = self.locate(keys)
        found = rows >= 0
        if found.all():
            self.write(rows, records)
            return
        self.write(rows[found], records.take(found))
        self.insert(keys[~found], records.take(~found))

    def remove(self, keys: Int64Array, present: BoolArray | None = None) -> BoolArray:
        rows = self.index.remove(keys)
        found = rows >= 0
        self._free(rows[found])
        return found

    def scan(self, chunk_rows: int) -> Iterator[tuple[Int64Array, RecordBatch]]:
        """Every live row once, a chunk at a time. A caller may remove rows between chunks
        (``compact`` does): a row freed meanwhile, or reused by another key, is skipped."""
        live = self.live_rows()
        keys = self.row_keys[live]  # each row's key when the scan began
        for start in range(0, live.shape[0], chunk_rows):
            rows = live[start : start + chunk_rows]
            same = self.is_live[rows] & (self.row_keys[rows] == keys[start : start + chunk_rows])
            if not same.all():
                rows = rows[same]
            if rows.shape[0]:
                yield self.row_keys[rows], self.read(rows)

    def live_blocks(
        self, min_live_step: int, block_rows: int
    ) -> Iterator[tuple[Float32Array, Int64Array]]:
        """(values, keys) of the live rows, read in place a block of rows at a time (views,
        valid until the tier changes)."""
        high = self.alloc.high_water
        for start in range(0, high, block_rows):
            end = min(start + block_rows, high)
            live = self.is_live[start:end] & (self.last_step[start:end] >= min_live_step)
            values = self.values[start:end]
            keys = self.row_keys[start:end]
            if live.all():
                yield values, keys
            elif live.any():
                # Scoring a partly empty block whole and dropping the dead rows' scores after
                # would read the dead rows too; gathering the live ones reads each row once.
                rows = np.flatnonzero(live)
                yield values[rows], keys[rows]

    # -- the batch in flight and eviction -------------------------------------------------
    def pin(self, rows: Int64Array, *, flagged: bool = False) -> None:
        """Protect rows from eviction until ``unpin_all`` (``flagged``: the pull's kernel has
        set their ``is_pinned`` already; only remember them)."""
        if not flagged:
            self.is_pinned[rows] = True
        self._pinned_rows = np.concatenate([self._pinned_rows, rows])

    def unpin_all(self) -> None:
        clear_flags(self.is_pinned, self._pinned_rows)
        self._pinned_rows = np.empty(0, dtype=np.int64)

    def n_pinned(self, min_live_step: int) -> int:
        """Pinned rows that are still live (an expired row is gone, pinned or not)."""
        rows = np.unique(self._pinned_rows)
        rows = rows[self.is_pinned[rows]]
        return int(np.count_nonzero(self.last_step[rows] >= min_live_step))

    def evict_to_capacity(
        self, step: int, min_live_step: int, protect: Int64Array | None = None
    ) -> None:
        """When over capacity, drop the lowest-score rows down to the low watermark (a tier
        with nothing below it; the chain writes victims down instead)."""
        victims, expired = self.choose_victims(step, min_live_step, protect)
        self.remove_rows(victims)
        self.count_evictions(expired)

    def eviction_counts(self) -> tuple[int, int]:
        """Rows evicted, and expired rows reclaimed by eviction, since the table was made."""
        return self.evictions, self.expired_evictions

    def load_eviction_counts(self, counts: tuple[int, int]) -> None:
        self.evictions, self.expired_evictions = (int(c) for c in counts)

    def count_evictions(self, expired: BoolArray) -> None:
        n_expired = int(np.count_nonzero(expired))
        self.expired_evictions += n_expired
        self.evictions += expired.shape[0] - n_expired

    def choose_victims(
        self, step: int, min_live_step: int, protect: Int64Array | None = None
    ) -> tuple[Int64Array, BoolArray]:
        """When over capacity, the lowest-score rows that bring it down to the low watermark,
        and which of them have expired; pinned rows are never victims unless they have
        expired, ``protect`` rows never. Nothing is removed.

        Exact, not sampled: every candidate is scored in one numba pass over the columns
        (``victim_candidates``) and ``argpartition`` picks the lowest. At 535,000 rows (60,000
        victims) that takes 3.0 ms, where numpy's masks, gathers and float64 temporaries took
        4.9. With ``evict_fraction`` 0.05 it runs once per 25,000 rows created (about every
        16 steps of bench_tiers' spilling run: 0.2 ms a step), so sampling candidates
        (Redis-style) or a score histogram would save under 0.2 ms a step, and would change
        which rows go.
        """
        cap = self.capacity_rows
        if cap is None or len(self) <= cap:
            return np.empty(0, dtype=np.int64), np.zeros(0, dtype=bool)
        target = int(cap * (1.0 - self.config.evict_fraction))
        high = self.alloc.high_water
        rows, scores, expired, protected = self._victim_scratch(high)
        protected = protected[:high]
        protected[:] = False
        if protect is not None:
            protected[protect] = True
        m = int(
            victim_candidates(
                self.is_live[:high],
                self.is_pinned[:high],
                protected,
                self.freq[:high],
                self.last_step[:high],
                step,
                self.config.half_life_steps,
                min_live_step,
                self.config.eviction == "lfu",
                rows,
                scores,
                expired,
            )
        )
        n = min(len(self) - target, m)
        if n >= m:
            return rows[:m].copy(), expired[:m].copy()
        victims = np.argpartition(scores[:m], n - 1)[:n]  # n >= 1: len(self) > cap > target
        return rows[victims], expired[victims]

    def _victim_scratch(self, n: int) -> tuple[Int64Array, np.ndarray, BoolArray, BoolArray]:
        """Reused arrays of ``victim_candidates`` (its outputs and the protected mask, at
        least n long): fresh ones would cost a page fault per 4 KiB on every eviction."""
        scratch = self._evict_scratch
        if scratch is None or scratch[0].shape[0] < n:
            size = max(n, n + n // 4)
            scratch = (
                np.empty(size, dtype=np.int64),
                np.empty(size, dtype=np.float64),
                np.empty(size, dtype=bool),
                np.empty(size, dtype=bool),
            )
            self._evict_scratch = scratch
        return scratch

    def stats(self) -> dict[str, Any]:
        slab = sum(getattr(self, c)[: self.alloc.high_water].nbytes for c in _COLUMNS)
        return {
            "rows": len(self),
            "dirty_rows": int(np.count_nonzero(self.is_dirty[: self.alloc.high_water])),
            "capacity": self.capacity_rows,
            "evictions": self.evictions,
            "expired_evictions": self.expired_evictions,
            "pinned": int(np.count_nonzero(self.is_pinned[np.unique(self._pinned_rows)])),
            "bytes": int(slab + self.index.nbytes),
            "index_bytes": self.index.nbytes,
            "bytes_per_row": (slab + self.index.nbytes) / max(len(self), 1),
        }
