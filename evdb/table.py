"""``Table``: the facade over a table's tiers, and the only place that knows a whole row.

It validates input before anything changes, deduplicates keys, applies admission and TTL,
stamps ``freq``/``last_step``/``version``, and runs the optimizer; the tier below only stores
records. See the README's operations table for what each call does on a hit and on a miss.

The training path (``pull``, ``push``) and the row mechanics it shares are here; the bodies of
the other operations live beside it: ``evdb.reads`` (lookup, contains), ``evdb.writes``
(upsert, delete), ``evdb.maintenance`` (compact, items, stats) and ``evdb.table_state`` (the
persistence of what is not rows).
"""

from __future__ import annotations

import dataclasses
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from evdb import maintenance, reads, writes
from evdb._types import BoolArray, Float32Array, Int64Array
from evdb.admission import AdmissionState
from evdb.arrays import float_matrix, occurrence_counts
from evdb.changelog import ChangeLog
from evdb.config import TableConfig
from evdb.dedup import Deduper
from evdb.errors import CapacityError, InvalidArgumentError, StorageError
from evdb.kernels import cpu
from evdb.kernels.cpu.stamp import stamp_gather_pulled, stamp_pushed
from evdb.keys import normalize_keys
from evdb.locking import exclusive, reading
from evdb.pulled import Pulled
from evdb.records import FREQ_MAX, FROZEN, RecordBatch
from evdb.strings import StringKeeper
from evdb.table_meta import TableMeta
from evdb.tiers.base import Tier
from evdb.tiers.chain import stack
from evdb.tiers.dram import DramTier
from evdb.tiers.hbm import HbmTier
from evdb.tiers.rocks import RocksStrings
from evdb.ttl import Ttl

if TYPE_CHECKING:
    from evdb.database import Database

__all__ = ["Pulled", "Table", "TableSummary"]

# Slab rows scored per matmul by neighbours: 8,192 rows of dim 64 are 2 MiB, so the second pass
# a block needs (row norms for cosine and l2) still finds it in cache.
_BLOCK_ROWS = 8192
# Rows only on disk, read a chunk of this many at a time: the RocksDB tier's scan holds about
# 1 KB of Python objects per row of a chunk while it decodes it (16,384 rows: 18 MB).
_DISK_CHUNK_ROWS = 16384
_DEDUP_FIRST = 8192  # pulls of up to this many keys deduplicate before probing the index
_SAME_STEP_PUSHES = 1000  # a table with a TTL warns once when it takes this many at one step


@dataclasses.dataclass(frozen=True)
class TableSummary:
    """A table's state beside its rows, as ``Table.summary`` copies it."""

    config: TableConfig
    meta: TableMeta
    admission: AdmissionState
    evictions: tuple[int, int]  # the top tier's evictions, and of them expired
    rows: int


