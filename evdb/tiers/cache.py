"""The cache tier: the rows on top of a chain, in column slabs found through a hash index.

One implementation of the ``CacheTier`` role (``evdb.tiers.base``) for every top tier,
parameterised by an array module and a kernel backend: the DRAM tier is numpy with the cpu
kernels (``evdb.tiers.dram``), an HBM tier is the device's arrays with its kernels
(``evdb.tiers.hbm``), and emulated HBM is numpy again under the name "hbm". Arrays cross the
boundary as host numpy arrays (keys, row handles, values, records); the columns never leave::

    index (HashIndex)        key -> row            12 bytes / slot on the host (16 on a
                                                   device), load <= 0.7
    row_keys   (cap,)        int64                 the key of each row (scans, eviction)
    values     (cap, dim)    float32               what lookups gather
    slots      (cap, k)      float32               optimizer state
    freq, last_step, version (cap,) u4, i8, u8     record metadata
    flags                    (cap,) u1             record flags (records.FROZEN)
    is_live, is_pinned       (cap,) bool           occupancy (never a sentinel key)
    is_dirty, below          (cap,) bool           the chain's bits: changed since written
    below_step               (cap,) int64          down; the tier below holds a copy (and
                                                   that copy's last_step)

Rows are numbered by a free-list allocator, so a deleted row's storage is reused at once. A
row handle stays valid while ``frees`` is unchanged (rows move only when freed and reused).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt

from evdb._types import BoolArray, Float32Array, Int64Array
from evdb.bags import Bags
from evdb.config import DramConfig
from evdb.hashindex import HashIndex, RowAllocator
from evdb.records import FREQ_MAX, FROZEN, RecordBatch
from evdb.tiers.base import CacheTier

__all__ = ["COLUMNS", "ColumnCache"]

COLUMNS = (
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


def _same(a: Any) -> Any:
    return a


# Grows a column to a number of rows (a copy, or a longer prefix of a reservation): the
# array module's own growth unless the tier is given one (the DRAM tier's reservations).
Grow = Callable[[str, Any, int], Any]


class ColumnCache(CacheTier):
    """Rows of one table in column slabs of ``xp`` arrays, operated on by ``kernels``.

    Parameters
    ----------
    dim, n_slots : int
        Record width (values, optimizer slots).
    config : DramConfig
        Capacity, initial rows and the victim policy (eviction, half-life, evict fraction).
    name, device : str
        The level's name in stats ("dram", "hbm") and where its rows live ("cpu", "cuda:0").
    xp : module
        The array module of the columns (numpy; cupy for a GPU).
    kernels : module
        A kernel backend of ``evdb.kernels`` that takes ``xp`` arrays.
    grow : callable, optional
        ``grow(name, column, rows)``: the column with room for rows (default: a copy).
    emulated : bool, optional
        For a device tier: whether it runs on the CPU instead (stats say so).
    value_dtype : numpy dtype, optional
        How the values column stores rows (float32; ``LowpColumnCache`` passes uint16 for
        bfloat16 bits or float16 and overrides every method that reads or writes values).
    """

    _evict_scratch: tuple[Int64Array, np.ndarray, BoolArray, BoolArray] | None = None

    def __init__(
        self,
        dim: int,
        n_slots: int,
        config: DramConfig,
        *,
        name: str,
        device: str,
        xp: Any,
        kernels: ModuleType,
        grow: Grow | None = None,
        emulated: bool | None = None,
        value_dtype: Any = np.float32,
    ) -> None:
        self.name = name
        self._emulated = emulated  # an HBM tier's rows held on the CPU (shown in stats)
        self._device = device
        self.dim = dim
        self.n_slots = n_slots
        self.config = config
        self.xp = xp
        self.kernels = kernels
        # Host arrays in, the tier's arrays out, and back: the arrays themselves for numpy
        # (callers pass C-contiguous arrays, as the kernels' signatures require).
        self._dev: Callable[[Any], Any] = _same if xp is np else xp.ascontiguousarray
        self._host: Callable[[Any], npt.NDArray[Any]] = _same if xp is np else xp.asnumpy
        self._grow = grow
        expected = max(config.capacity_rows or 0, config.initial_rows)
        # an emulated device tier keeps the device's index layout (and so its bytes)
        self.index = HashIndex(expected, xp=xp, kernels=kernels, wide=emulated or None)
        self.alloc = RowAllocator()
        zeros, empty = xp.zeros, xp.empty
        self.row_keys: Int64Array = empty(0, dtype=np.int64)
        self.values: Float32Array = empty((0, dim), dtype=value_dtype)
        self.slots: Float32Array = empty((0, n_slots), dtype=np.float32)
        self.freq = empty(0, dtype=np.uint32)
        self.last_step: Int64Array = empty(0, dtype=np.int64)
        self.version = empty(0, dtype=np.uint64)
        self.flags = empty(0, dtype=np.uint8)
        self.is_live: BoolArray = zeros(0, dtype=bool)
        self.is_pinned: BoolArray = zeros(0, dtype=bool)
        self.is_dirty: BoolArray = zeros(0, dtype=bool)
        self.below: BoolArray = zeros(0, dtype=bool)
        self.below_step: Int64Array = empty(0, dtype=np.int64)
        self._pinned_rows: Int64Array = np.empty(0, dtype=np.int64)
        self.evictions = 0
        self.expired_evictions = 0
        self.frees = 0  # calls that freed rows (row handles stay valid while it holds)
        self._fit(config.initial_rows)

    # -- capabilities ---------------------------------------------------------------------
    @property
    def persistent(self) -> bool:
        return False

    @property
    def device(self) -> str:
        return self._device

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
        for name in COLUMNS:
            setattr(self, name, self._grown(name, getattr(self, name), cap))

    def _grown(self, name: str, col: Any, cap: int) -> Any:
        if self._grow is not None:
            return self._grow(name, col, cap)
        alloc = self.xp.zeros if col.dtype == bool else self.xp.empty
        grown = alloc((cap, *col.shape[1:]), dtype=col.dtype)
        grown[: col.shape[0]] = col
        return grown

    def locate(self, keys: Int64Array, out: Int64Array | None = None) -> Int64Array:
        if self.xp is np:
            return self.index.find(keys, out)
        rows = self._host(self.index.find(self._dev(keys)))
        if out is None:
            return rows
        out[:] = rows
        return out

    def keys_of(self, rows: Int64Array) -> Int64Array:
        return self._host(self.row_keys[self._dev(rows)])

    def last_steps(self, rows: Int64Array) -> Int64Array:
        return self._host(self.last_step[self._dev(rows)])

    def pinned(self, rows: Int64Array) -> BoolArray:
        return self._host(self.is_pinned[self._dev(rows)])

    def insert(
        self,
        keys: Int64Array,
        records: RecordBatch,
        *,
        dirty: bool = True,
        below_step: Int64Array | None = None,
    ) -> Int64Array:
        rows = self.alloc.allocate(keys.shape[0])
        self._fit(self.alloc.high_water)
        r, k = self._dev(rows), self._dev(keys)
        self.index.insert(k, r)
        self.row_keys[r] = k
        self.is_live[r] = True
        self.is_dirty[r] = dirty
        if below_step is not None:  # else below stays False, as _free and a fresh column
            self.below[r] = True  # leave it: a table with no tier below never touches it
            self.below_step[r] = self._dev(below_step)
        self.write(rows, records)
        return rows

    def write(self, rows: Int64Array, records: RecordBatch) -> None:
        r = self._dev(rows)
        self.values[r] = self._dev(records.values)
        self.slots[r] = self._dev(records.slots)
        self.freq[r] = self._dev(records.freq)
        self.last_step[r] = self._dev(records.last_step)
        self.version[r] = self._dev(records.version)
        self.flags[r] = self._dev(records.flags)

    def read(self, rows: Int64Array) -> RecordBatch:
        r = self._dev(rows)
        return RecordBatch(
            values=self._host(self.values[r]),
            slots=self._host(self.slots[r]),
            freq=self._host(self.freq[r]),
            last_step=self._host(self.last_step[r]),
            version=self._host(self.version[r]),
            flags=self._host(self.flags[r]),
        )

    def assign(
        self, rows: Int64Array, values: Float32Array, step: int, version: int, freeze: bool | None
    ) -> None:
        r = self._dev(rows)
        self.values[r] = self._dev(values)
        self.last_step[r] = step
        self.version[r] = version
        self.is_dirty[r] = True
        if freeze is not None:
            self.flags[r] = FROZEN if freeze else 0

    def remove_rows(self, rows: Int64Array) -> None:
        self.index.remove(self.row_keys[self._dev(rows)])
        self._free(rows)

    def _free(self, rows: Int64Array) -> None:
        if rows.shape[0]:
            r = self._dev(rows)
            self.is_live[r] = False
            self.is_pinned[r] = False
            self.is_dirty[r] = False
            self.below[r] = False
            self.alloc.release(rows)
            self.frees += 1

    def live_rows(self) -> Int64Array:
        return self._host(self.xp.flatnonzero(self.is_live[: self.alloc.high_water]))

    # -- reads and the training path ------------------------------------------------------
    def lookup(
        self, keys: Int64Array, min_live_step: int, out: Float32Array, out_rows: Int64Array
    ) -> int:
        if self.xp is np:
            return int(
                self.kernels.probe_gather(
                    self.index.slots, self.values, self.last_step, keys, min_live_step, out,
                    out_rows,
                )
            )  # fmt: skip
        dev_out = self.xp.empty(out.shape, dtype=np.float32)
        dev_rows = self.xp.empty(out_rows.shape, dtype=np.int64)
        missing = self.kernels.probe_gather(
            self.index.slots, self.values, self.last_step, self._dev(keys), min_live_step,
            dev_out, dev_rows,
        )  # fmt: skip
        out[:] = self._host(dev_out)
        out_rows[:] = self._host(dev_rows)
        return int(missing)

    def lookup_bags(
        self,
        keys: Int64Array,
        bags: Bags,
        min_live_step: int,
        defaults: tuple[int, int, float, float],
        out: Float32Array,
    ) -> None:
        kind, seed, a, b = defaults
        dev_out = out if self.xp is np else self.xp.empty(out.shape, dtype=np.float32)
        self.kernels.probe_gather_combine(
            self.index.slots, self.values, self.last_step, self._dev(keys),
            self._dev(bags.bounds), self._dev(bags.weights), min_live_step, bags.combiner,
            bags.max_norm, kind, np.uint64(seed), a, b, dev_out,
        )  # fmt: skip
        if dev_out is not out:
            out[:] = self._host(dev_out)

    def pull_rows(
        self, rows: Int64Array, counts: Int64Array, step: int, version: int, out: Float32Array
    ) -> int:
        dev_out = out if self.xp is np else self.xp.empty(out.shape, dtype=np.float32)
        n = int(
            self.kernels.stamp_gather_pulled(
                self._dev(rows), self._dev(counts), step, version, int(FREQ_MAX), self.freq,
                self.last_step, self.version, self.is_dirty, self.is_pinned, self.values,
                dev_out,
            )
        )  # fmt: skip
        if dev_out is not out:
            out[:] = self._host(dev_out)
        self._note_pulled(rows, n)
        return n

    def apply(
        self,
        rows: Int64Array,
        grads: Float32Array,
        positions: Int64Array,
        bounds: Int64Array,
        optimizer: int,
        hyper: Any,
        step: int,
        version: int,
    ) -> tuple[int, int]:
        r = self._dev(rows)
        dropped, frozen = self.kernels.stamp_pushed(
            r, self.flags, int(FROZEN), step, version, self.last_step, self.version,
            self.is_dirty,
        )  # fmt: skip
        self._update(
            r, self._dev(grads), self._dev(positions), self._dev(bounds), optimizer, hyper, step
        )
        return int(dropped), int(frozen)

    def _update(
        self, rows: Any, grads: Any, positions: Any, bounds: Any, optimizer: int, hyper: Any,
        step: int,
    ) -> None:  # fmt: skip
        """``apply``'s fused update of ``rows`` (the tier's arrays: a device tier's on its
        device); a tier that stores its rows otherwise (half precision) overrides it. ``hyper``
        stays on the host: the gpu kernel takes the optimizer's scalars as arguments."""
        self.kernels.segment_sum_apply(
            grads, positions, bounds, rows, optimizer, hyper, self.values, self.slots
        )

    def live_blocks(
        self, min_live_step: int, block_rows: int
    ) -> Iterator[tuple[Float32Array, Int64Array]]:
        high = self.alloc.high_water
        for start in range(0, high, block_rows):
            end = min(start + block_rows, high)
            live = self.is_live[start:end] & (self.last_step[start:end] >= min_live_step)
            values = self.values[start:end]
            keys = self.row_keys[start:end]
            if bool(live.all()):
                yield self._host(values), self._host(keys)
            elif bool(live.any()):
                # Scoring a partly empty block whole and dropping the dead rows' scores after
                # would read the dead rows too; gathering the live ones reads each row once.
                rows = self.xp.flatnonzero(live)
                yield self._host(values[rows]), self._host(keys[rows])

    def doomed(self, min_live_step: int, l2_threshold: float | None) -> tuple[Int64Array, int]:
        live = self.live_rows()
        r = self._dev(live)
        expired = self.last_step[r] < min_live_step
        drop = expired.copy()
        if l2_threshold is not None:
            keep = ~expired
            drop[keep] = self.xp.linalg.norm(self.values[r[keep]], axis=1) < l2_threshold
            drop |= expired
        return live[self._host(drop)], int(self.xp.count_nonzero(expired))

    # -- the batch in flight and eviction -------------------------------------------------
    def pin(self, rows: Int64Array) -> None:
        self.is_pinned[self._dev(rows)] = True
        self._pinned_rows = np.concatenate([self._pinned_rows, rows])

    def _note_pulled(self, rows: Int64Array, n: int) -> None:
        """Remember the rows a pull stamped and pinned (all of them when n says every row was
        found; else the found ones, rows >= 0), for ``unpin_all``."""
        pinned = rows if n == rows.shape[0] else rows[rows >= 0]
        self._pinned_rows = np.concatenate([self._pinned_rows, pinned])

    def unpin_all(self) -> None:
        self.kernels.clear_flags(self.is_pinned, self._dev(self._pinned_rows))
        self._pinned_rows = np.empty(0, dtype=np.int64)

    def n_pinned(self, min_live_step: int) -> int:
        rows = self._dev(np.unique(self._pinned_rows))
        rows = rows[self.is_pinned[rows]]
        return int(self.xp.count_nonzero(self.last_step[rows] >= min_live_step))

    def choose_victims(
        self, step: int, min_live_step: int, protect: Int64Array | None = None
    ) -> tuple[Int64Array, BoolArray]:
        """Exact, not sampled: every candidate is scored in one kernel pass over the columns
        (``victim_candidates``) and ``argpartition`` picks the lowest. At 535,000 rows (60,000
        victims) that takes 3.0 ms on the CPU, where numpy's masks took 4.9; with
        ``evict_fraction`` 0.05 it runs once per 25,000 rows created."""
        cap = self.capacity_rows
        if cap is None or len(self) <= cap:
            return np.empty(0, dtype=np.int64), np.zeros(0, dtype=bool)
        target = int(cap * (1.0 - self.config.evict_fraction))
        high = self.alloc.high_water
        rows, scores, expired, protected = self._victim_scratch(high)
        protected = protected[:high]
        protected[:] = False
        if protect is not None:
            protected[self._dev(protect)] = True
        m = int(
            self.kernels.victim_candidates(
                self.is_live[:high], self.is_pinned[:high], protected, self.freq[:high],
                self.last_step[:high], step, self.config.half_life_steps, min_live_step,
                self.config.eviction == "lfu", rows, scores, expired,
            )
        )  # fmt: skip
        n = min(len(self) - target, m)
        if n >= m:
            return self._host(rows[:m]).copy(), self._host(expired[:m]).copy()
        victims = self.xp.argpartition(scores[:m], n - 1)[:n]  # n >= 1: len > cap > target
        return self._host(rows[victims]), self._host(expired[victims])

    def _victim_scratch(self, n: int) -> tuple[Int64Array, np.ndarray, BoolArray, BoolArray]:
        """Reused arrays of ``victim_candidates`` (its outputs and the protected mask, at
        least n long): fresh ones would cost a page fault per 4 KiB on every eviction."""
        scratch = self._evict_scratch
        if scratch is None or scratch[0].shape[0] < n:
            size = max(n, n + n // 4)
            empty = self.xp.empty
            scratch = (
                empty(size, dtype=np.int64),
                empty(size, dtype=np.float64),
                empty(size, dtype=bool),
                empty(size, dtype=bool),
            )
            self._evict_scratch = scratch
        return scratch

    def count_evictions(self, expired: BoolArray) -> None:
        n_expired = int(np.count_nonzero(expired))
        self.expired_evictions += n_expired
        self.evictions += expired.shape[0] - n_expired

    def eviction_counts(self) -> tuple[int, int]:
        return self.evictions, self.expired_evictions

    def load_eviction_counts(self, counts: tuple[int, int]) -> None:
        self.evictions, self.expired_evictions = (int(c) for c in counts)

    # -- the chain's bookkeeping ----------------------------------------------------------
    def dirty_rows(self) -> Int64Array:
        high = self.alloc.high_water
        return self._host(self.xp.flatnonzero(self.is_dirty[:high] & self.is_live[:high]))

    def dirty(self, rows: Int64Array) -> BoolArray:
        return self._host(self.is_dirty[self._dev(rows)])

    def mark_dirty(self, rows: Int64Array) -> None:
        self.is_dirty[self._dev(rows)] = True

    def copies_below(self, rows: Int64Array) -> tuple[BoolArray, Int64Array]:
        r = self._dev(rows)
        return self._host(self.below[r]), self._host(self.below_step[r])

    def mark_written(self, rows: Int64Array, last_step: Int64Array) -> None:
        r = self._dev(rows)
        self.is_dirty[r] = False
        self.below[r] = True
        self.below_step[r] = self._dev(last_step)

    def live_count(self, min_live_step: int) -> int:
        high = self.alloc.high_water
        live = self.is_live[:high] & (self.last_step[:high] >= min_live_step)
        return int(self.xp.count_nonzero(live))

    def shadowed_count(self, min_live_step: int | None = None) -> int:
        high = self.alloc.high_water
        shadowed = self.is_live[:high] & self.below[:high]
        if min_live_step is not None:
            shadowed &= self.below_step[:high] >= min_live_step
        return int(self.xp.count_nonzero(shadowed))

    @property
    def index_moving(self) -> bool:
        return self.index.moving

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
        rows = self._host(self.index.remove(self._dev(keys)))
        found = rows >= 0
        self._free(rows[found])
        return found

    def scan(self, chunk_rows: int) -> Iterator[tuple[Int64Array, RecordBatch]]:
        """Every live row once, a chunk at a time. A caller may remove rows between chunks
        (``compact`` does): a row freed meanwhile, or reused by another key, is skipped."""
        live = self.live_rows()
        keys = self.keys_of(live)  # each row's key when the scan began
        for start in range(0, live.shape[0], chunk_rows):
            rows = live[start : start + chunk_rows]
            r = self._dev(rows)
            same = self._host(
                self.is_live[r] & (self.row_keys[r] == self._dev(keys[start : start + chunk_rows]))
            )
            if not same.all():
                rows = rows[same]
            if rows.shape[0]:
                yield self.keys_of(rows), self.read(rows)

    def stats(self) -> dict[str, Any]:
        high = self.alloc.high_water
        slab = sum(getattr(self, c)[:high].nbytes for c in COLUMNS)
        # per row: None while the tier holds no row (its index bytes are not a row's cost)
        per_row = 1 / len(self) if len(self) else None
        values, slots = self.values[:high].nbytes, self.slots[:high].nbytes
        keys = self.row_keys[:high].nbytes  # row -> key: the index's other half
        pinned = self._dev(np.unique(self._pinned_rows))
        return {
            "rows": len(self),
            "dirty_rows": int(self.xp.count_nonzero(self.is_dirty[:high])),
            "capacity": self.capacity_rows,
            "evictions": self.evictions,
            "expired_evictions": self.expired_evictions,
            "pinned": int(self.xp.count_nonzero(self.is_pinned[pinned])),
            "bytes": int(slab + self.index.nbytes),
            "index_bytes": self.index.nbytes,
            "bytes_per_row": None if per_row is None else (slab + self.index.nbytes) * per_row,
            # what a row costs, by part (rows allocated over rows live: a freed row's storage
            # counts until it is reused)
            "bytes_per_row_by_component": None
            if per_row is None
            else {
                "values": values * per_row,
                "slots": slots * per_row,
                "metadata": (slab - values - slots - keys) * per_row,
                "index": (self.index.nbytes + keys) * per_row,
            },
            "dtype": "float32",  # how values are stored (LowpColumnCache: bfloat16, float16)
            "device": self.device,
        } | ({} if self._emulated is None else {"emulated": self._emulated})
