"""``Table``: one row per admitted key, and the only place that knows a whole row's story.

A table validates input before anything changes, deduplicates keys, applies admission and
TTL, stamps ``freq``/``last_step``/``version`` and runs the optimizer; its top tier does the
mechanics on resident rows (``evdb.tiers.base.CacheTier``: fused probe, gather, stamp and
optimizer kernels) and the tiers below only store records. See the README's operations table
for what each call does on a hit and on a miss.

The class has two halves: the state and the reads (``evdb.table_reads.TableReads``, which a
published view also implements) and, here, the writes: the training path (``pull``,
``push``), the direct writes (``upsert``, ``delete``, ``restore_records``), ``compact`` and the
persistence of what is not rows. Its collaborators own their state: ``TableMeta`` (version,
pushes, uid, counters), ``Ttl``, the admission state, the ``PullLedger`` that ties a push to its
pull, the ``ChangeLog`` of a publication.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np

from evdb._types import Float32Array, Int64Array
from evdb.arrays import float_matrix, occurrence_counts
from evdb.config import TableConfig
from evdb.errors import CapacityError, ConfigError, InvalidArgumentError, StorageError
from evdb.kernels import backend
from evdb.locking import exclusive
from evdb.pulled import Pulled, PullLedger, Ticket
from evdb.records import FREQ_MAX, FROZEN, RecordBatch
from evdb.table_upkeep import TableSummary, TableUpkeep
from evdb.tiers.base import Tier
from evdb.tiers.cache_lowp import as_stored
from evdb.tiers.device_path import DeviceBatch
from evdb.tiers.rocks import RocksStrings

if TYPE_CHECKING:
    from evdb.database import Database

__all__ = ["Pulled", "Table", "TableSummary"]

cpu = backend("cpu")  # host kernels: the pull's dedup and the push's grouping of positions

DEDUP_FIRST_KEYS = 8192  # pulls of up to this many keys deduplicate before probing the index


class Table(TableUpkeep):
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
        super().__init__(db, name, config, backing, strings)
        self._optimizer = config.optimizer
        self._ledger = PullLedger(name)

    @property
    def learning_rate(self) -> float:
        """The optimizer's current learning rate (``config.optimizer.lr``)."""
        return float(self._optimizer.lr)

    @learning_rate.setter
    @exclusive
    def learning_rate(self, lr: float) -> None:
        """Change the learning rate of later pushes (LR schedules): ``config.optimizer.lr``
        shows it, the next flush saves it, and a reopen resumes with it (as a torch
        optimizer's state_dict restores its lr); the rest of the rule stays as created."""
        self._optimizer = dataclasses.replace(self._optimizer, lr=lr)  # validates lr
        self.config = dataclasses.replace(self.config, optimizer=self._optimizer)

    # -- row mechanics shared by the writes -----------------------------------------------
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

    def _live_rows(self, keys: Int64Array) -> Int64Array:
        """Rows of keys in the top tier, -1 where absent or expired."""
        rows = self._top.locate(keys)
        rows[self._expired(rows)] = -1
        return rows

    def _drop_expired(self, rows: Int64Array) -> Int64Array:
        """rows, after removing the expired ones (which then start afresh)."""
        if not self.ttl.expires:
            return rows
        stale = self._expired(rows)
        if stale.any():
            self._chain.remove_rows(rows[stale])
            rows[stale] = -1
            self.meta.count("expired_on_pull", int(np.count_nonzero(stale)))
        return rows

    def _promote_misses(self, uniq: Int64Array, rows: Int64Array, op: str | None = None) -> None:
        """Bring the rows of distinct keys the top tier lacks (rows == -1) up from the tier
        below, dirty (the caller changes them next), writing their rows into ``rows``. Rows
        found below but expired are removed there and stay -1: the key starts afresh.
        ``op``: whose reads the levels below count ("pull"), if anyone's."""
        miss = np.flatnonzero(rows < 0)
        if miss.size == 0 or (op is None and not self._chain.has_rows_below):
            return
        found, records = self._chain.fetch(uniq[miss], op)
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

    # -- training path --------------------------------------------------------------------
    def _distinct_rows(
        self, k: Int64Array
    ) -> tuple[Int64Array, Int64Array, Int64Array, Int64Array]:
        """A pull's distinct keys in first-occurrence order, the inverse, the counts and the
        top-tier row of each distinct key (-1 = none). A batch of up to ``DEDUP_FIRST_KEYS`` keys
        is deduplicated first, in a small scratch index, and only its distinct keys probe the
        table's index; a bigger one probes every key (on numba's threads) and deduplicates by
        row (``unique_rows``): on a 1M-row table, 16,384 uniform keys took 0.38 -> 0.18 ms
        deduplicated first, 65,536 keys 1.17 -> 0.91 ms probed first. With a key trace
        attached, the pull's keys are recorded (counted: the distinct keys the tiers'
        counters count); a small batch is sampled in its dedup pass."""
        rec = self._recorder
        if k.shape[0] > DEDUP_FIRST_KEYS:
            rows = self._top.locate(k)
            out = self._dedup.unique_rows(k, rows, int(rows.max(initial=-1)) + 1)
            if rec is not None:
                rec.record("pull", k, self._db.step, counted=out[0].shape[0])
            return out
        if rec is None:
            uniq, inverse, counts = self._dedup.unique(k, keep=True)
        else:  # one pass: each key hashed once, for its dedup slot and its sample decision
            uniq, inverse, counts, kept, hashes = self._dedup.unique_sampled(k, *rec.sampling)
            rec.record_kept("pull", kept, hashes, k.shape[0], self._db.step, uniq.shape[0])
        return uniq, inverse, counts, self._top.locate(uniq)

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

        Device keys (a cupy array, on a table whose HBM tier is on that device) give a batch
        whose ``rows`` are a device array, stamped and gathered on the device, which its
        ``combine`` and ``combine_backward`` keep there and whose ``push`` takes device
        gradients (``evdb.tiers.device_path``). The keys themselves come to the host (8
        bytes each, counted in the HBM tier's ``key_bytes_to_host``) for deduplication,
        admission and the tiers' bookkeeping; rows cross only for misses (one batched upload).
        """
        self._db.check_writable()
        dp = self._device_path  # device keys: device rows (see evdb.tiers.device_path)
        dev = dp if dp is not None and dp.owns(keys) else None
        k = self._keys(keys) if dev is None else dev.keys_to_host(self._device_keys(keys))
        given = None if counts is None else occurrence_counts(counts, k.shape[0], "counts")
        uniq, inverse, counts, found = self._distinct_rows(k)  # (and records them)
        # counts: positions per distinct key (combine and per-position push use them);
        # occurrences: what admission and freq count
        occurrences = counts
        if given is not None:
            occurrences = np.zeros(uniq.shape[0], dtype=np.int64)
            np.add.at(occurrences, inverse, given)
        new_strings = None if self._strings is None else self._strings.check(uniq)
        top = self._top
        cap = top.capacity_rows
        if cap is not None and uniq.shape[0] > cap and not self._chain.spill:
            raise CapacityError(
                f"keys: the batch has {uniq.shape[0]} distinct keys, more than "
                f"dram_rows={cap}, and this table has no lower tier to spill to"
            )
        serial, missed = self._ledger.pulled()
        if missed:
            self.meta.count("pulls_not_pushed", 1)  # the batch before was never pushed
        top.unpin_all()
        version = self.meta.bump()
        rows = self._drop_expired(found)
        n_hits = int(np.count_nonzero(rows >= 0))
        self._chain.count_cache_reads(n_hits, rows.shape[0] - n_hits, "pull")
        if self._chain.has_rows_below:
            self._promote_misses(uniq, rows, "pull")
        elif n_hits < rows.shape[0]:
            self._chain.count_not_found(rows.shape[0] - n_hits, "pull")
        u = uniq.shape[0]
        out = np.empty((u, self.dim), np.float32) if dev is None else dev.empty_rows(u, self.dim)
        # Every row found: freq += count (saturating), last_step, version, the dirty and pinned
        # bits, and its copy into out, in one kernel pass (numpy read-modify-writes per column
        # cost 8x more)
        n_have = top.pull_rows(rows, occurrences, self._db.step, version, out)
        if n_have < u:
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
                    # as the tier stores it: out must hand the trainer the row it holds
                    as_stored(
                        self.config.dtype, self.config.initializer.values(new_keys, self.dim)
                    ),
                    totals,
                    version,
                )
                rows[new] = self._chain.create(new_keys, records)
                top.pin(rows[new])
                if dev is None:
                    out[new] = records.values
                else:  # copied from the tier on the device: no second upload
                    dev.tier.gather_into(out, new, rows[new])
            self.meta.count("not_admitted", int(miss.size - new.size))
            n_have += int(new.size)
        all_in = n_have == u
        admitted = np.ones(u, dtype=bool) if all_in else rows >= 0
        self._chain.evict(self._db.step, self._min_live())
        if not all_in:
            if dev is None:
                out[~admitted] = self.defaults(uniq[~admitted])
            else:
                dev.put_rows(out, np.flatnonzero(~admitted), self.defaults(uniq[~admitted]))
        if self._strings is not None:
            self._strings.store(new_strings, uniq[admitted])
        self._changes.touched(uniq if all_in else uniq[admitted])
        ticket = Ticket(rows, top.frees, serial, self._ledger)
        on_device = None if dev is None else DeviceBatch(dev, inverse)
        return Pulled(
            uniq, inverse, out, admitted, counts, self._db.step, self.name, ticket, on_device
        )

    def check_pushable(self, pulled: Any) -> Ticket:
        """Raise ``InvalidArgumentError`` unless ``pulled`` is this table's latest pull, not
        pushed yet (see ``push``); returns its ticket. A sharded table checks on every rank
        before any exchange."""
        return self._ledger.check(pulled)

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
        ticket = self._ledger.check(pulled)
        u = pulled.keys.shape[0]
        n = pulled.inverse.shape[0]
        shape = ((n if per_position else u), self.dim)
        if pulled.on_device is None:
            g = float_matrix(grads, shape, "grads")
        else:  # a device batch: its gradients stay on the device
            g = pulled.on_device.path.float_matrix(grads, shape, "grads")
        if per_position:  # positions grouped by key: the kernel sums each key's segment
            bounds = np.zeros(u + 1, dtype=np.int64)
            np.cumsum(pulled.counts, out=bounds[1:])
            positions = np.empty(n, dtype=np.int64)
            cpu.group_positions(pulled.inverse, bounds, positions)
        else:
            bounds = np.arange(u + 1, dtype=np.int64)
            positions = bounds[:-1]
        top = self._top
        if ticket.frees == top.frees:
            rows = ticket.rows.copy()  # no row was freed since the pull: they still hold
            if self.ttl.expires:  # but they may have expired meanwhile
                rows[self._expired(rows)] = -1
        else:
            rows = self._live_rows(pulled.keys)
            rows[~pulled.admitted] = -1
            # Rows evicted since (no top-tier row at all; an expired one stays expired): bring
            # them back from below.
            gone = np.flatnonzero(pulled.admitted & (top.locate(pulled.keys) < 0))
            if gone.size and self._chain.has_rows_below:
                back = rows[gone]
                self._promote_misses(pulled.keys[gone], back)
                rows[gone] = back
        version = self.meta.bump()
        self.meta.pushes += 1
        self._ledger.pushing(ticket, self._db.step, self.config.ttl_steps)
        # Frozen rows leave the update (read by training, never changed by it); every other
        # row is stamped (last_step, version, dirty) in the same pass. Nothing below can fail:
        # the gradients were checked finite above.
        hyper = self._optimizer.hyper(self._db.step, self.meta.pushes)
        dropped, frozen = top.apply(
            rows, g, positions, bounds, self._optimizer.code, hyper, self._db.step, version
        )
        self.meta.count("dropped_gradients", dropped)
        self.meta.count("frozen_gradients", frozen)
        top.unpin_all()
        self._changes.touched(pulled.keys[pulled.admitted])
        self._evict_after_write("push")

    # -- direct writes --------------------------------------------------------------------
    @exclusive
    def upsert(self, keys: Any, values: Any, *, freeze: bool | None = None) -> None:
        """Set rows' values, creating rows as needed (admission is bypassed).

        An existing row keeps its optimizer slots and frequency; a new, re-created or expired
        one starts with fresh slots. A key given twice takes its last value. ``freeze=True``
        marks the rows frozen (``push`` reads them but never changes them: pre-trained
        vectors), ``False`` unfreezes them, None leaves existing rows as they were (new rows
        are not frozen).
        """
        self._db.check_writable()
        k = self._keys(keys)
        v = float_matrix(values, (k.shape[0], self.dim), "values")
        uniq, inverse, _ = self._dedup.unique(k)
        new_strings = None if self._strings is None else self._strings.check(uniq)
        last = np.zeros(uniq.shape[0], dtype=np.int64)
        np.maximum.at(last, inverse, np.arange(k.shape[0], dtype=np.int64))
        v = v[last]
        self._check_room(uniq, "keys")
        if self._strings is not None:  # first: a write that fails here has changed no row
            self._strings.store(new_strings, uniq)
        version = self.meta.bump()
        rows = self._drop_expired(self._top.locate(uniq))
        self._promote_misses(uniq, rows)  # a row on disk keeps its slots and freq
        have = rows >= 0
        self._top.assign(rows[have], v[have], self._db.step, version, freeze)
        if not have.all():
            new_keys = uniq[~have]
            zero = np.zeros(new_keys.shape[0], dtype=np.int64)
            records = self._fresh_records(new_keys, v[~have], zero, version)
            if freeze:
                records.flags[:] = FROZEN
            rows[~have] = self._chain.create(new_keys, records)
        self._changes.touched(uniq)
        self._admission.forget(uniq)
        # Without a disk tier, the rows just written are not victims of their own insert;
        # with one, they may go straight down to it.
        self._evict_after_write("upsert", None if self._chain.spill else rows)

    def _check_room(self, keys: Int64Array, arg: str) -> None:
        """Raise before any change if keys cannot all be resident with the pinned batch."""
        cap = self._top.capacity_rows
        if cap is None or self._chain.spill:
            return
        rows = self._live_rows(keys)
        found = rows >= 0
        pinned_here = np.zeros(rows.shape[0], dtype=bool)
        pinned_here[found] = self._top.pinned(rows[found])
        extra = int(np.count_nonzero(~pinned_here))
        pinned = self._top.n_pinned(self._min_live())
        if pinned + extra > cap:
            raise CapacityError(
                f"{arg}: {keys.shape[0]} distinct keys plus {pinned} rows of the batch in "
                f"flight need {pinned + extra} resident rows, more than dram_rows={cap}, and "
                "this table has no lower tier to spill to"
            )

    @exclusive
    def delete(self, keys: Any) -> int:
        """Remove keys' rows and pending admission counts; returns how many live rows went."""
        self._db.check_writable()
        k = self._keys(keys)
        uniq, _, _ = self._dedup.unique(k)
        rows = self._top.locate(uniq)
        cached = rows >= 0
        n_live = int(np.count_nonzero(cached & ~self._expired(rows)))
        self._chain.remove_rows(rows[cached])
        if not cached.all() and self._chain.has_rows_below:
            _, records = self._chain.remove_uncached(uniq[~cached])
            if records is not None:
                n_live += int(np.count_nonzero(records.last_step >= self._min_live()))
        self._admission.forget(uniq)
        if self._strings is not None:
            self._strings.remove(uniq)
        if n_live:
            self.meta.bump()
        return n_live

    @exclusive
    def restore_records(self, keys: Any, records: RecordBatch) -> None:
        """Put whole records (values, slots, ``freq``, ``last_step``, ``version``, flags) for
        distinct keys the table holds no row of, as they are: how resharding and
        publications move rows. Rows beyond the top tier's room spill down as training's
        would; a table that cannot spill refuses a batch it has no room for
        (``CapacityError``), dropping nothing."""
        self._db.check_writable()
        k = np.ascontiguousarray(keys, dtype=np.int64)
        n = k.shape[0]
        if n == 0:
            return
        cap = self._top.capacity_rows
        if cap is not None and not self._chain.spill and len(self._top) + n > cap:
            raise CapacityError(
                f"keys: {len(self._top) + n} rows do not fit dram_rows={cap} of table "
                f"{self.name!r}, which has no lower tier to spill to"
            )
        self._chain.create(k, records)
        self._changes.touched(k)  # new rows: the next publication carries them
        self.meta.version = max(self.meta.version, int(records.version.max()))
        self._chain.evict(self._db.step, self._min_live())

    @exclusive
    def restore_strings(self, keys: Any, strings: list[str]) -> None:
        """Put the original strings of keys whose records ``restore_records`` put (a table
        copied with its strings); a table that does not keep strings refuses."""
        self._db.check_writable()
        if self._strings is None:
            raise ConfigError(f"table {self.name!r} does not keep its strings (keep_strings)")
        k = np.ascontiguousarray(keys, dtype=np.int64)
        if k.shape[0] != len(strings):
            raise InvalidArgumentError(
                f"strings: {len(strings)} strings for {k.shape[0]} keys; give one a key"
            )
        if k.shape[0]:
            self._strings.stored.put(k, strings)

    def __repr__(self) -> str:
        return f"Table({self.name!r}, dim={self.dim}, key_type={self.config.key_type!r})"
