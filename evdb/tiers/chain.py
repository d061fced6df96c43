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
backing of another cache: ``ChainTier`` wraps a chain as a ``Tier``, and ``stack`` builds
HBM over DRAM over RocksDB as ``TierChain(hbm, ChainTier(TierChain(dram, rocks)))``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from evdb._types import BoolArray, Int64Array
from evdb.errors import ConfigError
from evdb.records import FIELDS, RecordBatch
from evdb.tiers.base import CacheTier, Tier
from evdb.tiers.step_counts import StepCounts

__all__ = ["READ_OPS", "ChainTier", "StepCounts", "TierChain", "stack"]

READ_OPS = ("pull", "lookup")  # the reads whose keys each level counts
_READ_COUNTS = ("hits", "misses", "below", "not_found")

_FLUSH_CHUNK = 65536


class TierChain:
    """A cache tier (the ``CacheTier`` role: DRAM, HBM) over an optional backing tier (a
    single tier, or a ``ChainTier``).

    ``spill=True``: the backing tier holds what the cache has no room for, and misses are
    read from it. ``spill=False``: the cache holds every row and the backing tier is only
    where they persist (written at ``flush``); a full cache drops its victims for good.
    """

    def __init__(
        self, cache: CacheTier, backing: Tier | None, *, spill: bool, track_steps: bool
    ) -> None:
        self.cache = cache
        self.backing = backing
        self.spill = spill and backing is not None
        self.below_steps = StepCounts(track_steps)
        # Told the keys of rows removed for good (a table's change log, for publications);
        # only the top chain has one, so a row removed through a chain below counts once.
        self.on_remove: Callable[[Int64Array], None] | None = None
        self.counters = {
            "promotions": 0,
            "written_back": 0,
            "flushed": 0,
        }
        # Keys asked of each level, by operation: hits and misses of the cache; keys found in
        # the backing tier ("below") and found nowhere ("not_found", at the bottom chain).
        self.reads = {op: {"hits": 0, "misses": 0, "below": 0, "not_found": 0} for op in READ_OPS}

    # -- reads ----------------------------------------------------------------------------
    @property
    def has_rows_below(self) -> bool:
        """Whether a cache miss can find a row below (false until something spills)."""
        return self.spill and self.backing is not None and not self.backing.is_empty()

    def fetch(
        self, keys: Int64Array, op: str | None = None
    ) -> tuple[BoolArray, RecordBatch | None]:
        """Rows of keys the cache does not hold, read from below in one batch, counted as
        ``op``'s reads ("pull" or "lookup"; None counts nothing)."""
        if not self.has_rows_below:
            self.count_not_found(keys.shape[0], op)
            return np.zeros(keys.shape[0], dtype=bool), None
        if isinstance(self.backing, ChainTier):
            return self.backing.get_for(keys, op)
        assert self.backing is not None
        found, records = self.backing.get(keys)
        if op is not None:
            n_found = int(np.count_nonzero(found))
            self.reads[op]["below"] += n_found
            self.reads[op]["not_found"] += keys.shape[0] - n_found
        return found, records

    def count_not_found(self, n: int, op: str | None) -> None:
        """Count keys of ``op`` that no level holds (nothing below to ask)."""
        if op is None:
            return
        if isinstance(self.backing, ChainTier):
            self.backing.chain.count_cache_reads(0, n, op)
            self.backing.chain.count_not_found(n, op)
        else:
            self.reads[op]["not_found"] += n

    def prefetch(self, keys: Int64Array) -> None:
        """Read ahead, below, the rows of keys (repeats allowed) that the cache lacks."""
        if not self.has_rows_below:
            return
        assert self.backing is not None
        self.backing.prefetch(keys[self.cache.locate(keys) < 0])

    def resident(self, keys: Int64Array, level: str) -> BoolArray:
        """Whether each key's row is held by the level named ``level`` (a cache's name, or the
        backing tier's), whatever else holds a copy."""
        if level == self.cache.name:
            return self.cache.locate(keys) >= 0
        if isinstance(self.backing, ChainTier):
            return self.backing.chain.resident(keys, level)
        if self.backing is not None and self.backing.name == level:
            return self.backing.get(keys)[0]
        raise ConfigError(f"tier: no level named {level!r} in this chain")

    def count_cache_reads(self, hits: int, misses: int, op: str = "pull") -> None:
        """Count keys ``op`` found (hits) and did not find (misses) in the cache."""
        counts = self.reads[op]
        counts["hits"] += hits
        counts["misses"] += misses

    def read_counts(self) -> dict[str, dict[str, int]]:
        """Per operation ("pull", "lookup"), the keys each level answered: a cache level's
        hits by its name, the backing tier's finds by its name, and ``not_found``: the keys no
        level held (new keys of a pull, defaults of a lookup)."""
        out: dict[str, dict[str, int]] = {}
        for op in READ_OPS:
            levels = {self.cache.name: self.reads[op]["hits"]}
            if isinstance(self.backing, ChainTier):
                levels.update(self.backing.chain.read_counts()[op])
            else:
                if self.backing is not None:
                    levels[self.backing.name] = self.reads[op]["below"]
                levels["not_found"] = self.reads[op]["not_found"]
            out[op] = levels
        return out

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
        if self.on_remove is not None:
            self.on_remove(self.cache.keys_of(rows))
        has_copy, copy_step = self.cache.copies_below(rows)
        if has_copy.any():
            self._remove_below(self.cache.keys_of(rows[has_copy]), copy_step[has_copy])
        self.cache.remove_rows(rows)

    def remove_fetched(self, keys: Int64Array, last_step: Int64Array) -> None:
        """Remove rows that ``fetch`` found below (not cached) and the caller drops."""
        if self.on_remove is not None:
            self.on_remove(keys)
        self._remove_below(keys, last_step)

    def remove_uncached(self, keys: Int64Array) -> tuple[BoolArray, RecordBatch | None]:
        """Remove keys the cache does not hold from below; returns what was there."""
        found, records = self.fetch(keys)
        if records is not None and len(records):
            if self.on_remove is not None:
                self.on_remove(keys[found])
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
        self.below_steps.raise_floor(min_live)  # the writers' clock: expired counts merge
        rows, expired = self.cache.choose_victims(step, min_live, protect)
        if rows.shape[0] == 0:
            return
        if self.spill:
            live = ~expired
            down = rows[live & self.cache.dirty(rows)]
            self._write_down(self._in_key_order(down))
            self.counters["written_back"] += int(down.shape[0])
            self.cache.remove_rows(rows[live])  # the copies below now hold the truth
            self.remove_rows(rows[expired])  # expired for good: gone from every tier
        else:
            self.remove_rows(rows)
        self.cache.count_evictions(expired)

    def _in_key_order(self, rows: Int64Array) -> Int64Array:
        """Cached rows sorted by key, the order ``_write_down`` wants (RocksDB's key order
        too: encode_keys keeps it). RocksDB's memtable inserts a sorted batch along the splice
        of its last insert instead of searching the skip list from the top for each row:
        35,000 victims (532-byte records), Rdict.write 31 -> 11 ms for a 1.5 ms argsort."""
        return rows[np.argsort(self.cache.keys_of(rows), kind="stable")]

    def _write_down(self, rows: Int64Array) -> None:
        """Write cached rows, in key order (``_in_key_order``), into the tier below and mark
        them clean there."""
        if rows.shape[0] == 0 or self.backing is None:
            return
        cache = self.cache
        below, below_step = cache.copies_below(rows)
        records = cache.read(rows)
        self.backing.put(cache.keys_of(rows), records, existed=below)
        self.below_steps.sub(below_step[below])
        self.below_steps.add(records.last_step)
        cache.mark_written(rows, records.last_step)

    def flush(self) -> int:
        """Write every dirty cached row down; returns how many."""
        if self.backing is None:
            return 0
        rows = self.cache.dirty_rows()
        # One key order across the chunks as well (each chunk lands after the one before in
        # the memtable): 1M dirty rows flushed in 5.8 -> 1.2-1.3 s, the raw baseline of
        # unsorted write batches 1.6-1.8 s (bench_tiers section 3).
        rows = self._in_key_order(rows)
        for start in range(0, rows.shape[0], _FLUSH_CHUNK):
            self._write_down(rows[start : start + _FLUSH_CHUNK])
        self.counters["flushed"] += rows.shape[0]
        self.backing.flush()  # a chain below writes its own dirty rows on down
        return int(rows.shape[0])

    # -- counting and scanning ------------------------------------------------------------
    def live_rows(self, min_live: int) -> int:
        """Live rows across tiers, each key once: cached rows, plus rows below, less the
        rows below that the cache also holds."""
        cache = self.cache
        return (
            cache.live_count(min_live)
            + self.below_steps.live(min_live)
            - cache.shadowed_count(min_live)
        )

    def stored_rows(self) -> int:
        """Rows stored, each key once, expired ones included (what ``scan`` yields)."""
        n = len(self.cache)
        if self.has_rows_below:
            assert self.backing is not None
            n += len(self.backing) - self.cache.shadowed_count()
        return n

    def scan(self, chunk_rows: int) -> Iterator[tuple[Int64Array, RecordBatch]]:
        """Every row once (expired ones included): the cached copies, then the rows below
        that the cache does not hold."""
        yield from self.cache.scan(chunk_rows)
        yield from self.scan_below(chunk_rows)

    def scan_below(self, chunk_rows: int) -> Iterator[tuple[Int64Array, RecordBatch]]:
        """The second half of ``scan``: every row below that the cache does not hold (a
        caller that reads the cache's own arrays in place, as ``Table.neighbors`` does, then
        reads the rest from here)."""
        if not self.has_rows_below:
            return
        if self.backing is not None and self.cache.shadowed_count() == len(self.backing):
            return  # every row below is cached (say, after a flush): nothing left to read
        assert self.backing is not None
        for keys, records in self.backing.scan(chunk_rows):
            uncached = self.cache.locate(keys) < 0
            if uncached.all():
                yield keys, records
            elif uncached.any():
                yield keys[uncached], records.take(uncached)

    def stats(self) -> dict[str, dict[str, Any]]:
        """Each level's stats, top first ("hbm", "dram", "rocksdb", as present)."""
        c = self.counters
        top = self.cache.stats()
        top.update(
            hits=sum(self.reads[op]["hits"] for op in READ_OPS),
            misses=sum(self.reads[op]["misses"] for op in READ_OPS),
            promotions=c["promotions"],
            written_back=c["written_back"] + c["flushed"],
        )
        for op in READ_OPS:
            top[f"{op}_hits"] = self.reads[op]["hits"]
            top[f"{op}_misses"] = self.reads[op]["misses"]
        tiers = {self.cache.name: top}
        if self.backing is not None:
            for name, level in self.backing.levels().items():
                for key in ("dirty_rows", "promotions", "written_back"):
                    level.setdefault(key, 0)  # a tier that caches nothing
                tiers[name] = level
        return tiers

    # -- persistence ----------------------------------------------------------------------
    def to_arrays(self) -> dict[str, np.ndarray]:
        """What the chain keeps in memory about the rows below (their step counts, the backing
        tier's own state), for the database's metadata; taken after a flush."""
        arrays = {f"below_steps.{k}": v for k, v in self.below_steps.to_arrays().items()}
        arrays["reads"] = np.array(  # the read counts (op x hits, misses, below, not_found)
            [[self.reads[op][c] for c in _READ_COUNTS] for op in READ_OPS], dtype=np.int64
        )
        if self.backing is not None:
            arrays.update({f"backing.{k}": v for k, v in self.backing.to_arrays().items()})
        return arrays

    def load_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        """Restore what ``to_arrays`` returned (the backing tier already holds the rows)."""
        self.below_steps.load_arrays(_prefixed(arrays, "below_steps."))
        if "reads" in arrays:  # saved since the counts were kept (older saves start at 0)
            for op, row in zip(READ_OPS, arrays["reads"].tolist(), strict=True):
                self.reads[op] = dict(zip(_READ_COUNTS, (int(x) for x in row), strict=True))
        if self.backing is None:
            return
        self.backing.load_arrays(_prefixed(arrays, "backing."))
        if not self.spill:  # every row lives in the cache: load them all, clean
            for keys, records in self.backing.scan(_FLUSH_CHUNK):
                self.cache.insert(keys, records, dirty=False, below_step=records.last_step)