class Table:
    """A dynamic embedding table: one row per admitted key, no vocabulary size.

    Safe to share between threads (see ``evdb.locking``): reads (``lookup``, ``contains``,
    ``len``, ``items``, ``stats``, ``neighbors``, ``strings``) run at once; writes (``pull``,
    ``push``, ``upsert``, ``delete``, ``compact``, ``prefetch``) run one at a time, alone.

    Create tables with :meth:`evdb.Database.create_table`; don't construct them directly.

    Examples
    --------
    >>> import tempfile, numpy as np, evdb
    >>> with evdb.open(tempfile.mkdtemp()) as db:
    ...     t = db.create_table("item", dim=4, admission=evdb.admission.Counter(min_count=2))
    ...     p = t.pull([7, 9, 7])            # 7 reaches min_count 2 in this batch, 9 does not
    ...     p.keys.tolist(), p.admitted.tolist(), len(t)
    ([7, 9], [True, False], 1)
    """

    def __init__(
        self,
        db: Database,
        name: str,
        config: TableConfig,
        backing: Tier | None = None,
        strings: RocksStrings | None = None,
    ) -> None:
        self._db = db
        self._rwlock = db._rwlock  # the database's: reads share it, writes hold it alone
        # Reads of the tier below by concurrent readers take turns (the disk tier's read-ahead
        # and counters are not shared-safe); reads of the top tier do not wait for it.
        self._below = threading.Lock()
        self.name = name
        self.config = config
        self.dim = config.dim
        self._optimizer = config.optimizer
        self._admission = config.admission.new_state()
        self._n_slots = config.optimizer.n_slots(config.dim)
        caches = [DramTier(config.dim, self._n_slots, config.dram)]
        if config.hbm is not None:  # on top: it caches the DRAM tier (and what is under it)
            caches.insert(0, HbmTier(config.dim, self._n_slots, config.hbm, config.dram))
        # With a disk tier the DRAM tier caches it; without one, rows still persist in the
        # backing store (written at flush) but every row stays in DRAM.
        self._chain = stack(
            caches,
            backing,
            spill=config.disk is not None,
            track_steps=config.ttl_steps is not None,
            step=lambda: self._db.step,
        )
        # The top tier (DRAM, or HBM over it): the hot paths below work on it alone.
        self._dram = self._chain.cache
        self._hbm = config.hbm is not None
        self.meta = TableMeta()  # version, pushes, uid, policy counters
        self.ttl = Ttl(config.ttl_steps)
        # the original strings, when config.keep_strings
        self._strings = None if strings is None else StringKeeper(strings)
        # A push applies to the latest pull of the table, once: pulls made, and the serial
        # (the count of pulls before it) of the last one pushed.
        self._pulls = 0
        self._pushed = -1
        # Pushes at one step (a table with a TTL warns once when training never advances)
        self._push_step = -1
        self._pushes_at_step = 0
        self._warned_step = False
        # reused probe buffers (first touch is slow), one per lookup in flight
        self._out_rows: list[Int64Array] = []
        self._dedup = Deduper()
        # The keys changed since the last publication (evdb.publish); empty until one starts it.
        self._changes = ChangeLog()
        self._chain.on_remove = self._changes.removed

    # -- helpers --------------------------------------------------------------------------
    def _keys(self, keys: Any, arg: str = "keys") -> Int64Array:
        self._db.check_open()
        k = normalize_keys(keys, self.config.key_type, arg=arg)
        if self._strings is not None:
            self._strings.remember(k, keys)
        return k

    @reading
    def strings(self, keys: Any) -> list[str | None]:
        """The original string of each key (None where unknown), for a table created with
        ``keep_strings=True``."""
        if self._strings is None:
            raise InvalidArgumentError(
                f"table {self.name!r} does not keep its strings (create it with "
                "key_type='str', keep_strings=True)"
            )
        self._db.check_open()
        k = normalize_keys(keys, self.config.key_type, arg="keys")
        return self._strings.get(k)

    def _reads_mutate(self) -> bool:
        """Whether a read would change the table's memory now, so must run alone (see
        ``evdb.locking.reading``): the DRAM index finishes a move into a bigger slot table
        on the probes that meet it (``HashIndex.find``, ``slots``); the counts of the rows
        below merge expired steps when the live floor rose (``StepCounts.live``). Both end
        with the first read that does it. An HBM tier's reads go through the DRAM chain
        below it, whose index may be moving too: they always run alone."""
        if self._dram.index.moving or self._hbm:
            return True
        below = self._chain.below_steps
        return below.track_steps and self._min_live() > below.floor

    def _min_live(self, step: int | None = None) -> int:
        return self.ttl.min_live(self._db.step if step is None else step)

    def _bump_version(self) -> int:
        return self.meta.bump()

    def defaults(self, keys: Int64Array) -> Float32Array:
        """The value (n, dim) float32 keys without a row read."""
        dv = self.config.default_value
        if dv == "init":
            return self.config.initializer.values(keys, self.dim)
        return np.full((keys.shape[0], self.dim), dv, dtype=np.float32)

    def _expired(self, rows: Int64Array, min_live: int | None = None) -> BoolArray:
        """Which entries of rows (-1 = none) hold a row that has expired (at db.step, or
        below ``min_live``)."""
        if self.config.ttl_steps is None:
            return np.zeros(rows.shape[0], dtype=bool)
        stale = rows >= 0
        floor = self._min_live() if min_live is None else min_live
        stale[stale] = self._dram.last_step[rows[stale]] < floor
        return stale

    def _live_rows(self, keys: Int64Array) -> Int64Array:
        """Rows of keys, -1 where absent or expired."""
        rows = self._dram.locate(keys)
        rows[self._expired(rows)] = -1
        return rows

    def _fresh_records(
        self, keys: Int64Array, values: Float32Array, freq: Int64Array, version: int
    ) -> RecordBatch:
        n = keys.shape[0]
        return RecordBatch(
            values=values,
            slots=self._optimizer.initial_slots(n, self.dim),
            freq=np.minimum(freq, FREQ_MAX).astype(np.uint32),
            last_step=np.full(n, self._db.step, dtype=np.int64),
            version=np.full(n, version, dtype=np.uint64),
        )

    def _drop_expired(self, rows: Int64Array) -> Int64Array:
        """rows, after removing the expired ones (which then start afresh)."""
        if self.config.ttl_steps is None:  # nothing expires
            return rows
        stale = self._expired(rows)
        if stale.any():
            self._chain.remove_rows(rows[stale])
            rows[stale] = -1
            self.meta.count("expired_on_pull", int(np.count_nonzero(stale)))
        return rows

    def _promote_misses(self, uniq: Int64Array, rows: Int64Array) -> None:
        """Bring the rows of distinct keys the DRAM tier lacks (rows == -1) up from the tier
        below, dirty (the caller changes them next), writing their rows into ``rows``. Rows
        found below but expired are removed there and stay -1: the key starts afresh."""
        if not self._chain.has_rows_below:
            return
        miss = np.flatnonzero(rows < 0)
        if miss.size == 0:
            return
        found, records = self._chain.fetch(uniq[miss])
        if records is None or len(records) == 0:
            return
        at = miss[found]
        live = records.last_step >= self._min_live()
        if not live.all():
            dead = ~live
            self._chain.remove_fetched(uniq[at[dead]], records.last_step[dead])
            self.meta.count("expired_on_pull", int(np.count_nonzero(dead)))
            records = records.take(live)
            at = at[live]
        rows[at] = self._chain.promote(uniq[at], records, dirty=True)

    # -- read path ------------------------------------------------------------------------
    def lookup(
        self,
        keys: Any,
        offsets: Any = None,
        weights: Any = None,
        combiner: str | None = None,
        max_norm: float | None = None,
        *,
        out: Float32Array | None = None,
        promote: bool = False,
        found: BoolArray | None = None,
        step: int | None = None,
    ) -> Float32Array:
        """Read rows for inference: never creates rows, never counts toward admission.

        Parameters
        ----------
        keys : (n,) int64 array-like, or a sequence of str for a str table
        offsets : (B,) int array-like, optional
            Start of each bag in keys (torch.nn.EmbeddingBag's convention: non-decreasing,
            first 0, no end offset). With it, each bag's rows are combined into one vector.
        weights : (n,) float array-like, optional
            Per-key weights of the combination (per_sample_weights); all 1 when absent.
        combiner : "sum" | "mean" | "sqrtn", optional
            ``sum(w x)``, ``sum(w x) / sum(w)`` (the default with offsets), or
            ``sum(w x) / sqrt(sum(w^2))``; a bag that is empty or weighs 0 gives zeros.
        max_norm : float, optional
            Each looked-up vector is scaled down to at most this L2 norm first (the stored
            row is not changed).
        out : float32 C-contiguous array of the result's shape, optional
            Written in place and returned; reuse it across calls to skip page faults.
        promote : bool
            Cache the rows read from disk in DRAM (clean), as training reads do. Off by
            default, so that a scan-like read does not flush the hot set out of DRAM.
        found : (n,) bool array, optional
            Written in place: whether each key has a live row (what ``contains`` says),
            from the same read (a server answers both without probing twice).
        step : int, optional
            Judge the TTL at this step instead of ``db.step`` (a view of a publication reads
            at the publication's step).

        Returns
        -------
        (n, dim) float32, each key's row or its default value where it has no live row; with
        offsets, (B, dim) float32, one combined vector per bag. One fused kernel probes,
        gathers and combines: no (n, dim) matrix is built for a bag lookup.
        """
        lock = self._rwlock
        fill = None  # keys of the rows a shared read found on disk, to promote alone
        nested = lock.acquire_shared()
        try:
            min_live = self._min_live(step)
            if nested:  # inside this thread's own call: run as it holds the lock
                promote = promote and lock.held_exclusive()
                return reads.lookup(
                    self, keys, offsets, weights, combiner, max_norm, out, promote, found,
                    min_live,
                )  # fmt: skip
            if not self._reads_mutate():
                # Shared; the rows read from disk are promoted afterwards, alone (promotion
                # changes the DRAM tier the other readers probe; it reads them again then).
                later: list[Int64Array] | None = [] if promote else None
                got = reads.lookup(
                    self, keys, offsets, weights, combiner, max_norm, out, False, found,
                    min_live, later,
                )  # fmt: skip
                if not later:
                    return got
                fill = np.concatenate(later)
        finally:
            lock.release_shared()
        lock.acquire_exclusive()
        try:
            if fill is None:  # a read would mutate the table now: the whole lookup runs alone
                got = reads.lookup(
                    self, keys, offsets, weights, combiner, max_norm, out, promote, found,
                    self._min_live(step),
                )  # fmt: skip
            else:
                reads.promote(self, fill)
            lock.writes += promote  # rows moved between tiers: a scan in progress must know
            return got
        finally:
            lock.release_exclusive()

    @property
    def step(self) -> int:
        """The database's global step (what TTL and ``last_step`` count in)."""
        return self._db.step

    @property
    def learning_rate(self) -> float:
        """The optimizer's current learning rate (``config.optimizer.lr`` until changed)."""
        return float(self._optimizer.lr)

    @learning_rate.setter
    @exclusive
    def learning_rate(self, lr: float) -> None:
        """Change the learning rate of later pushes (LR schedules); the rest of the rule and
        the persisted config stay as created."""
        self._optimizer = dataclasses.replace(self._optimizer, lr=lr)  # validates lr

    @reading
    def contains(self, keys: Any, *, step: int | None = None) -> BoolArray:
        """(n,) bool: whether each key has a live row (at ``step``, default ``db.step``)."""
        return reads.contains(self, keys, self._min_live(step))

    def __len__(self) -> int:
        """Live rows: expired rows do not count, even before ``compact()``."""
        return self.count()

    @reading
    def count(self, *, step: int | None = None) -> int:
        """Live rows at ``step`` (default ``db.step``): ``len(table)`` at another step."""
        self._db.check_open()
        return self._chain.live_rows(self._min_live(step))

    @reading
    def stored_rows(self) -> int:
        """Rows the table stores, expired ones included (what ``records`` yields): cached
        rows, plus the rows below that the cache does not hold."""
        self._db.check_open()
        return self._chain.stored_rows()

    def items(self, chunk_rows: int = 65536) -> Iterator[tuple[Int64Array, Float32Array]]:
        """Iterate ``(keys (m,) int64, values (m, dim) float32)`` chunks over live rows.

        Each chunk is read under the database's lock (shared), which is not held between
        chunks; a write to the database between two chunks (from any thread) makes the next
        one raise ``ConcurrentModificationError`` (the scan could miss or repeat rows):
        iterate again. A thread that holds the database's lock exclusive (a checkpoint) sees
        its own writes.
        """
        return maintenance.items(self, chunk_rows)

    def records(
        self,
        chunk_rows: int = 65536,
        *,
        live_only: bool = False,
        since_version: int | None = None,
        strict: bool = True,
        step: int | None = None,
    ) -> Iterator[tuple[Int64Array, RecordBatch]]:
        """Whole records (values, slots, ``freq``, ``last_step``, ``version``, flags) as
        ``(keys, records)`` chunks, each row once, from whichever tier holds it: what
        checkpoints, exports, publications, samples and resharding read.

        ``live_only``: only rows live at ``step`` (default ``db.step``); otherwise expired
        rows too. ``since_version``: only rows changed after that table version (an
        incremental checkpoint). Each chunk is read under the database's lock (shared, or
        the caller's exclusive hold); ``strict`` as in ``items`` (False: a sample that goes
        on past writes between chunks). Empty chunks are skipped.
        """
        return maintenance.records(self, chunk_rows, live_only, since_version, strict, step)

    def live_values(self, *, step: int | None = None) -> Iterator[tuple[Float32Array, Int64Array]]:
        """``(values (m, dim) float32, keys (m,) int64)`` of every live row (at ``step``), a
        block at a time: the top tier's rows read in place, then the rows only below.
        Read-only views, valid until the next block; the table must not change meanwhile
        (``neighbors`` holds the lock around the whole pass)."""
        self._db.check_open()
        min_live = self._min_live(step)
        yield from self._dram.live_blocks(min_live, _BLOCK_ROWS)
        for keys, records in self._chain.scan_below(_DISK_CHUNK_ROWS):
            live = records.last_step >= min_live
            if live.all():
                yield records.values, keys
            elif live.any():
                yield records.values[live], keys[live]

    @reading
    def read_records(self, keys: Any, *, step: int | None = None) -> tuple[BoolArray, RecordBatch]:
        """Whole records of keys' live rows (at ``step``, default ``db.step``), from
        whichever tier holds the truth: (found (n,), the records of the found keys, in key
        order). Changes nothing."""
        return reads.read_records(self, keys, self._min_live(step))

    @exclusive
    def restore_records(self, keys: Any, records: RecordBatch) -> None:
        """Put whole records for distinct keys the table holds no row of, as they are (how
        resharding and publications move rows). Rows beyond the top tier's room spill down
        as training's would; a table that cannot spill refuses a batch it has no room for
        (``CapacityError``), dropping nothing."""
        self._db.check_writable()
        writes.restore_records(self, np.ascontiguousarray(keys, dtype=np.int64), records)

    @property
    def changes(self) -> ChangeLog:
        """The keys changed since the last publication (``evdb.publish`` starts, reads and
        clears it)."""
        return self._changes

    @property
    def keeps_strings(self) -> bool:
        """Whether the table keeps its keys' original strings (``strings`` answers)."""
        return self._strings is not None

    @reading
    def neighbors(
        self,
        query: Any,
        k: int = 10,
        metric: str = "cosine",
        *,
        as_strings: bool = False,
        step: int | None = None,
    ) -> tuple[Any, Float32Array]:
        """Exact top-k nearest neighbours of a key or a vector among the live rows.

        Parameters
        ----------
        query : int or str key, or (dim,) float array-like
            A key (its row, or its default value without one; the key itself is left out of
            the answer, as gensim's ``most_similar`` leaves out the word), or a vector.
        k : int
            How many neighbours (fewer when the table has fewer live rows).
        metric : "cosine" | "dot" | "l2"
            Cosine similarity (a row of norm 0 scores 0), dot product, or L2 distance.
        as_strings : bool
            Return the keys' original strings (a table with ``keep_strings=True``).
        step : int, optional
            Judge the TTL at this step instead of ``db.step``.

        Returns
        -------
        keys : (m,) int64, or a list of str (None where unknown) with ``as_strings``
        scores : (m,) float32
            Nearest first: highest similarity, or lowest distance for l2; ties by key.

        Every live row is scored, streamed through the tiers a chunk at a time (a table
        larger than memory works), one matmul per chunk; see ``evdb.neighbors``.
        """
        from evdb.neighbors import neighbors  # a leaf module: imported where it is used

        return neighbors(self, query, k, metric, as_strings, step)

    # -- training path --------------------------------------------------------------------
    def _distinct_rows(
        self, k: Int64Array
    ) -> tuple[Int64Array, Int64Array, Int64Array, Int64Array]:
        """A pull's distinct keys in first-occurrence order, the inverse, the counts and the
        DRAM row of each distinct key (-1 = none). A batch of up to ``_DEDUP_FIRST`` keys is
        deduplicated first, in the small scratch index, and only its distinct keys probe the
        table's index; a bigger one probes every key (on numba's threads) and deduplicates by
        row (``unique_rows``). On a 1M-row table, uniform keys: 16,384 keys 0.38 -> 0.18 ms,
        65,536 keys 1.17 -> 0.91 ms; Zipf batches the same or better; at 4,096 keys a tie.
        With the probe on the pool from 2,048 keys, the same batches reused (warm) favour
        probing first from 4,096 keys (54 -> 34 us uniform), but DeepFM's fresh Zipf(1.1)
        batches of 4,096 keys still deduplicate faster first (68-76 against 79-85 us)."""
        n = k.shape[0]
        if n > _DEDUP_FIRST:
            return self._dedup.unique_rows(k, self._dram.locate(k), self._dram.alloc.high_water)
        self._dedup._fit(n)  # the scratch index is kept between pulls (left empty by the kernel)
        uniq = np.empty(n, dtype=np.int64)
        inverse = np.empty(n, dtype=np.int64)
        counts = np.zeros(n, dtype=np.int64)
        u = cpu.unique_inverse(k, self._dedup.scratch, uniq, inverse, counts)
        return uniq[:u], inverse, counts[:u], self._dram.locate(uniq[:u])

    @exclusive
    def pull(self, keys: Any, *, counts: Any = None) -> Pulled:
        """Training read at ``db.step``: count, admit, create and return the batch's rows.

        Every occurrence counts toward admission; a key is admitted on the pull in which its
        count reaches ``min_count``. Admitted keys get (or keep) a row stamped with
        ``last_step = db.step``; an expired row starts afresh. The batch's rows are protected
        from eviction until its ``push`` or the next ``pull``; push it once, before the next
        ``pull`` of the table (see ``push``).

        ``counts`` (n,) int >= 1, optional, says how many occurrences each key stands for
        (admission and ``freq`` count them; 1 each by default): a shard's owner pulls the
        distinct keys of every rank with their counts (``evdb.distributed``).
        """
        self._db.check_writable()
        k = self._keys(keys)
        given = None if counts is None else occurrence_counts(counts, k.shape[0], "counts")
        uniq, inverse, counts, found = self._distinct_rows(k)
        # counts: positions per distinct key (combine and per-position push use them);
        # occurrences: what admission and freq count
        occurrences = counts
        if given is not None:
            occurrences = np.zeros(uniq.shape[0], dtype=np.int64)
            np.add.at(occurrences, inverse, given)
        new_strings = None if self._strings is None else self._strings.check(uniq)
        cap = self._dram.capacity_rows
        if cap is not None and uniq.shape[0] > cap and not self._chain.spill:
            raise CapacityError(
                f"keys: the batch has {uniq.shape[0]} distinct keys, more than "
                f"dram_rows={cap}, and this table has no lower tier to spill to"
            )
        if self._pulls and self._pushed != self._pulls - 1:
            self.meta.count("pulls_not_pushed", 1)  # the batch before was never pushed
        self._dram.unpin_all()
        version = self._bump_version()
        rows = self._drop_expired(found)
        n_hits = int(np.count_nonzero(rows >= 0))
        self._chain.count_cache_reads(n_hits, rows.shape[0] - n_hits)
        self._promote_misses(uniq, rows)
        dram = self._dram
        u = uniq.shape[0]
        out = np.empty((u, self.dim), dtype=np.float32)
        # Every row found: freq += count (saturating), last_step, version, the dirty and pinned
        # bits, and its copy into out, in one pass on numba's threads (numpy read-modify-writes
        # per column cost 8x more; a serial stamp, numpy pin and separate gather 2x more)
        n_have = stamp_gather_pulled(
            rows, occurrences, self._db.step, version, int(FREQ_MAX), dram.freq,
            dram.last_step, dram.version, dram.is_dirty, dram.is_pinned, dram.values, out,
        )  # fmt: skip
        if n_have == u:
            dram.pin(rows, flagged=True)
        else:
            dram.pin(rows[rows >= 0], flagged=True)
            miss = np.flatnonzero(rows < 0)
            if not self.config.admission.counts_pulls:  # every key is admitted at once
                new, totals = miss, occurrences[miss]
            else:
                totals = self._admission.observe(uniq[miss], occurrences[miss], self._db.step)
                ok = self.config.admission.admit(totals)
                new, totals = miss[ok], totals[ok]
            if new.size:
                new_keys = uniq[new]
                self._admission.forget(new_keys)
                records = self._fresh_records(  # freq starts at the pulls admission saw
                    new_keys,
                    self.config.initializer.values(new_keys, self.dim),
                    totals,
                    version,
                )
                rows[new] = self._chain.create(new_keys, records)
                dram.pin(rows[new])
                out[new] = records.values
            self.meta.count("not_admitted", int(miss.size - new.size))
            n_have += int(new.size)
        all_in = n_have == u
        admitted = np.ones(u, dtype=bool) if all_in else rows >= 0
        self._chain.evict(self._db.step, self._min_live())
        if not all_in:
            out[~admitted] = self.defaults(uniq[~admitted])
        if self._strings is not None:
            self._strings.store(new_strings, uniq[admitted])
        self._changes.touched(uniq if all_in else uniq[admitted])
        return Pulled(
            uniq,
            inverse,
            out,
            admitted,
            counts,
            self._db.step,
            self.name,
            _rows=rows,
            _tier=self._dram,
            _frees=self._dram.frees,
            _serial=self._next_pull(),
        )

    def _next_pull(self) -> int:
        self._pulls += 1
        return self._pulls - 1

    def check_pushable(self, pulled: Any) -> None:
        """Raise unless pulled is this table's latest pull, not pushed yet: a second push
        would apply its gradients twice, and a batch older than the last pull was computed
        from rows that pull may have unpinned and moved (TorchRec and DeepRec tie an update
        to its lookup the same way)."""
        if not isinstance(pulled, Pulled) or pulled.table != self.name:
            raise InvalidArgumentError(
                f"pulled must be what {self.name!r}.pull() returned, got {type(pulled).__name__}"
                + (f" of table {pulled.table!r}" if isinstance(pulled, Pulled) else "")
            )
        if pulled._tier is not self._dram:
            raise InvalidArgumentError(
                f"pulled: this batch was pulled from another table {self.name!r} (one dropped "
                "and re-created, or another database): push it to the table that pulled it"
            )
        if pulled._serial <= self._pushed:
            raise InvalidArgumentError(
                f"pulled: this batch of table {self.name!r} was pushed already (pull "
                f"#{pulled._serial}); a second push would apply its gradients twice"
            )
        if pulled._serial != self._pulls - 1:
            raise InvalidArgumentError(
                f"pulled: this batch of table {self.name!r} (pull #{pulled._serial}) is stale: "
                f"pull #{self._pulls - 1} came after it and unpinned its rows; push each batch "
                "before the next pull of the table (to accumulate gradients over micro-batches, "
                "sum them and push once)"
            )

    def _count_push_step(self) -> None:
        """With a TTL, warn once when pushes pile up at one step: a loop that never calls
        ``advance`` expires nothing, then everything at once when the step jumps."""
        step = self._db.step
        if step != self._push_step:
            self._push_step, self._pushes_at_step = step, 0
        self._pushes_at_step += 1
        if self._pushes_at_step == _SAME_STEP_PUSHES and not self._warned_step:
            self._warned_step = True
            warnings.warn(
                f"table {self.name!r} has ttl_steps={self.config.ttl_steps} but took "
                f"{_SAME_STEP_PUSHES} pushes at step {step}: call db.advance() once per "
                "training step, or its rows expire by steps that never come (and then all at "
                "once)",
                RuntimeWarning,
                stacklevel=4,
            )

    @exclusive
    def prefetch(self, keys: Any) -> None:
        """Start reading from disk, on a background thread, the rows of keys that DRAM does
        not hold, so that the ``pull`` or ``lookup`` of them that follows finds them read.

        Call it with the next batch's keys before training on the current one. A hint: it
        changes no row, counts nothing toward admission and changes no result (a row written
        down or removed after the prefetch is read again). Each call replaces the one before;
        a table that has spilled nothing returns at once.
        """
        self._chain.prefetch(self._keys(keys))  # a no-op while nothing is below DRAM

    @exclusive
    def push(self, pulled: Pulled, grads: Any, *, per_position: bool = False) -> None:
        """Apply the table's optimizer to the pulled rows, in place.

        Parameters
        ----------
        pulled : Pulled
            What ``pull`` returned for this batch.
        grads : (u, dim) float array aligned with ``pulled.keys``, or, with
            ``per_position=True``, (n, dim) aligned with the keys given to ``pull`` (summed per
            key first).

        Gradients of keys that have no row (not admitted, or deleted since the pull) are
        dropped and counted in ``stats()["dropped_gradients"]``. Non-finite gradients raise
        and change nothing.

        An update is tied to its pull (as TorchRec's and DeepRec's are to their lookup): a
        ``Pulled`` is pushed at most once, and only while it is the table's latest pull.
        Pushing it twice, or after a newer ``pull`` of the table (which unpinned its rows),
        raises ``InvalidArgumentError`` and changes nothing; to accumulate gradients over
        micro-batches, sum them and push once. A pull that the next pull finds not pushed
        (an evaluation batch pulled in training mode, say) is counted in
        ``stats()["pulls_not_pushed"]``. With ``ttl_steps``, a table that takes 1,000 pushes at
        one step warns once (``RuntimeWarning``): rows age by ``db.advance()``, so a loop that
        never calls it expires nothing, then everything at once.
        """
        self._db.check_writable()
        self.check_pushable(pulled)
        u = pulled.keys.shape[0]
        n = pulled.inverse.shape[0]
        g = float_matrix(grads, ((n if per_position else u), self.dim), "grads")
        if per_position:  # positions grouped by key: the kernel sums each key's segment
            bounds = np.zeros(u + 1, dtype=np.int64)
            np.cumsum(pulled.counts, out=bounds[1:])
            positions = np.empty(n, dtype=np.int64)
            cpu.group_positions(pulled.inverse, bounds, positions)
        else:
            bounds = np.arange(u + 1, dtype=np.int64)
            positions = bounds[:-1]
        if pulled._tier is self._dram and pulled._frees == self._dram.frees:
            rows = pulled._rows.copy()  # no row was freed since the pull: they still hold
            if self.config.ttl_steps is not None:  # but they may have expired meanwhile
                rows[self._expired(rows)] = -1
        else:
            rows = self._live_rows(pulled.keys)
            rows[~pulled.admitted] = -1
            # Rows evicted since (no DRAM row at all; an expired one stays expired): bring
            # them back from below.
            gone = np.flatnonzero(pulled.admitted & (self._dram.locate(pulled.keys) < 0))
            if gone.size and self._chain.has_rows_below:
                back = rows[gone]
                self._promote_misses(pulled.keys[gone], back)
                rows[gone] = back
        version = self._bump_version()
        self.meta.pushes += 1
        self._pushed = pulled._serial
        if self.config.ttl_steps is not None:
            self._count_push_step()
        # Frozen rows leave the update (read by training, never changed by it); every other
        # row is stamped (last_step, version, dirty) in the same pass. Nothing below can fail:
        # the gradients were checked finite above.
        dropped, frozen = stamp_pushed(
            rows,
            self._dram.flags,
            int(FROZEN),
            self._db.step,
            version,
            self._dram.last_step,
            self._dram.version,
            self._dram.is_dirty,
        )
        self.meta.count("dropped_gradients", int(dropped))
        self.meta.count("frozen_gradients", int(frozen))
        cpu.segment_sum_apply(
            g,
            positions,
            bounds,
            rows,
            self._optimizer.code,
            self._optimizer.hyper(self._db.step, self.meta.pushes),
            self._dram.values,
            self._dram.slots,
        )
        self._dram.unpin_all()
        self._changes.touched(pulled.keys[pulled.admitted])
        self._evict_after_write("push")

    def _evict_after_write(self, op: str, protect: Int64Array | None = None) -> None:
        """Bring the top tier back under its watermark after a write that is applied
        already: if writing the victims down fails (a full disk), the write stays applied
        in memory, and the error says so, lest the caller repeat it."""
        try:
            self._chain.evict(self._db.step, self._min_live(), protect=protect)
        except StorageError as e:
            raise StorageError(
                e.errno,
                f"{e}; the {op} itself was applied and is kept in memory (do not repeat it): "
                "the next write or flush writes it down once space is freed",
                e.filename,
            ) from e

    # -- writes ---------------------------------------------------------------------------
    @exclusive
    def upsert(self, keys: Any, values: Any, *, freeze: bool | None = None) -> None:
        """Set rows' values, creating rows as needed (admission is bypassed).

        An existing row keeps its optimizer slots and frequency; a new, re-created or expired
        one starts with fresh slots. A key given twice takes its last value. ``freeze=True``
        marks the rows frozen (``push`` reads them but never changes them: pre-trained
        vectors), ``False`` unfreezes them, None leaves existing rows as they were (new rows
        are not frozen).
        """
        writes.upsert(self, keys, values, freeze)

    @exclusive
    def delete(self, keys: Any) -> int:
        """Remove keys' rows and pending admission counts; returns how many live rows went."""
        return writes.delete(self, keys)

    @exclusive
    def compact(self) -> dict[str, int]:
        """Reclaim expired rows and rows with L2 norm below ``l2_threshold`` at ``db.step``.

        Returns ``{"expired": n, "l2": m, "admission_forgotten": c}``: rows removed for each
        reason, and stale pending admission counts forgotten (only with a TTL).
        """
        return maintenance.compact(self)

    @reading
    def stats(self) -> dict[str, Any]:
        """Counts that say what the table holds and what its policies did."""
        return maintenance.stats(self)

    # -- persistence (what is not rows; the rows persist in the backing tier) -------------
    @exclusive
    def flush_state(self) -> dict[str, np.ndarray]:
        """Write every dirty row down; returns the table's state that is not rows (its meta,
        the admission's pending counts, the step counts of the rows below), which the
        database saves in its metadata and hands back to ``load_state`` on open."""
        self._chain.flush()
        self._chain.below_steps.live(self._min_live())  # merges the expired steps' counts
        state = self.meta.to_arrays(self._chain.cache.eviction_counts())
        for name, arr in self._admission.to_arrays().items():
            state[f"admission.{name}"] = arr
        state.update(self._chain.to_arrays())  # below_steps.*, backing.*
        return state

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """Restore what ``flush_state`` returned (the backing tier already holds the rows)."""
        self.meta, evictions = TableMeta.from_arrays(state)
        self._chain.cache.load_eviction_counts(evictions)
        prefix = "admission."
        self._admission.load_arrays(
            {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
        )
        self._chain.load_arrays(state)  # without a disk tier, every row is loaded into DRAM

    @reading
    def checkpoint_info(self) -> dict[str, Any]:
        """What a checkpoint manifest records of the table (after a flush): the uid of this
        incarnation, its version and its live rows."""
        return {"uid": self.meta.uid, "version": self.meta.version, "rows": len(self)}

    @reading
    def summary(self) -> TableSummary:
        """What the table holds beside its rows, copied (resharding reads it from every old
        shard before any row moves, and hands the list to ``absorb``)."""
        admission = self.config.admission.new_state()
        admission.load_arrays(self._admission.to_arrays())
        return TableSummary(
            self.config,
            self.meta.copy(),
            admission,
            self._chain.cache.eviction_counts(),
            len(self),
        )

    @exclusive
    def absorb(
        self,
        olds: list[TableSummary],
        owns: Callable[[Int64Array], BoolArray],
        *,
        first: bool,
    ) -> None:
        """Take over what is not rows from the tables whose rows this one receives
        (resharding): the pushes (Adam's bias correction), the highest version, the pending
        admission counts of the keys it ``owns``, and on the ``first`` new shard only, the
        counters and eviction counts, so that their totals stay."""
        self.meta = self.meta.merged([o.meta for o in olds], with_counters=first)
        self._admission.absorb([o.admission for o in olds], owns, first=first)
        if first:
            self._chain.cache.load_eviction_counts(
                (sum(o.evictions[0] for o in olds), sum(o.evictions[1] for o in olds))
            )

    def __repr__(self) -> str:
        return f"Table({self.name!r}, dim={self.dim}, key_type={self.config.key_type!r})"
