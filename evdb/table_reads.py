"""The read half of ``Table``: the state a table's reads and writes share, and the reads.

``TableReads`` is ``Table``'s base class (``evdb.table`` adds the writes). Its public methods
change no row and count nothing toward admission, so threads run them at once under the
database's lock held shared (``evdb.locking.reading``); they are the read protocol a
published view also keeps (``evdb.view``). A read asks the top tier of its chain through the
``CacheTier`` role (fused probe, TTL check, gather and combine in one kernel) and reads what
the top tier lacks from the tiers below.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from evdb._types import BoolArray, Float32Array, Int64Array
from evdb.bags import parse_lookup
from evdb.changelog import ChangeLog
from evdb.config import TableConfig
from evdb.dedup import Deduper
from evdb.errors import DatabaseClosedError, InvalidArgumentError
from evdb.kernels import backend
from evdb.keys import normalize_keys
from evdb.locking import reading
from evdb.records import FIELDS, RecordBatch
from evdb.strings import StringKeeper
from evdb.table_meta import TableMeta
from evdb.tiers.base import CacheTier, Tier
from evdb.tiers.chain import stack
from evdb.tiers.device_path import DevicePath, device_path
from evdb.tiers.dram import dram_tier
from evdb.tiers.hbm import hbm_tier
from evdb.tiers.rocks import RocksStrings
from evdb.trace import KeyRecorder
from evdb.ttl import Ttl

if TYPE_CHECKING:
    from evdb.database import Database

__all__ = ["TableReads"]

cpu = backend("cpu")  # the host combine of rows read from several tiers


class TableReads:
    """The state of a table and the reads of it (see ``Table``, which adds the writes)."""

    def __init__(
        self,
        db: Database,
        name: str,
        config: TableConfig,
        backing: Tier | None = None,
        strings: RocksStrings | None = None,
    ) -> None:
        self._db = db
        self._rwlock = db.rwlock  # the database's: reads share it, writes hold it alone
        # Reads of the tier below by concurrent readers take turns (the disk tier's read-ahead
        # and counters are not shared-safe); reads of the top tier do not wait for it.
        self._below = threading.Lock()
        self.name = name
        self.config = config
        self.dim = config.dim
        n_slots = config.optimizer.n_slots(config.dim)
        # Half-precision rows round a push stochastically with the initializer's seed
        dtype, seed = config.dtype, int(getattr(config.initializer, "seed", 0))
        sr = config.rounding == "stochastic"
        slot_dtype = config.slot_dtype
        caches: list[CacheTier] = [
            dram_tier(
                config.dim, n_slots, config.dram, dtype=dtype, stochastic=sr, seed=seed,
                slot_dtype=slot_dtype,
            )
        ]  # fmt: skip
        if config.hbm is not None:  # on top: it caches the DRAM tier (and what is under it)
            caches.insert(
                0,
                hbm_tier(
                    config.dim, n_slots, config.hbm, config.dram, dtype=dtype, stochastic=sr,
                    seed=seed, slot_dtype=slot_dtype,
                ),
            )  # fmt: skip
        # With a disk tier the DRAM tier caches it; without one, rows still persist in the
        # backing store (written at flush) but every row stays in DRAM.
        self._chain = stack(
            caches,
            backing,
            spill=config.disk is not None,
            track_steps=config.ttl_steps is not None,
            step=lambda: self._db.step,
        )
        self._top: CacheTier = self._chain.cache  # HBM, or DRAM: the hot paths work on it
        # Device arrays in and out, where the top tier is on a CUDA device (else None)
        self._device_path = device_path(self._top)
        self.meta = TableMeta()  # version, pushes, uid, policy counters
        self.ttl = Ttl(config.ttl_steps)
        self._strings = None if strings is None else StringKeeper(strings)
        self._out_rows: list[Int64Array] = []  # probe buffers, one per lookup in flight
        # The keys changed since the last publication (evdb.publish); empty until one starts it.
        self._changes = ChangeLog()
        self._chain.on_remove = self._changes.removed
        self._recorder: KeyRecorder | None = None  # the keys asked for, sampled (evdb.trace)
        self._admission = config.admission.new_state()  # pending counts of keys without a row
        self._dedup = Deduper()  # distinct keys of a batch, with its kept scratch

    # -- helpers --------------------------------------------------------------------------
    def _keys(self, keys: Any, arg: str = "keys") -> Int64Array:
        self._db.check_open()
        k = normalize_keys(keys, self.config.key_type, arg=arg)
        if self._strings is not None:
            self._strings.remember(k, keys)
        return k

    def _min_live(self, step: int | None = None) -> int:
        return self.ttl.min_live(self._db.step if step is None else step)

    def _expired(self, rows: Int64Array, min_live: int | None = None) -> BoolArray:
        """Which entries of rows (-1 = none) hold a row that has expired (at db.step, or
        below ``min_live``)."""
        if not self.ttl.expires:
            return np.zeros(rows.shape[0], dtype=bool)
        stale = rows >= 0
        floor = self._min_live() if min_live is None else min_live
        stale[stale] = self._top.last_steps(rows[stale]) < floor
        return stale

    def _reads_mutate(self) -> bool:
        """Whether a read would change the table's memory now, so must run alone (see
        ``evdb.locking.reading``): the top tier's index finishes a move into a bigger slot
        table on the probes that meet it (the first read that meets it ends it). An HBM
        tier's reads go through the DRAM chain below it, whose index may be moving too: they
        always run alone."""
        return self._top.index_moving or self.config.hbm is not None

    def defaults(self, keys: Int64Array) -> Float32Array:
        """The value (n, dim) float32 keys without a row read."""
        dv = self.config.default_value
        if dv == "init":
            return self.config.initializer.values(keys, self.dim)
        return np.full((keys.shape[0], self.dim), dv, dtype=np.float32)

    def _default_params(self) -> tuple[int, int, float, float]:
        dv = self.config.default_value
        if dv == "init":
            return self.config.initializer.kernel_params()
        return 0, 0, float(dv), 0.0

    def _fetch(
        self, keys: Int64Array, op: str | None = None
    ) -> tuple[BoolArray, RecordBatch | None]:
        """``TierChain.fetch`` for a reader: readers sharing the database take turns below."""
        with self._below:
            return self._chain.fetch(keys, op)

    # -- public reads ---------------------------------------------------------------------
    def trace(self, recorder: KeyRecorder | None) -> None:
        """Record the keys of this table's pulls and lookups (with the step) into
        ``recorder`` from now on, sampled as it samples them (``evdb.trace.KeyRecorder``;
        ``evdb size`` reads the file); None stops recording. The caller closes the recorder."""
        if recorder is not None and not isinstance(recorder, KeyRecorder):
            raise InvalidArgumentError(
                f"recorder must be an evdb.trace.KeyRecorder or None, got {recorder!r}"
            )
        self._recorder = recorder

    @property
    def database(self) -> Database:
        """The database this table belongs to (as ``ShardedTable.database``)."""
        return self._db

    @property
    def step(self) -> int:
        """The database's global step (what TTL and ``last_step`` count in)."""
        return self._db.step

    @property
    def device_path(self) -> DevicePath | None:
        """The table's device path (device arrays in and out, ``evdb.tiers.device_path``)
        where its top tier is on a CUDA device; None otherwise."""
        return self._device_path

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
    def resident(self, keys: Any, *, tier: str | None = None) -> BoolArray:
        """(n,) bool: whether each key's row is held by ``tier`` ("hbm", "dram", "rocksdb", as
        ``stats()["tiers"]`` names them; default the top tier) now, live or not. Where a row
        lives changes no result; this says what a read will cost (a prefetch's effect)."""
        k = self._keys(keys)
        if tier is None:
            return self._top.locate(k) >= 0
        if tier not in self._chain.stats():
            raise InvalidArgumentError(
                f"tier must be one of {sorted(self._chain.stats())}, got {tier!r}"
            )
        with self._below:
            return self._chain.resident(k, tier)

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

        Device keys (a cupy array, on a table whose HBM tier is on that device) take the
        device path (``evdb.tiers.device_path``): the result is a device array (``out`` and
        ``weights`` must be device arrays too; ``found`` is not taken), gathered and combined
        on the device; only where keys miss the HBM tier do they (8 bytes each) come to the
        host, and the rows read below go up in one batched copy.
        """
        lock = self._rwlock
        fill = None  # keys of the rows a shared read found on disk, to promote alone
        nested = lock.acquire_shared()
        args = (keys, offsets, weights, combiner, max_norm, out)
        try:
            min_live = self._min_live(step)
            if nested:  # inside this thread's own call: run as it holds the lock
                return self._lookup(*args, promote and lock.held_exclusive(), found, min_live)
            if not self._reads_mutate():
                # Shared; the rows read from disk are promoted afterwards, alone (promotion
                # changes the top tier the other readers probe; it reads them again then).
                later: list[Int64Array] | None = [] if promote else None
                got = self._lookup(*args, False, found, min_live, later)
                if not later:
                    return got
                fill = np.concatenate(later)
        finally:
            lock.release_shared()
        lock.acquire_exclusive()
        try:
            if fill is None:  # a read would mutate the table now: the whole lookup runs alone
                got = self._lookup(*args, promote, found, self._min_live(step))
            else:
                self._promote_read(fill)
            lock.writes += promote  # rows moved between tiers: a scan in progress must know
            return got
        finally:
            lock.release_exclusive()

    def _lookup(
        self,
        keys: Any,
        offsets: Any,
        weights: Any,
        combiner: str | None,
        max_norm: float | None,
        out: Float32Array | None,
        promote: bool,
        found: BoolArray | None,
        min_live: int,
        later: list[Int64Array] | None = None,
        record: bool = True,
    ) -> Float32Array:
        """``lookup``'s body. It changes nothing unless ``promote`` (the caller holds the
        database alone then). ``later``, if given, collects the keys of the rows read from
        disk, for ``_promote_read`` to cache once the caller may write."""
        dp = self._device_path
        if dp is not None and dp.owns(keys):
            bag_args = (offsets, weights, combiner, max_norm)
            got: Float32Array = self._lookup_device(
                keys, bag_args, out, promote, found, min_live, later
            )
            return got
        k = self._keys(keys)
        n = k.shape[0]
        if record and self._recorder is not None:
            self._recorder.record("lookup", k, self._db.step)
        bags, shape = parse_lookup(n, self.dim, offsets, weights, combiner, max_norm, out, found)
        if out is None:
            out = np.empty(shape, dtype=np.float32)
        if bags is not None:
            if not (self._chain.has_rows_below and (self._top.locate(k) < 0).any()):
                self._top.lookup_bags(k, bags, min_live, self._default_params(), out)
                if found is not None:
                    found[:] = self._contains(k, min_live)
                return out
            # Some rows may be on disk: read them all, then combine (the fused kernel reads
            # the top tier only).
            values = self._lookup(
                k, None, None, None, None, None, promote, found, min_live, later, False
            )
            cpu.gather_combine(
                values, np.arange(n, dtype=np.int64), bags.bounds, bags.weights, bags.combiner,
                bags.max_norm, out,
            )  # fmt: skip
            return out
        try:  # a probe buffer of this table's that no other lookup is using (list.pop is atomic)
            rows = self._out_rows.pop()
        except IndexError:
            rows = np.empty(0, dtype=np.int64)
        if rows.shape[0] < n:
            rows = np.empty(n, dtype=np.int64)
        missing = self._top.lookup(k, min_live, out, rows[:n])
        # Readers count at once without a lock: each ``counters[name] += n`` (str key, int value)
        # runs without an eval-breaker check between its read and its write, so CPython's GIL
        # is not handed over in between and no count is lost (a lock here cost 0.35 us a call).
        self._chain.count_cache_reads(n - missing, missing, "lookup")
        if found is not None:
            np.greater_equal(rows[:n], 0, out=found)
        if missing:
            miss = rows[:n] < 0
            if self._chain.has_rows_below:
                where = np.flatnonzero(miss)
                have = self._read_below(k[where], promote, later, min_live, out, where)
                if found is not None:
                    found[where] = have
            else:
                self._chain.count_not_found(missing, "lookup")
                out[miss] = self.defaults(k[miss])
        self._out_rows.append(rows)
        return out

    def _device_keys(self, keys: Any) -> Any:
        """Device keys (the device path), checked: an int64 (n,) device array."""
        self._db.check_open()
        if self.config.key_type == "str":
            raise InvalidArgumentError(
                f"keys: table {self.name!r} takes str keys, not a device array"
            )
        assert self._device_path is not None
        return self._device_path.keys(keys)

    def _lookup_device(
        self, keys: Any, bag_args: tuple[Any, Any, str | None, float | None], out: Any,
        promote: bool, found: Any, min_live: int, later: list[Int64Array] | None,
    ) -> Any:  # fmt: skip
        """``_lookup`` of device keys into a device ``out`` (see ``evdb.tiers.device_path``):
        the top tier probes and gathers (and combines bags) on the device; only where keys
        miss do they come to the host, and the rows read below go up in one batched copy."""
        dp = self._device_path
        assert dp is not None
        if found is not None:
            raise InvalidArgumentError("found: not supported with device keys (use contains)")
        k = self._device_keys(keys)
        n = int(k.shape[0])
        if self._recorder is not None:
            self._recorder.record("lookup", dp.keys_to_host(k), self._db.step)
        bags = None if all(a is None for a in bag_args) else dp.bags(n, *bag_args)
        out = dp.check_out(out, (n if bags is None else bags.n_bags, self.dim))
        top = dp.tier
        if bags is not None:
            if self._chain.has_rows_below and bool((top.locate_on_device(k) < 0).any()):
                # Some rows may be below: read them all (on the device where resident), then
                # combine on the device (the fused kernel reads the top tier only).
                values = self._lookup_device(k, (None,) * 4, None, promote, None, min_live, later)
                return dp.combine(values, bags, out)
            top.lookup_bags(k, bags, min_live, self._default_params(), out)
            return out
        rows_dev = dp.empty_keys(n)
        missing = top.lookup(k, min_live, out, rows_dev)
        self._chain.count_cache_reads(n - missing, missing, "lookup")
        if missing:
            miss = np.flatnonzero(dp.keys_to_host(rows_dev) < 0)
            k_miss = dp.keys_to_host(k)[miss]
            if self._chain.has_rows_below:
                values = np.empty((k_miss.shape[0], self.dim), dtype=np.float32)
                self._read_below(k_miss, promote, later, min_live, values, np.arange(miss.size))
            else:
                self._chain.count_not_found(missing, "lookup")
                values = self.defaults(k_miss)
            dp.put_rows(out, miss, values)
        return out

    def _read_below(
        self, keys: Int64Array, promote: bool, later: list[Int64Array] | None, min_live: int,
        out: Float32Array, at: Int64Array,
    ) -> BoolArray:  # fmt: skip
        """Write into ``out[at]`` the values of keys the top tier lacks: their rows below where
        live, else defaults; return which keys had a live row. With ``promote``, the rows
        found are cached (clean); with ``later``, their keys are added to it. Distinct keys'
        rows go from the read into out in one scatter."""
        uniq, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        inverse = inverse.ravel()
        have = np.zeros(uniq.shape[0], dtype=bool)
        found, records = self._fetch(uniq, "lookup")  # (sorted keys: read in this order)
        hit = np.flatnonzero(found)
        if records is not None and len(records):
            live = records.last_step >= min_live
            if not live.all():
                hit, records = hit[live], records.take(live)
            have[hit] = True
            if promote and hit.size:
                self._cache(uniq[hit], records)
            elif later is not None and hit.size:
                later.append(uniq[hit])
        if records is not None and hit.size == uniq.shape[0]:
            values = records.values  # every key found: the rows read are the values
        else:
            values = np.empty((uniq.shape[0], self.dim), dtype=np.float32)
            if records is not None and hit.size:
                values[hit] = records.values
            values[~have] = self.defaults(uniq[~have])  # (they cost a hash each)
        if uniq.shape[0] == keys.shape[0]:
            out[at[first]] = values  # distinct keys: each row lands once, straight from the read
        else:
            out[at] = values[inverse]
        return have[inverse]

    def _promote_read(self, keys: Int64Array) -> None:
        """Cache (clean) the live rows below of keys the top tier still lacks: what a shared
        lookup read from disk, promoted by its caller once it holds the database alone (read
        again: a writer may have changed them in between). A cache fill: a closed database
        skips it."""
        try:
            self._db.check_open()
        except DatabaseClosedError:
            return
        if not self._chain.has_rows_below:
            return
        uniq = np.unique(keys)
        uniq = uniq[self._top.locate(uniq) < 0]
        found, records = self._fetch(uniq)
        if records is None or len(records) == 0:
            return
        live = records.last_step >= self._min_live()
        at = np.flatnonzero(found)[live]
        if at.size:
            self._cache(uniq[at], records.take(live))

    def _cache(self, keys: Int64Array, records: RecordBatch) -> None:
        """Cache rows read from below (clean), then evict down to the watermark: the rows just
        cached are not victims of their own promotion."""
        rows = self._chain.promote(keys, records, dirty=False)
        self._chain.evict(self._db.step, self._min_live(), protect=rows)

    @reading
    def contains(self, keys: Any, *, step: int | None = None) -> BoolArray:
        """(n,) bool: whether each key has a live row (at ``step``, default ``db.step``)."""
        return self._contains(self._keys(keys), self._min_live(step))

    def _contains(self, k: Int64Array, min_live: int) -> BoolArray:
        rows = self._top.locate(k)
        live = rows >= 0
        live[self._expired(rows, min_live)] = False
        uncached = np.flatnonzero(rows < 0)
        if uncached.size and self._chain.has_rows_below:
            found, records = self._fetch(k[uncached])
            if records is not None:
                live[uncached[found]] = records.last_step >= min_live
        return live

    @reading
    def read_records(self, keys: Any, *, step: int | None = None) -> tuple[BoolArray, RecordBatch]:
        """Whole records of keys' live rows (at ``step``, default ``db.step``), from
        whichever tier holds the truth: (found (n,), the records of the found keys, in key
        order). Changes nothing."""
        k = self._keys(keys)
        min_live = self._min_live(step)
        rows = self._top.locate(k)
        uncached = np.flatnonzero(rows < 0)  # an expired cached row hides its copy below
        rows[self._expired(rows, min_live)] = -1
        found = rows >= 0
        parts = [(np.flatnonzero(found), self._top.read(rows[found]))]
        if uncached.size and self._chain.has_rows_below:
            hit, records = self._fetch(k[uncached])
            if records is not None:
                live = records.last_step >= min_live
                at = uncached[hit][live]
                found[at] = True
                parts.append((at, records.take(live)))
        order = np.argsort(np.concatenate([p[0] for p in parts]), kind="stable")
        merged = RecordBatch(
            *(np.concatenate([getattr(p[1], f) for p in parts])[order] for f in FIELDS)
        )
        return found, merged