# A chain under another cache evicts as if no row had expired: it keeps every row it was given
# until the cache above removes it, so the cache above may trust its own bits (``below``,
# ``below_step``) and step counts about what is below. Reclaiming expired victims here, as the
# top chain does, would leave the cache above counting (and trusting) copies that are gone.
# Expired rows leave from the top (the table's TTL checks, ``compact``); down here they are
# victims by score like any row (an old row scores low by LFU and LRU alike).
_NO_EXPIRY = -(2**63)


class ChainTier(Tier):
    """A ``TierChain`` as one ``Tier``: the backing of the cache above it.

    On a hit in the chain's cache, ``get`` reads it there; on a miss, from the tier below (read
    through, not cached: the cache above takes the row). ``put`` writes into the cache, dirty,
    and evicts it back to capacity (dirty victims written down); ``remove`` removes from every
    level; ``scan`` yields every row once; ``flush`` flushes the chain. Rows stay until removed
    (``len`` counts expired rows too, as the ``Tier`` contract says).

    The chain counts the rows below it without their steps (``track_steps=False``): nothing
    asks it for live rows, the chain on top counts those. ``step`` is the clock the cache's
    victim scores age by.

    Example: HBM (2 rows) over DRAM (3 rows) over RocksDB::

        TierChain(hbm, ChainTier(TierChain(dram, rocks, spill=True), step))
        pull [1 2 3]: 1, 2, 3 pinned in HBM (over-committed until the push)
        push:         HBM back to capacity: dirty victims -> ChainTier.put -> DRAM
        DRAM full:    its dirty victims -> RocksDB; a later miss in HBM reads DRAM, then disk
    """

    name = "chain"

    def __init__(self, chain: TierChain, step: Callable[[], int]) -> None:
        if chain.below_steps.track_steps:
            raise ConfigError("a chain under another cache counts its rows without steps")
        if not chain.spill and chain.cache.capacity_rows is not None:
            raise ConfigError(
                "a bounded cache that does not spill drops rows for good, and would drop rows "
                "the cache above holds: give it a backing tier to spill to, or no bound"
            )
        self.chain = chain
        self.step = step

    # -- capabilities ---------------------------------------------------------------------
    @property
    def persistent(self) -> bool:
        return self.chain.backing is not None and self.chain.backing.persistent

    @property
    def device(self) -> str:
        return self.chain.cache.device

    @property
    def capacity_rows(self) -> int | None:
        return None if self.chain.spill else self.chain.cache.capacity_rows

    def __len__(self) -> int:
        """Cached rows plus the rows below that the cache does not hold (a pass over the
        cache's bits; ``is_empty`` is O(1))."""
        cache, below = self.chain.cache, self.chain.backing
        if below is None or below.is_empty():
            return len(cache)
        return len(cache) + len(below) - cache.shadowed_count()

    def is_empty(self) -> bool:
        # Without spilling, every row below is also cached: an empty cache means no rows.
        return len(self.chain.cache) == 0 and not self.chain.has_rows_below

    # -- Tier contract --------------------------------------------------------------------
    def get(self, keys: Int64Array) -> tuple[BoolArray, RecordBatch]:
        return self.get_for(keys, None)

    def get_for(self, keys: Int64Array, op: str | None) -> tuple[BoolArray, RecordBatch]:
        """``get``, counting the reads as ``op``'s (the chain above says whose miss it is;
        None counts nothing)."""
        cache = self.chain.cache
        rows = cache.locate(keys)
        found = rows >= 0
        hits = int(np.count_nonzero(found))
        if op is not None:
            self.chain.count_cache_reads(hits, keys.shape[0] - hits, op)
        cached = cache.read(rows[found])
        if hits == keys.shape[0]:
            return found, cached
        miss = np.flatnonzero(~found)
        hit, below = self.chain.fetch(keys[miss], op)
        if below is None or len(below) == 0:
            return found, cached
        at = np.concatenate([np.flatnonzero(found), miss[hit]])
        found[miss[hit]] = True
        order = np.argsort(at, kind="stable")  # back to the order of keys
        merged = (np.concatenate([getattr(cached, f), getattr(below, f)])[order] for f in FIELDS)
        return found, RecordBatch(*merged)

    def put(self, keys: Int64Array, records: RecordBatch, existed: BoolArray | None = None) -> None:
        """Write distinct keys' records into the cache, dirty; ``existed`` (which keys this
        tier holds) tells, for a key not cached, whether the tier below holds a copy."""
        if keys.shape[0] == 0:
            return
        chain, cache = self.chain, self.chain.cache
        rows = cache.locate(keys)
        have = rows >= 0
        if have.all():
            cache.write(rows, records)
            cache.mark_dirty(rows)
        else:
            if have.any():
                cache.write(rows[have], records.take(have))
                cache.mark_dirty(rows[have])
            new = np.flatnonzero(~have)
            if not chain.has_rows_below:
                below = np.zeros(new.shape[0], dtype=bool)
            elif existed is not None:
                below = existed[new]
            else:
                below = chain.fetch(keys[new])[0]
            for copy_below in (True, False):
                pick = new[below == copy_below]
                if pick.shape[0]:
                    recs = records.take(pick)
                    # The copy below is counted without its step (see the class docstring).
                    cache.insert(
                        keys[pick], recs, below_step=recs.last_step if copy_below else None
                    )
        chain.evict(self.step(), _NO_EXPIRY)

    def remove(self, keys: Int64Array, present: BoolArray | None = None) -> BoolArray:
        chain = self.chain
        rows = chain.cache.locate(keys)
        gone = rows >= 0
        chain.remove_rows(rows[gone])  # the cached rows and their copies below
        rest = np.flatnonzero(~gone)
        if rest.shape[0] and chain.has_rows_below:
            assert chain.backing is not None
            below = chain.backing.remove(keys[rest], None if present is None else present[rest])
            gone[rest] = below
            chain.below_steps.sub(np.zeros(int(np.count_nonzero(below)), dtype=np.int64))
        return gone

    def prefetch(self, keys: Int64Array) -> None:
        self.chain.prefetch(keys)

    def scan(self, chunk_rows: int) -> Iterator[tuple[Int64Array, RecordBatch]]:
        """Every row once (the chain's scan). A caller may remove rows of a chunk before
        asking for the next (``compact`` does)."""
        yield from self.chain.scan(chunk_rows)

    def flush(self) -> None:
        self.chain.flush()

    def stats(self) -> dict[str, Any]:
        levels = self.levels()
        return {
            "rows": len(self),
            "capacity": self.capacity_rows,
            "bytes": sum(int(level["bytes"]) for level in levels.values()),
            "evictions": self.chain.cache.eviction_counts()[0],
        }

    def levels(self) -> dict[str, dict[str, Any]]:
        return self.chain.stats()

    def to_arrays(self) -> dict[str, Any]:
        evictions = np.array(self.chain.cache.eviction_counts(), dtype=np.int64)
        return {**self.chain.to_arrays(), "evictions": evictions}

    def load_arrays(self, arrays: dict[str, Any]) -> None:
        self.chain.load_arrays(arrays)
        if "evictions" in arrays:
            self.chain.cache.load_eviction_counts(tuple(arrays["evictions"].tolist()))


def stack(
    caches: Sequence[CacheTier],
    backing: Tier | None,
    *,
    spill: bool,
    track_steps: bool,
    step: Callable[[], int],
) -> TierChain:
    """The chain of ``caches`` (top first) over ``backing``: each cache over a ``ChainTier``
    of the ones below it. ``spill`` is the bottom cache's (whether ``backing`` takes what it
    has no room for); every cache above it spills into the chain below. ``track_steps``: the
    rows carry a TTL (only the top chain counts live rows)."""
    chain = TierChain(
        caches[-1], backing, spill=spill, track_steps=track_steps and len(caches) == 1
    )
    for depth in range(len(caches) - 2, -1, -1):
        chain = TierChain(
            caches[depth],
            ChainTier(chain, step),
            spill=True,
            track_steps=track_steps and depth == 0,
        )
    return chain


def _prefixed(arrays: dict[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    return {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}
