"""The dashboard's time series: a ring buffer of samples of the server's own metrics.

Every ``interval_s`` seconds (5 by default; an hour of them is kept) :class:`Sampler` reads
the Prometheus exposition, the text ``/metrics`` serves, so with several workers the request
counts and latencies are the sums over every worker, as ``/metrics`` sums them. The table
figures (DRAM hits and misses, evictions and promotions since this server first read the
table) are this worker's own: each worker reads them from its own tables.

A sample holds cumulative counters; :meth:`Sampler.series` turns consecutive samples into
rates, hit rates and latency quantiles over each interval (a quantile interpolated within its
histogram bucket, as Prometheus' ``histogram_quantile`` does). The series ends with a sample
taken when it is asked for, so a page sees requests made since the last tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client.parser import text_string_to_metric_families

from .metrics import Since

if TYPE_CHECKING:
    from .metrics import Metrics
    from .snapshots import Snapshot, SnapshotHolder

log = logging.getLogger("evdb.api")

# The routes whose requests are lookups (what the request-rate and latency series count).
LOOKUP_ENDPOINTS = frozenset(
    {
        "/v1/tables/{name}/lookup",
        "/v2/models/{model}/infer",
        "/v2/models/{model}/versions/{version}/infer",
        "/inference.GRPCInferenceService/ModelInfer",  # api.grpc_service
    }
)
QUANTILES = (0.5, 0.95, 0.99)
# Counters read from Table.stats(): the top tier's evictions and promotions, counted from
# when this server first read the table (until then they are the writer's: an export's
# evictions are not this server's). A server reads a snapshot and never pulls, admits or
# writes back, so admission refusals and write-backs are not series of it.
TABLE_COUNTERS = ("evictions", "promotions")


@dataclass
class TableSample:
    lookups: float = 0.0
    buckets: dict[float, float] = field(default_factory=dict)  # le -> cumulative count
    served: float = 0.0
    missing: float = 0.0
    hits: float = 0.0
    misses: float = 0.0
    counters: dict[str, float] = field(default_factory=dict)


@dataclass
class Sample:
    t: float
    tables: dict[str, TableSample]


def read_sample(metrics: Metrics, holder: SnapshotHolder, baselines: Since | None = None) -> Sample:
    """The cumulative figures now: the exposition's (every worker's) and this worker's
    tables' counters (since ``baselines`` first saw each table)."""
    baselines = baselines or Since()
    tables: dict[str, TableSample] = {}

    def of(name: str) -> TableSample:
        return tables.setdefault(name, TableSample())

    text = metrics.exposition().decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = s.labels
            table = labels.get("table", "")
            if not table:
                continue
            if s.name == "evdb_requests_total" and labels.get("endpoint") in LOOKUP_ENDPOINTS:
                of(table).lookups += s.value
            elif (
                s.name == "evdb_request_duration_seconds_bucket"
                and labels.get("endpoint") in LOOKUP_ENDPOINTS
            ):
                le = float(labels["le"])
                b = of(table).buckets
                b[le] = b.get(le, 0.0) + s.value
            elif s.name == "evdb_rows_served_total":
                of(table).served += s.value
            elif s.name == "evdb_keys_missing_total":
                of(table).missing += s.value
            elif s.name == "evdb_cache_hits_total":
                of(table).hits += s.value
            elif s.name == "evdb_cache_misses_total":
                of(table).misses += s.value
    snap = holder.acquire()
    if snap is not None:
        try:
            for name, t in snap.tables.items():
                stats = t.stats()
                top = next(iter(stats["tiers"].values()))
                counters = {c: float(top.get(c, 0)) for c in TABLE_COUNTERS}
                of(name).counters = baselines(name, t, counters)
        finally:
            holder.release(snap)
    return Sample(time.time(), tables)


def _delta(now: float, before: float) -> float:
    """How much a counter grew; a counter that went back (a reload reset it) grew by its
    whole new value."""
    return now - before if now >= before else now


