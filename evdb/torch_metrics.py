"""Training-side metrics: each table's figures written to a TensorBoard ``SummaryWriter`` (or
anything with ``add_scalar(tag, value, step)``) once a step or every few, under the names the
server's ``/metrics`` uses (``evdb_table_rows``, ``evdb_reads``, ``evdb_tier_hits``...), so a
trainer's curves and a server's dashboards read alike::

    from torch.utils.tensorboard import SummaryWriter
    log = StatsLogger(SummaryWriter("runs/x"), [db.table("user"), db.table("item")])
    for step, batch in enumerate(loader):
        ...
        if step % 100 == 0:
            log.log(step)

Counts are totals since the table was created; rates are over the interval since the last
``log`` (the keys each tier answered, over the keys asked).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from evdb.torch_autograd import AnyTable

__all__ = ["StatsLogger"]


class ScalarWriter(Protocol):
    def add_scalar(self, tag: str, scalar_value: float, global_step: int) -> Any: ...


class StatsLogger:
    """Writes tables' ``stats()`` to a scalar writer (a sharded table's stats are collective:
    call ``log`` on every rank, give rank 0 the real writer)."""

    def __init__(self, writer: ScalarWriter | None, tables: Iterable[AnyTable]) -> None:
        self.writer = writer
        self.tables = list(tables)
        self._last: dict[str, dict[str, dict[str, int]]] = {}

    def log(self, step: int) -> dict[str, float]:
        """Write every table's figures at ``step``; returns them by tag."""
        out: dict[str, float] = {}
        for t in self.tables:
            s = t.stats()
            name = s["name"]
            out[f"evdb_table_rows/{name}"] = s["rows"]
            for tier, level in s["tiers"].items():
                out[f"evdb_tier_rows/{name}/{tier}"] = level["rows"]
                out[f"evdb_evictions/{name}/{tier}"] = level.get("evictions", 0)
            out[f"evdb_not_admitted/{name}"] = s["admission"]["not_admitted"]
            out[f"evdb_expired_on_pull/{name}"] = s["expired_on_pull"]
            reads = s.get("reads", {})
            last = self._last.get(name, {})
            for op, counts in reads.items():
                asked = sum(counts.values()) - sum(last.get(op, {}).values())
                for tier, n in counts.items():
                    out[f"evdb_reads/{name}/{op}/{tier}"] = n
                    if asked > 0:
                        answered = n - last.get(op, {}).get(tier, 0)
                        out[f"evdb_read_share/{name}/{op}/{tier}"] = answered / asked
            self._last[name] = {op: dict(c) for op, c in reads.items()}
        if self.writer is not None:
            for tag, value in out.items():
                self.writer.add_scalar(tag, float(value), step)
        return out
