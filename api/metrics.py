"""Prometheus metrics, all named ``evdb_*``, in a registry of the app's own.

Labels are the route's template (``/v1/tables/{name}/lookup``, not the path asked for), a
table the snapshot has (anything else is ``""``) and the status code: never a key, never a
client-chosen string, so a client cannot grow the number of series. Request counts and
latencies are recorded by :class:`MetricsMiddleware` (plain ASGI: a ``BaseHTTPMiddleware``
costs a task per request); table figures (rows, DRAM cache hits and misses) are read from
``Table.stats()`` when Prometheus scrapes: ``evdb_reads_total{table, op, tier}`` (the keys
each tier answered, ``tier="not_found"`` those none held, for ``op`` pull and lookup apart), and
per cache tier ``evdb_tier_hits_total`` and ``evdb_tier_misses_total`` with the same labels,
counted from when this server first read the table (:class:`Since`: a database carries its
writer's counts, which are not this server's traffic).

With several workers (``evdb serve --workers N``), prometheus-client's multiprocess mode keeps
each process's counters and histograms in files that :meth:`Metrics.exposition` sums, so a
scrape sees every worker whichever answers it; the table figures, which each worker reads from
its own tables, then carry a ``worker`` label (its pid).
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from evdb.view import ReadableTable, TableView

if TYPE_CHECKING:
    from .snapshots import Snapshot, SnapshotHolder

# Lookups answer in well under a millisecond from DRAM and in milliseconds from disk.
K = TypeVar("K")
OPS = ("pull", "lookup")  # the operations Table.stats() counts reads of, apart
BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class Metrics:
    def __init__(self, holder: SnapshotHolder, multiprocess_dir: Path | None = None) -> None:
        self.multiprocess_dir = multiprocess_dir
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "evdb_requests",
            "HTTP requests answered, by route, table and status.",
            ["endpoint", "table", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "evdb_request_duration_seconds",
            "Time from request to response, by route and table.",
            ["endpoint", "table"],
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.rows_served = Counter(
            "evdb_rows_served",
            "Embedding rows returned (keys looked up), by table.",
            ["table"],
            registry=self.registry,
        )
        self.keys_missing = Counter(
            "evdb_keys_missing",
            "Keys looked up that have no row (served their initializer value), by table.",
            ["table"],
            registry=self.registry,
        )
        self.tables = _TableCollector(holder, worker=multiprocess_dir is not None)
        self.registry.register(self.tables)
        holder.on_swap.append(self.tables.opened)
        # Label children, memoised: ``labels()`` takes a lock and builds a tuple on every
        # call, several microseconds per request. The label sets are bounded (routes x
        # tables x statuses), so these dicts are too.
        self._served: dict[str, tuple[Any, Any]] = {}
        self._answered: dict[tuple[str, str, int], tuple[Any, Any]] = {}
        self._collectors: list[Collector] = [self.tables]  # read at scrape time, per worker

    def add_collector(self, collector: Collector) -> None:
        """Figures read from this worker at scrape time (``api.follow``'s, say)."""
        self.registry.register(collector)
        self._collectors.append(collector)

    def exposition(self) -> bytes:
        """The text format of every metric: this process's, or with several workers the sum
        of all of theirs (and each worker's table figures)."""
        if self.multiprocess_dir is None:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(self.multiprocess_dir))  # type: ignore[no-untyped-call]
        for collector in self._collectors:
            registry.register(collector)
        return generate_latest(registry)

    def served(self, table: str, keys: int, missing: int) -> None:
        children = self._served.get(table)
        if children is None:
            children = self._served.setdefault(
                table, (self.rows_served.labels(table), self.keys_missing.labels(table))
            )
        children[0].inc(keys)
        children[1].inc(missing)

    def answered(self, endpoint: str, table: str, status: int, seconds: float) -> None:
        key = (endpoint, table, status)
        children = self._answered.get(key)
        if children is None:
            children = self._answered.setdefault(
                key,
                (
                    self.requests.labels(endpoint, table, str(status)),
                    self.latency.labels(endpoint, table),
                ),
            )
        children[0].inc()
        children[1].observe(seconds)


