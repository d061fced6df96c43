"""``/dashboard``: the page an operator looks at, and the read-only JSON behind it.

The page is static HTML, one script of ours (``static/dashboard.js``) and uPlot, vendored in
``static/`` (``static/VENDORED.md``): nothing is fetched from anywhere but this server, and
every response of the page carries ``Content-Security-Policy: default-src 'self'``.

JSON, under ``/v1/dashboard`` (no admin action, nothing changes):

- ``summary``: the status strip (snapshot, version, step, staleness, uptime, workers) and per
  table its rows, dim, key type, each tier's rows and bytes against its capacity, and
  ``Table.stats()`` itself;
- ``series``: the :class:`~evdb.api.sampler.Sampler`'s ring buffer as rates and quantiles;
- ``tables/{name}/distributions`` and ``tables/{name}/projection``: computed from a sample of
  at most 10,000 rows (``evdb.sampling``) taken once per snapshot, not per page load: the key
  frequencies as a log-log rank/frequency curve with its fitted slope, the rows' ages
  (``step - last_step``) as a histogram against the TTL, and a 2-D PCA of at most 5,000 rows;
- ``tables/{name}/sizing`` (POST, a key trace in the body): ``evdb size`` of the trace
  (``dashboard_sizing``), for the Sizing view.

Every table is read as a ``ReadableTable`` (``evdb.view``): following a publish root, the
publication's view, whose sample ``evdb.view_sample.SampleCache`` builds from its full's.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field

import evdb
from evdb.sampling import RowSample
from evdb.view import ReadableTable, TableView
from evdb.view_sample import SampleCache

from . import dashboard_sizing
from .codec import JSON, ApiError, dumps
from .deps import settings_of, table_of, use_snapshot
from .openapi import error_responses
from .schemas import Error
from .snapshots import Snapshot, SnapshotHolder

STATIC = Path(__file__).parent / "static"
CSP = {"Content-Security-Policy": "default-src 'self'", "X-Content-Type-Options": "nosniff"}
# The page's files: name -> media type (anything else under static/ is not served).
PAGE_FILES = {
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard_sizing.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
    "uPlot.iife.min.js": "text/javascript; charset=utf-8",
    "uPlot.min.css": "text/css; charset=utf-8",
}
SAMPLE_ROWS = 10_000
PROJECTED_ROWS = 5_000
AGE_BUCKETS = 20
RANK_POINTS = 200  # rank/frequency points drawn (log-spaced ranks)
FIT_MIN_FREQ = 5  # counts below this are mostly rounding: 1 and 2 differ by a factor of 2
STARTED = time.time()

router = APIRouter(tags=["dashboard"])
ERRORS = error_responses(Error, 404, 503)


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class Summary(_Open):
    server: dict[str, Any] = Field(
        description="path, version, step, loaded_at (and seq, published when following a "
        "publish root), publish_root, staleness_s (since the data served was written or "
        "published), loaded_s, uptime_s, workers, sample_interval_s, reloads, evdb_version, "
        "pid (the worker that answered)"
    )
    tables: list[dict[str, Any]] = Field(
        description="Per table: name, dim, key_type, rows, ttl_steps, tiers (name, rows, "
        "capacity, bytes, fill), hit_rates (per cache tier, per operation: the share of the "
        "keys asked of it that it held, or null), reads (per operation, the keys each tier "
        "answered and not_found), found_rate (per operation), all three this server's (since "
        "it first read the table), stats (Table.stats())"
    )


class Series(_Open):
    interval_s: float
    t: list[float] = Field(description="Unix time of each sample (the last one: now).")
    tables: dict[str, dict[str, list[float | None]]] = Field(
        description="Per table: lookups (cumulative), lookup_rate (/s), p50_ms, p95_ms, "
        "p99_ms, hit_rate, missing_rate, and evictions and promotions (this server's, since "
        "it first read the table) with their _rate"
    )


class Distributions(_Open):
    table: str
    version: str = Field(description="The snapshot the figures are of (the summary's).")
    seq: int | None = Field(description="Following a publish root: the publication's seq.")
    sample_rows: int
    rows: int
    frequency: dict[str, Any] = Field(description="rank, freq, slope, fit (ranks fitted)")
    counted: bool = Field(description="Whether frequency holds this version's pull counts.")
    frequency_note: str | None = Field(description="Why not, where it does not.")
    age: dict[str, Any] = Field(
        description="edges, counts, ttl_steps, step, shown (whether the ages say anything) "
        "and note (why not)"
    )


class Projection(_Open):
    table: str
    version: str
    seq: int | None
    x: list[float]
    y: list[float]
    labels: list[str]
    explained: list[float] = Field(description="Variance share of each of the two axes.")


# -- the figures ----------------------------------------------------------------------------


def rank_frequency(freq: np.ndarray) -> dict[str, Any]:
    """Frequencies sorted down against their rank (log-spaced ranks, at most RANK_POINTS),
    and the least-squares slope of log f against log rank over the ranks whose count is at
    least FIT_MIN_FREQ (all counted ones if fewer than 5 are), each decade weighted alike.
    A row sample scales every rank by the same factor, which leaves the slope as it is."""
    f = np.sort(freq[freq > 0])[::-1].astype(np.float64)
    if f.size == 0:
        return {"rank": [], "freq": [], "slope": None, "fit": [0, 0]}
    picks = np.unique(np.geomspace(1, f.size, num=min(RANK_POINTS, f.size)).astype(np.int64))
    last = int(np.count_nonzero(f >= FIT_MIN_FREQ))
    if last < 5:
        last = f.size
    fit = picks[picks <= last]
    slope = None
    if fit.size >= 2 and f[fit[0] - 1] != f[fit[-1] - 1]:
        slope = float(np.polyfit(np.log(fit), np.log(f[fit - 1]), 1)[0])
    return {"rank": picks.tolist(), "freq": f[picks - 1].tolist(), "slope": slope,
            "fit": [1, last]}  # fmt: skip


def age_histogram(sample: RowSample, ttl_steps: int | None) -> dict[str, Any]:
    """Rows' ages ``step - last_step`` in AGE_BUCKETS equal buckets over [0, ttl_steps] (the
    oldest live age), or over [0, the oldest age] without a TTL. ``shown`` is False (and
    ``note`` says why) where the figure says nothing: no live rows, or every age 0 with no
    TTL (a serving export stamps every row with its own step)."""
    ages = sample.step - sample.last_step
    top = ttl_steps if ttl_steps is not None else int(ages.max(initial=0))
    counts, edges = np.histogram(ages, bins=AGE_BUCKETS, range=(0, max(top, 1)))
    note = None
    if ages.size == 0:
        note = "no live rows"
    elif ttl_steps is None and top == 0:
        note = (
            f"every sampled row was last updated at step {sample.step:,} (a serving export "
            "stamps its rows with its own step) and there is no TTL: no ages to show"
        )
    return {
        "edges": edges.tolist(),
        "counts": counts.tolist(),
        "ttl_steps": ttl_steps,
        "step": sample.step,
        "shown": note is None,
        "note": note,
    }


NO_COUNTS = (
    "No pull counts in this snapshot (a serving export keeps values only; serve the "
    "checkpoint or the database to see them)."
)


def frequency_figure(table: ReadableTable, sample: RowSample) -> tuple[dict[str, Any], str | None]:
    """(the rank/frequency figure, None) of the sample's pull counts, or (an empty figure, why)
    where they are not the counts of the version served: none counted (a serving export), or,
    following a publish root, sampled rows changed by deltas since the full publication
    (deltas carry no pull counts: a fit over the other rows would be of another version)."""
    empty = {"rank": [], "freq": [], "slope": None, "fit": [0, 0]}
    if not np.any(sample.freq > 0):
        return empty, NO_COUNTS
    if isinstance(table, TableView) and table.overlay.n_rows:
        changed = int(np.count_nonzero(table.overlay.rows.holds(sample.keys)))
        if changed:
            return empty, (
                f"{changed:,} of the {sample.keys.shape[0]:,} sampled rows changed since the "
                "full publication, and deltas carry no pull counts: this version's counts are "
                "not known (they are again after the next full publication)."
            )
    return rank_frequency(sample.freq), None


def pca_2d(values: np.ndarray) -> tuple[np.ndarray, list[float]]:
    """(m, 2) coordinates on the two main axes of the centred rows, and each axis' share of
    the variance."""
    if values.shape[0] == 0:
        return np.zeros((0, 2)), [0.0, 0.0]
    centred = values.astype(np.float64) - values.mean(axis=0)
    _, s, vt = np.linalg.svd(centred, full_matrices=False)
    axes = vt[:2]
    xy = centred @ axes.T
    if xy.shape[1] < 2:  # a table of dim 1: the second axis is flat
        xy = np.hstack([xy, np.zeros((xy.shape[0], 1))])
    var = s**2
    share = (var[:2] / var.sum()).tolist() if var.sum() > 0 else [0.0, 0.0]
    return xy, [*share, 0.0][:2]


def _labels(table: ReadableTable, keys: np.ndarray) -> list[str]:
    if table.keeps_strings:
        strings = table.strings(keys)
        return [s if s is not None else str(k) for s, k in zip(strings, keys.tolist(), strict=True)]
    return [str(k) for k in keys.tolist()]


@dataclass
class TableFigures:
    """A table's figures, all of one snapshot (``version``; ``seq`` following a root)."""

    version: str
    distributions: dict[str, Any]
    projection: dict[str, Any]


