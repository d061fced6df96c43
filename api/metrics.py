"""Prometheus metrics, all named ``evdb_*``, in a registry of the app's own.

Labels are the route's template (``/v1/tables/{name}/lookup``, not the path asked for), a
table the snapshot has (anything else is ``""``) and the status code: never a key, never a
client-chosen string, so a client cannot grow the number of series. Request counts and
latencies are recorded by :class:`MetricsMiddleware` (plain ASGI: a ``BaseHTTPMiddleware``
costs a task per request); table figures (rows, DRAM cache hits and misses) are read from
``Table.stats()`` when Prometheus scrapes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

if TYPE_CHECKING:
    from .snapshots import SnapshotHolder

# Lookups answer in well under a millisecond from DRAM and in milliseconds from disk.
BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class Metrics:
    def __init__(self, holder: SnapshotHolder) -> None:
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
        self.registry.register(_TableCollector(holder))
        # Label children, memoised: ``labels()`` takes a lock and builds a tuple on every
        # call, several microseconds per request. The label sets are bounded (routes x
        # tables x statuses), so these dicts are too.
        self._served: dict[str, tuple[Any, Any]] = {}
        self._answered: dict[tuple[str, str, int], tuple[Any, Any]] = {}

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


class _TableCollector(Collector):
    """Figures read from the snapshot's tables at scrape time."""

    def __init__(self, holder: SnapshotHolder) -> None:
        self.holder = holder

    def collect(self) -> Iterator[Metric]:
        rows = GaugeMetricFamily("evdb_table_rows", "Live rows, by table.", labels=["table"])
        hits = CounterMetricFamily(
            "evdb_cache_hits", "Keys found in the DRAM cache, by table.", labels=["table"]
        )
        misses = CounterMetricFamily(
            "evdb_cache_misses",
            "Keys not in the DRAM cache (read from RocksDB or absent), by table.",
            labels=["table"],
        )
        reloads = CounterMetricFamily("evdb_snapshot_reloads", "Snapshots swapped in.")
        reloads.add_metric([], self.holder.reloads)
        snap = self.holder.acquire()
        if snap is not None:
            try:
                for name, table in snap.tables.items():
                    stats = table.stats()
                    dram = stats["tiers"]["dram"]
                    rows.add_metric([name], stats["rows"])
                    hits.add_metric([name], dram["hits"])
                    misses.add_metric([name], dram["misses"])
            finally:
                self.holder.release(snap)
        yield from (rows, hits, misses, reloads)


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
