"""The tier chain: a cache tier over a backing tier, write-back and inclusive.

DESIGN.md's "Tiers" rules, kept here and nowhere else:

- the topmost copy of a key is the truth; a clean cached copy equals the copy below it;
- a dirty victim is written into the tier below, a clean victim is dropped;
- ``flush`` writes every dirty row down;
- a row removed for good (deleted, expired, under the L2 threshold, or evicted from a table
  that does not spill) is removed from every tier, so no stale copy can come back.

The cache keeps two bits of bookkeeping per row (``is_dirty``, ``below``) and the ``last_step``
of the copy below (``below_step``); ``StepCounts`` counts the backing tier's rows by
``last_step``. Together they make ``live_rows`` exact with a TTL and without a scan. The chain
talks to the backing tier only through the ``Tier`` interface, so a chain can itself be the
backing of another cache (HBM over DRAM over RocksDB).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from evdb._types import BoolArray, Int64Array
from evdb.records import RecordBatch
from evdb.tiers.base import Tier
from evdb.tiers.dram import DramTier

__all__ = ["StepCounts", "TierChain"]

_FLUSH_CHUNK = 65536


class StepCounts:
    """How many rows of a tier have each ``last_step``, to count live rows without a scan.

    Without a TTL every row is live and one total suffices. With one, rows whose step fell
    below the live floor stay expired for good (the floor only rises), so they are merged into
    one bucket: the map never holds more than ``ttl_steps + 2`` entries.
    """

    def __init__(self, track_steps: bool) -> None:
        self.track_steps = track_steps
        self.counts: dict[int, int] = {}
        self.floor = -(2**63)

    def _buckets(self, steps: Int64Array) -> tuple[Int64Array, Int64Array]:
        if not self.track_steps:
            return np.zeros(1, dtype=np.int64), np.array([steps.shape[0]], dtype=np.int64)
        below = steps < self.floor
        if below.any():
            steps = np.where(below, self.floor - 1, steps)
        return np.unique(steps, return_counts=True)

    def add(self, steps: Int64Array, sign: int = 1) -> None:
        if steps.shape[0] == 0:
            return
        for step, n in zip(*self._buckets(steps), strict=True):  # distinct steps: a few
            total = self.counts.get(int(step), 0) + sign * int(n)
            if total:
                self.counts[int(step)] = total
            else:
                del self.counts[int(step)]

    def sub(self, steps: Int64Array) -> None:
        self.add(steps, -1)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def live(self, min_live: int) -> int:
        """Rows with last_step >= min_live (min_live never decreases between calls)."""
        if not self.track_steps:
            return self.total
        if min_live > self.floor:
            self.floor = min_live
            old = [s for s in self.counts if s < min_live]
            merged = sum(self.counts.pop(s) for s in old)
            if merged:
                self.counts[min_live - 1] = merged
        return sum(n for s, n in self.counts.items() if s >= min_live)

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {
            "steps": np.array(list(self.counts), dtype=np.int64),
            "counts": np.array(list(self.counts.values()), dtype=np.int64),
            "floor": np.array([self.floor], dtype=np.int64),
        }

    def load_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        self.counts = dict(zip(arrays["steps"].tolist(), arrays["counts"].tolist(), strict=True))
        self.floor = int(arrays["floor"][0])


class TierChain:
    """A ``DramTier`` cache over an optional backing tier.

    ``spill=True``: the backing tier holds what the cache has no room for, and misses are
    read from it. ``spill=False``: the cache holds every row and the backing tier is only
    where they persist (written at ``flush``); a full cache drops its victims for good.
    """

    def __init__(
        self, cache: DramTier, backing: Tier | None, *, spill: bool, track_steps: bool
    ) -> None:
        self.cache = cache
        self.backing = backing
        self.spill = spill and backing is not None
        self.below_steps = StepCounts(track_steps)
        self.counters = {
            "hits": 0,
            "misses": 0,
            "promotions": 0,
            "written_back": 0,
            "flushed": 0,
        }

    # -- reads ----------------------------------------------------------------------------
    @property
    def has_rows_below(self) -> bool:
        """Whether a cache miss can find a row below (false until something spills)."""
        return self.spill and self.backing is not None and len(self.backing) > 0

    def fetch(self, keys: Int64Array) -> tuple[BoolArray, RecordBatch | None]:
        """Rows of keys the cache does not hold, read from below in one batch."""
        if not self.has_rows_below:
            return np.zeros(keys.shape[0], dtype=bool), None
        assert self.backing is not None
        return self.backing.get(keys)

    def count_cache_reads(self, hits: int, misses: int) -> None:
        self.counters["hits"] += hits
        self.counters["misses"] += misses

    # -- rows entering the cache ----------------------------------------------------------
    def promote(self, keys: Int64Array, records: RecordBatch, *, dirty: bool) -> Int64Array:
        """Cache rows read from below (``dirty``: the caller changes them at once)."""
        self.counters["promotions"] += keys.shape[0]
        return self.cache.insert(keys, records, dirty=dirty, below_step=records.last_step)

    def create(self, keys: Int64Array, records: RecordBatch) -> Int64Array:
        """Cache new rows (nothing below has them)."""
        return self.cache.insert(keys, records)

    # -- removal for good -----------------------------------------------------------------
    def remove_rows(self, rows: Int64Array) -> None:
        """Remove cached rows (distinct, live) and their copies below."""
        below = rows[self.cache.below[rows]]
        if below.shape[0]:
            self._remove_below(self.cache.row_keys[below], self.cache.below_step[below])
        self.cache.remove_rows(rows)

    def remove_fetched(self, keys: Int64Array, last_step: Int64Array) -> None:
        """Remove rows that ``fetch`` found below (not cached) and the caller drops."""
        self._remove_below(keys, last_step)

    def remove_uncached(self, keys: Int64Array) -> tuple[BoolArray, RecordBatch | None]:
        """Remove keys the cache does not hold from below; returns what was there."""
        found, records = self.fetch(keys)
        if records is not None and len(records):
            self._remove_below(keys[found], records.last_step)
        return found, records

    def _remove_below(self, keys: Int64Array, below_step: Int64Array) -> None:
        assert self.backing is not None
        self.backing.remove(keys, present=np.ones(keys.shape[0], dtype=bool))
        self.below_steps.sub(below_step)

    # -- rows leaving the cache -----------------------------------------------------------
    def evict(self, step: int, min_live: int, protect: Int64Array | None = None) -> None:
        """Bring the cache back to capacity: dirty live victims are written down (when the
        chain spills), clean ones dropped; the rest leave every tier."""
        rows, expired = self.cache.choose_victims(step, min_live, protect)
        if rows.shape[0] == 0:
            return
        if self.spill:
            live = ~expired
            down = rows[live & self.cache.is_dirty[rows]]
            self._write_down(down)
            self.counters["written_back"] += int(down.shape[0])
            self.cache.remove_rows(rows[live])  # the copies below now hold the truth
            self.remove_rows(rows[expired])  # expired for good: gone from every tier
        else:
            self.remove_rows(rows)
        self.cache.count_evictions(expired)

    def _write_down(self, rows: Int64Array) -> None:
        """Write cached rows into the tier below and mark them clean there."""
        if rows.shape[0] == 0 or self.backing is None:
            return
        cache = self.cache
        below = cache.below[rows]
        records = cache.read(rows)
        self.backing.put(cache.row_keys[rows], records, existed=below)
        self.below_steps.sub(cache.below_step[rows[below]])
        self.below_steps.add(records.last_step)
        cache.is_dirty[rows] = False
        cache.below[rows] = True
        cache.below_step[rows] = records.last_step

    def flush(self) -> int:
        """Write every dirty cached row down; returns how many."""
        if self.backing is None:
            return 0
        cache = self.cache
        high = cache.alloc.high_water
        rows = np.flatnonzero(cache.is_dirty[:high] & cache.is_live[:high])
        for start in range(0, rows.shape[0], _FLUSH_CHUNK):
            self._write_down(rows[start : start + _FLUSH_CHUNK])
        self.counters["flushed"] += rows.shape[0]
        return int(rows.shape[0])

    # -- counting and scanning ------------------------------------------------------------
    def live_rows(self, min_live: int) -> int:
        """Live rows across tiers, each key once: cached rows, plus rows below, less the
        rows below that the cache also holds."""
        cache = self.cache
        high = cache.alloc.high_water
        live = cache.is_live[:high]
        cached = int(np.count_nonzero(live & (cache.last_step[:high] >= min_live)))
        shadowed = int(
            np.count_nonzero(live & cache.below[:high] & (cache.below_step[:high] >= min_live))
        )
        return cached + self.below_steps.live(min_live) - shadowed

    def scan(self, chunk_rows: int) -> Iterator[tuple[Int64Array, RecordBatch]]:
        """Every row once (expired ones included): the cached copies, then the rows below
        that the cache does not hold."""
        yield from self.cache.scan(chunk_rows)
        if not self.has_rows_below:
            return
        high = self.cache.alloc.high_water
        shadowed = int(np.count_nonzero(self.cache.is_live[:high] & self.cache.below[:high]))
        if self.backing is not None and shadowed == len(self.backing):
            return  # every row below is cached (say, after a flush): nothing left to read
        assert self.backing is not None
        for keys, records in self.backing.scan(chunk_rows):
            uncached = self.cache.locate(keys) < 0
            if uncached.all():
                yield keys, records
            elif uncached.any():
                yield keys[uncached], records.take(uncached)

    def stats(self) -> dict[str, dict[str, Any]]:
        c = self.counters
        dram = self.cache.stats()
        dram.update(
            hits=c["hits"],
            misses=c["misses"],
            promotions=c["promotions"],
            written_back=c["written_back"] + c["flushed"],
        )
        tiers = {"dram": dram}
        if self.backing is not None:
            below = self.backing.stats()
            below.update(dirty_rows=0, promotions=0, written_back=0)
            tiers[self.backing.name] = below
        return tiers