class Views:
    """Each table's sampled figures, computed once per snapshot or publication: ahead of time
    by :meth:`warm` (the sampler runs it after each tick), or by the first request that needs
    them before that. The row samples are kept in ``samples`` (a ``SampleCache``): following
    a publish root, a publication's sample is its full's with the publication's newer rows
    merged in, so a full is scanned once, not once per publication.
    """

    def __init__(self, holder: SnapshotHolder) -> None:
        self.holder = holder
        self.samples = SampleCache(SAMPLE_ROWS)
        self._snap: Snapshot | None = None
        self._views: dict[str, TableFigures] = {}

    def computed(self) -> list[str]:
        """The tables of the current snapshot whose figures are computed, sorted."""
        return sorted(self._views)

    def get(self, snap: Snapshot, name: str) -> TableFigures:
        self._forget_old(snap)
        view = self._views.get(name)
        if view is None:
            table = table_of(snap, name)
            view = self._views[name] = _compute(snap, name, self.samples.sample(table))
        return view

    def _forget_old(self, snap: Snapshot) -> None:
        if snap is not self._snap:
            self._snap, self._views = snap, {}

    async def warm(self) -> None:
        """Sample the current snapshot's tables that have no figures yet, giving the event
        loop back after every chunk scanned: a 1M-row table mostly on disk takes seconds to
        scan, which would otherwise stall every request meanwhile."""
        snap = self.holder.acquire()
        if snap is None:
            return
        try:
            self._forget_old(snap)
            for name, table in list(snap.tables.items()):
                if name in self._views:
                    continue
                sample = None
                for sample in self.samples.steps(table):  # None until the scan's end
                    if sample is None:
                        await asyncio.sleep(0)
                        if self.holder.current is not snap or name in self._views:
                            return  # a reload meanwhile, or a request computed it: again
                assert sample is not None
                if self._snap is not snap:  # a request moved on to a newer snapshot meanwhile
                    return
                self._views[name] = _compute(snap, name, sample)
        finally:
            self.holder.release(snap)


