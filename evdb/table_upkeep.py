"""The upkeep of ``Table``: ``compact``, ``stats``, and what is not rows, saved and merged.

``TableUpkeep`` sits between the whole-table reads (``evdb.table_scans.TableScans``) and the
training path (``evdb.table.Table``): reclaiming expired and weak rows from every tier, the
stats report, the state the database saves beside the rows (``flush_state``/``load_state``)
and what resharding carries from old shards to new ones (``summary``/``absorb``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from evdb._types import BoolArray, Int64Array
from evdb.admission import AdmissionState
from evdb.config import TableConfig
from evdb.locking import exclusive, reading
from evdb.table_meta import TableMeta
from evdb.table_scans import TableScans

__all__ = ["TableSummary", "TableUpkeep"]

_SCAN_ROWS = 65536  # rows only on disk are judged by compact a chunk of this many at a time


@dataclasses.dataclass(frozen=True)
class TableSummary:
    """A table's state beside its rows, as ``Table.summary`` copies it."""

    config: TableConfig
    meta: TableMeta
    admission: AdmissionState
    evictions: tuple[int, int]  # the top tier's evictions, and of them expired
    rows: int


class TableUpkeep(TableScans):
    """Compaction, stats and the persistence of a table's state (see ``Table``)."""

    @exclusive
    def compact(self) -> dict[str, int]:
        """Reclaim expired rows and rows with L2 norm below ``l2_threshold`` at ``db.step``.

        Returns ``{"expired": n, "l2": m, "admission_forgotten": c}``: rows removed for each
        reason, and stale pending admission counts forgotten (only with a TTL).
        """
        self._db.check_writable()
        min_live = self._min_live()
        threshold = self.config.l2_threshold
        doomed, n_expired = self._top.doomed(min_live, threshold)
        self._chain.remove_rows(doomed)
        n_l2 = doomed.shape[0] - n_expired
        if self._chain.has_rows_below:
            below_expired, below_l2 = self._compact_below(min_live, threshold)
            n_expired += below_expired
            n_l2 += below_l2
        forgotten = self._admission.compact(min_live) if self.ttl.expires else 0
        if self._strings is not None:  # strings whose row is gone (by any rule, any time)
            self._strings.drop_orphans(self.contains)
        if n_expired or n_l2:
            self.meta.bump()
        return {"expired": n_expired, "l2": n_l2, "admission_forgotten": forgotten}

    def _compact_below(self, min_live: int, threshold: float | None) -> tuple[int, int]:
        """Remove the expired and weak rows that are only on disk, a chunk at a time; returns
        how many of each went."""
        n_expired = n_l2 = 0
        for keys, records in self._chain.scan_below(_SCAN_ROWS):
            dead = records.last_step < min_live
            drop = dead.copy()
            if threshold is not None:
                drop |= ~dead & (np.linalg.norm(records.values, axis=1) < threshold)
            if drop.any():
                self._chain.remove_fetched(keys[drop], records.last_step[drop])
            n_expired += int(np.count_nonzero(dead))
            n_l2 += int(np.count_nonzero(drop & ~dead))
        return n_expired, n_l2

    @reading
    def stats(self) -> dict[str, Any]:
        """Counts that say what the table holds and what its policies did."""
        policy = self.config.admission
        counters = self.meta.counters
        scratch = self._dedup.nbytes + sum(b.nbytes for b in list(self._out_rows))
        return {
            "name": self.name,
            "dim": self.dim,
            "dtype": self.config.dtype,  # how rows are stored (each tier's bytes: "tiers")
            "slot_dtype": self.config.slot_dtype,  # how optimizer slots are stored
            "rows": len(self),
            "step": self._db.step,
            "version": self.meta.version,
            "pushes": self.meta.pushes,
            "tiers": self._chain.stats(),
            "reads": self._chain.read_counts(),
            "scratch_bytes": int(scratch),
            "admission": {
                "policy": policy.kind,
                "min_count": policy.min_count,
                "not_admitted": counters["not_admitted"],
                **self._admission.stats(),
            },
            "expired_on_pull": counters["expired_on_pull"],
            "dropped_gradients": counters["dropped_gradients"],
            "frozen_gradients": counters["frozen_gradients"],
            "pulls_not_pushed": counters["pulls_not_pushed"],
            "changelog": self._changes.stats(),
        }

    # -- persistence (what is not rows; the rows persist in the backing tier) -------------
    @exclusive
    def flush_state(self) -> dict[str, np.ndarray]:
        """Write every dirty row down; returns the table's state that is not rows (its meta,
        the admission's pending counts, the step counts of the rows below), which the
        database saves in its metadata and hands back to ``load_state`` on open."""
        self._chain.flush()
        self._chain.below_steps.raise_floor(self._min_live())  # merges the expired steps' counts
        state = self.meta.to_arrays(self._top.eviction_counts())
        for name, arr in self._admission.to_arrays().items():
            state[f"admission.{name}"] = arr
        state.update(self._chain.to_arrays())  # below_steps.*, backing.*
        return state

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """Restore what ``flush_state`` returned (the backing tier already holds the rows)."""
        self.meta, evictions = TableMeta.from_arrays(state)
        self._top.load_eviction_counts(evictions)
        prefix = "admission."
        self._admission.load_arrays(
            {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
        )
        self._chain.load_arrays(state)  # without a disk tier, every row is loaded into DRAM

    @reading
    def summary(self) -> TableSummary:
        """What the table holds beside its rows, copied (resharding reads it from every old
        shard before any row moves, and hands the list to ``absorb``)."""
        admission = self.config.admission.new_state()
        admission.load_arrays(self._admission.to_arrays())
        return TableSummary(
            self.config, self.meta.copy(), admission, self._top.eviction_counts(), len(self)
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
            self._top.load_eviction_counts(
                (sum(o.evictions[0] for o in olds), sum(o.evictions[1] for o in olds))
            )