class Since:
    """Counters counted from when this server first read each table: a database's stats
    carry its writer's counts (the read counts are saved with it), which are not this
    server's traffic. Keyed by table name and the table object (following a publish root,
    the full's table, which the views of every seq over it share: the counts go on)."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[weakref.ref[Any], dict[Any, float]]] = {}

    def knows(self, name: str, table: ReadableTable) -> bool:
        under = table.table if isinstance(table, TableView) else table
        held = self._held.get(name)
        return held is not None and held[0]() is under

    def __call__(self, name: str, table: ReadableTable, counters: dict[K, float]) -> dict[K, float]:
        under = table.table if isinstance(table, TableView) else table
        held = self._held.get(name)
        if held is None or held[0]() is not under:
            held = self._held[name] = (weakref.ref(under), dict(counters))
        return {k: v - held[1].get(k, 0.0) for k, v in counters.items()}


def read_counters(stats: dict[str, Any]) -> dict[tuple[str, str, str], float]:
    """``Table.stats()``'s read counts, flat: ("reads", op, tier) for the keys each tier
    answered (tier "not_found": none held them), ("hits" | "misses", tier, op) per cache
    tier (hbm, dram)."""
    out: dict[tuple[str, str, str], float] = {}
    for op, by_tier in stats.get("reads", {}).items():
        for tier, n in by_tier.items():
            out["reads", op, tier] = float(n)
    for tier, level in stats["tiers"].items():
        for op in OPS:
            if f"{op}_hits" in level:  # a cache level
                out["hits", tier, op] = float(level[f"{op}_hits"])
                out["misses", tier, op] = float(level[f"{op}_misses"])
    return out


class _TableCollector(Collector):
    """Figures read from the snapshot's tables at scrape time."""

    def __init__(self, holder: SnapshotHolder, worker: bool) -> None:
        self.holder = holder
        self.worker = [str(os.getpid())] if worker else []
        self.since = Since()

    def opened(self, snap: Snapshot) -> None:
        """Take the counts of a snapshot's new tables before it serves (SnapshotHolder's
        ``on_swap``): what they count from then on is this server's."""
        for name, table in snap.tables.items():
            if not self.since.knows(name, table):
                self.reads(name, table, table.stats())

    def reads(self, name: str, table: ReadableTable, stats: dict[str, Any]) -> dict[Any, float]:
        """:func:`read_counters` of ``stats``, this server's (since it first read the table)."""
        return self.since(name, table, read_counters(stats))

    def collect(self) -> Iterator[Metric]:
        by = ["table", "worker"] if self.worker else ["table"]
        rows = GaugeMetricFamily("evdb_table_rows", "Live rows, by table.", labels=by)
        hits = CounterMetricFamily(
            "evdb_cache_hits", "Keys found in the DRAM cache, by table.", labels=by
        )
        misses = CounterMetricFamily(
            "evdb_cache_misses",
            "Keys not in the DRAM cache (read from RocksDB or absent), by table.",
            labels=by,
        )
        reads = CounterMetricFamily(
            "evdb_reads",
            "Keys read, by table, operation (pull, lookup) and the tier that answered them "
            "(hbm, dram, rocksdb; not_found: no tier held the key).",
            labels=[*by, "op", "tier"],
        )
        tier_hits = CounterMetricFamily(
            "evdb_tier_hits",
            "Keys a cache tier (hbm, dram) held when asked, by table, tier and operation.",
            labels=[*by, "tier", "op"],
        )
        tier_misses = CounterMetricFamily(
            "evdb_tier_misses",
            "Keys a cache tier (hbm, dram) did not hold when asked, by table, tier and "
            "operation (asked of the tier below).",
            labels=[*by, "tier", "op"],
        )
        reloads = CounterMetricFamily(
            "evdb_snapshot_reloads", "Snapshots swapped in.", labels=by[1:]
        )
        reloads.add_metric(self.worker, self.holder.reloads)
        snap = self.holder.acquire()
        if snap is not None:
            try:
                for name, table in snap.tables.items():
                    stats = table.stats()
                    dram = stats["tiers"]["dram"]
                    labels = [name, *self.worker]
                    rows.add_metric(labels, stats["rows"])
                    hits.add_metric(labels, dram["hits"])
                    misses.add_metric(labels, dram["misses"])
                    families = {"reads": reads, "hits": tier_hits, "misses": tier_misses}
                    for (kind, a, b), n in self.reads(name, table, stats).items():
                        families[kind].add_metric([*labels, a, b], n)
            finally:
                self.holder.release(snap)
        yield from (rows, hits, misses, reads, tier_hits, tier_misses, reloads)


class MetricsMiddleware:
    """Counts and times every HTTP request by route template, table and status."""

    def __init__(self, app: ASGIApp, metrics: Metrics, holder: SnapshotHolder) -> None:
        self.app = app
        self.metrics = metrics
        self.holder = holder

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = [500]

        async def send_status(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route: Any = scope.get("route")
            endpoint = getattr(route, "path", "unmatched")
            params = scope.get("path_params") or {}
            table = params.get("name", params.get("model", ""))
            snap = self.holder.current
            if snap is None or table not in snap.tables:
                table = ""
            self.metrics.answered(endpoint, table, status[0], time.perf_counter() - start)