def _compute(snap: Snapshot, name: str, sample: RowSample) -> TableFigures:
    table = snap.tables[name]
    freq, why = frequency_figure(table, sample)
    version = {"version": snap.version, "seq": snap.seq}  # what the page checks it against
    dist = {
        "table": name,
        **version,
        "sample_rows": int(sample.keys.shape[0]),
        "rows": sample.total,
        "frequency": freq,
        "counted": why is None,
        "frequency_note": why,
        "age": age_histogram(sample, table.config.ttl_steps),
    }
    head = slice(0, PROJECTED_ROWS)
    xy, share = pca_2d(sample.values[head])
    proj = {
        "table": name,
        **version,
        "x": xy[:, 0].round(5).tolist(),
        "y": xy[:, 1].round(5).tolist(),
        "labels": _labels(table, sample.keys[head]),
        "explained": share,
    }
    return TableFigures(snap.version, dist, proj)


def _tiers(table: ReadableTable, stats: dict[str, Any]) -> list[dict[str, Any]]:
    """Each tier's rows and bytes against its capacity; following a publish root, the tiers
    hold the full publication (``server.full_seq``) and an ``overlay`` row the rows and
    tombstones of the deltas since, held in memory over it."""
    out = []
    for name, level in stats["tiers"].items():
        cap = level.get("capacity")
        out.append(
            {
                "name": name,
                "rows": level.get("rows", 0),
                "capacity": cap,
                "bytes": level.get("bytes", 0),
                "fill": None if not cap else level.get("rows", 0) / cap,
            }
        )
    if isinstance(table, TableView) and stats.get("overlay_rows") is not None:
        layers = table.overlay.layers
        held = sum(a.nbytes for r in layers for a in (r.keys, r.values, r.last_step, r.removed))
        out.append(
            {
                "name": "overlay",
                "rows": table.overlay.n_rows,
                "capacity": None,
                "bytes": held,
                "fill": None,
            }
        )
    return out


def _rate(part: int, whole: int) -> float | None:
    return None if whole == 0 else part / whole