def quantile(q: float, buckets: dict[float, float]) -> float | None:
    """The q-quantile of a histogram's cumulative bucket counts (None without observations),
    interpolated linearly within its bucket; the +Inf bucket answers its lower bound."""
    edges = sorted(buckets)
    if not edges or buckets[edges[-1]] <= 0:
        return None
    rank = q * buckets[edges[-1]]
    lower, below = 0.0, 0.0
    for le in edges:
        count = buckets[le]
        if count >= rank:
            if math.isinf(le):
                return lower
            share = (rank - below) / (count - below) if count > below else 1.0
            return lower + (le - lower) * share
        lower, below = le, count
    return lower  # pragma: no cover (the last bucket holds every observation)


class Sampler:
    """A ring buffer of :class:`Sample`, filled every ``interval_s`` by :meth:`run`."""

    def __init__(
        self,
        metrics: Metrics,
        holder: SnapshotHolder,
        interval_s: float,
        keep_s: float = 3600,
        after_tick: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.metrics = metrics
        self.holder = holder
        self.interval_s = interval_s
        self.after_tick = after_tick  # the dashboard's sampling of a new snapshot's rows
        self.ring: deque[Sample] = deque(maxlen=max(2, int(keep_s / interval_s)))
        self.baselines = Since()
        holder.on_swap.append(self.opened)

    def opened(self, snap: Snapshot) -> None:
        """Take the counters of a snapshot's new tables before it serves (see Since)."""
        for name, table in snap.tables.items():
            if not self.baselines.knows(name, table):
                top = next(iter(table.stats()["tiers"].values()))
                self.baselines(name, table, {c: float(top.get(c, 0)) for c in TABLE_COUNTERS})

    def tick(self) -> None:
        self.ring.append(read_sample(self.metrics, self.holder, self.baselines))

    async def run(self) -> None:
        """Sample until cancelled. On the event loop: handlers do their table work without
        awaiting, so a sample never reads a table while a request uses it."""
        while True:
            try:
                self.tick()
                if self.after_tick is not None:
                    await self.after_tick()
            except Exception:  # a snapshot closed under a read, say: the next tick goes on
                log.exception("dashboard sampler: a tick failed")
            await asyncio.sleep(self.interval_s)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        task = asyncio.create_task(self.run())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def series(self) -> dict[str, Any]:
        """Per table, the series the dashboard draws: for each sample after the first, the
        cumulative lookups, the lookup rate (/s), p50/p95/p99 latency (ms, None in an interval
        without lookups), the DRAM hit rate and the missing-key rate (None without reads), and
        each table counter with its rate."""
        samples = [*self.ring, read_sample(self.metrics, self.holder, self.baselines)]
        names = sorted({n for s in samples for n in s.tables})
        out: dict[str, Any] = {"interval_s": self.interval_s, "t": [], "tables": {}}
        per: dict[str, dict[str, list[Any]]] = {
            n: {
                key: []
                for key in (
                    "lookups",
                    "lookup_rate",
                    "p50_ms",
                    "p95_ms",
                    "p99_ms",
                    "hit_rate",
                    "missing_rate",
                    *TABLE_COUNTERS,
                    *(f"{c}_rate" for c in TABLE_COUNTERS),
                )
            }
            for n in names
        }
        for prev, cur in itertools.pairwise(samples):
            dt = max(cur.t - prev.t, 1e-9)
            out["t"].append(cur.t)
            for n in names:
                a, b = prev.tables.get(n, TableSample()), cur.tables.get(n, TableSample())
                col = per[n]
                col["lookups"].append(b.lookups)
                col["lookup_rate"].append(_delta(b.lookups, a.lookups) / dt)
                window = {le: _delta(c, a.buckets.get(le, 0.0)) for le, c in b.buckets.items()}
                for q in QUANTILES:
                    v = quantile(q, window)
                    col[f"p{round(q * 100)}_ms"].append(None if v is None else v * 1000)
                hits, misses = _delta(b.hits, a.hits), _delta(b.misses, a.misses)
                col["hit_rate"].append(hits / (hits + misses) if hits + misses else None)
                served = _delta(b.served, a.served)
                missing = _delta(b.missing, a.missing)
                col["missing_rate"].append(missing / served if served else None)
                for c in TABLE_COUNTERS:
                    now, before = b.counters.get(c, 0.0), a.counters.get(c, 0.0)
                    col[c].append(now)
                    col[f"{c}_rate"].append(_delta(now, before) / dt)
        out["tables"] = per
        return out