def read_figures(counts: dict[tuple[str, str, str], float]) -> dict[str, Any]:
    """From ``metrics.read_counters`` (this server's): ``hit_rates`` per cache tier (hbm,
    dram) and operation, the share of the keys asked of it that it held (None where it was
    asked nothing); ``reads`` per operation, the keys each tier answered and ``not_found``;
    ``found_rate`` per operation, the share some tier held."""
    rates: dict[str, dict[str, float | None]] = {}
    reads: dict[str, dict[str, int]] = {}
    for (kind, a, b), n in counts.items():
        if kind == "reads":
            reads.setdefault(a, {})[b] = int(n)
        elif kind == "hits":
            rates.setdefault(a, {})[b] = _rate(int(n), int(n + counts["misses", a, b]))
    found = {
        op: _rate(sum(by.values()) - by.get("not_found", 0), sum(by.values()))
        for op, by in reads.items()
    }
    return {"hit_rates": rates, "reads": reads, "found_rate": found}


def summary(snap: Snapshot, request: Request) -> dict[str, Any]:
    settings = settings_of(request)
    now = time.time()
    info = snap.info()
    published = info.get("published")  # following a publish root: the served seq's time
    if published:
        written: float | None = float(published)
    else:
        manifest = snap.path / "MANIFEST.json"
        try:
            written = os.stat(manifest if manifest.exists() else snap.path / "evdb.json").st_mtime
        except OSError:
            written = None
    server = {
        **info,
        "publish_root": None if settings.follow_root is None else str(settings.follow_root),
        "staleness_s": None if written is None else max(now - written, 0.0),
        "loaded_s": now - snap.loaded_at,
        "uptime_s": now - STARTED,
        "workers": settings.workers,
        "sample_interval_s": settings.sample_interval_s,
        "reloads": request.app.state.holder.reloads,
        "evdb_version": evdb.__version__,
        "pid": os.getpid(),  # which worker answered
    }
    tables = []
    for name, t in snap.tables.items():
        stats = t.stats()
        tables.append(
            {
                "name": name,
                "dim": t.dim,
                "key_type": t.config.key_type,
                "rows": stats["rows"],
                "ttl_steps": t.config.ttl_steps,
                "keeps_strings": t.keeps_strings,
                "tiers": _tiers(t, stats),
                **read_figures(request.app.state.metrics.tables.reads(name, t, stats)),
                "stats": stats,
            }
        )
    return {"server": server, "tables": tables}


# -- routes ---------------------------------------------------------------------------------


def _file(name: str, media_type: str) -> Response:
    return Response((STATIC / name).read_bytes(), media_type=media_type, headers=CSP)


@router.get("/dashboard", include_in_schema=False)
async def page() -> Response:
    return _file("dashboard.html", "text/html; charset=utf-8")


@router.get("/dashboard/static/{file}", include_in_schema=False)
async def asset(file: str) -> Response:
    media = PAGE_FILES.get(file)
    if media is None:
        raise ApiError(404, f"file: no dashboard file named {file[:64]!r}")
    return _file(file, media)


@router.get("/v1/dashboard/summary", response_model=Summary, responses=ERRORS)
async def get_summary(request: Request) -> Response:
    """The status strip and each table's size, tiers and ``Table.stats()``."""
    with use_snapshot(request) as snap:
        return Response(dumps(summary(snap, request)), media_type=JSON)


@router.get("/v1/dashboard/series", response_model=Series, responses=ERRORS)
async def get_series(request: Request) -> Response:
    """The sampled time series (every ``interval_s``, an hour kept), ending now: lookups and
    their latency quantiles summed over the workers, hit and missing-key rates, and the
    tables' counters with their rates."""
    return Response(dumps(request.app.state.sampler.series()), media_type=JSON)


@router.get(
    "/v1/dashboard/tables/{name}/distributions", response_model=Distributions, responses=ERRORS
)
async def get_distributions(name: str, request: Request) -> Response:
    """Key frequency (rank/frequency, fitted slope) and row age (histogram, TTL) of a sample
    of at most 10,000 live rows, taken once per snapshot."""
    with use_snapshot(request) as snap:
        view = request.app.state.views.get(snap, name)
        return Response(dumps(view.distributions), media_type=JSON)


@router.get("/v1/dashboard/tables/{name}/projection", response_model=Projection, responses=ERRORS)
async def get_projection(name: str, request: Request) -> Response:
    """A 2-D PCA of at most 5,000 sampled rows, each labelled by its key (or string)."""
    with use_snapshot(request) as snap:
        view = request.app.state.views.get(snap, name)
        return Response(dumps(view.projection), media_type=JSON)


# The Sizing view's route (``dashboard_sizing``), on this router: on and off with the rest.
router.routes.extend(dashboard_sizing.router.routes)
