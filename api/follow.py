"""The server's side of freshness: follow a publish root (``evdb serve ROOT --follow``).

The trainer writes publications (``Database.publish``, ``evdb.publish``): now and then a full
serving snapshot, in between small deltas. A :class:`Follower` polls ``HEAD``, checks each
newer publication (manifest present, every checksum, the parent link of each delta), and
swaps in a new :class:`FollowSnapshot` through the :class:`SnapshotHolder`: per table, an
``evdb.view.TableView`` of the full snapshot (RocksDB, opened read-only, never written) at
the step of the newest applied publication, with an ``Overlay`` of the rows of every delta
since that full (``evdb.view_overlay`` says why an overlay, and how it is layered). A delta
is applied by building new arrays off the request path (in a thread) and swapping one
reference, so requests in flight finish on the view they started with and never see half a
delta.

The overlay grows with the rows changed; the trainer writes a new full when the deltas add up
to half the table (``evdb.publish.REBASE_FRACTION``) and the follower then rebases: it opens
the new full and starts an empty overlay. Rejected: a writable working copy per worker (a full
copy per worker and RocksDB writes on the serving path, which DeepRec's in-place apply shows
as latency spikes and half-applied reads); one overlay shared and mutated in place (needs a
lock on every lookup).

Pending publications are merged and swapped in at once: a follower 50 deltas behind applies
them in one swap (two when a newer full is among them: it loads that full and the deltas
after it, still one swap). A publication that fails a check, or cannot be read or held in
memory, is never applied, nor anything after it: the follower keeps serving its last good
view (or the good prefix of the pending deltas), counts the failure by reason, and retries on
the next poll, logging it as one line (``api.failures``). Versions never go back: the served
seq only rises (``X-Evdb-Version`` on every lookup and infer answer, and the KServe model
version), except by an explicit admin reload (logged and counted).

A follower may serve quantised (``evdb serve ROOT --follow --dtype int8``, ``EVDB_FOLLOW_DTYPE``):
each full it loads is quantised, off the request path as every apply is, into frozen files in
a folder of its own (``EVDB_FOLLOW_CACHE``, default the system's temporary folder;
``evdb.io.export_quantized.quantize_full``), and the float32 full is closed at once, so no
float32 copy of a table is held; each delta's rows are quantised row-wise as they are applied
(``Overlay.empty(dim, bits=8)``). A row reads as that row of an int8 export of the trainer's
database at the step served. Each worker quantises for itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from prometheus_client import Counter as PromCounter
from prometheus_client import Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.concurrency import run_in_threadpool

import evdb
from evdb import checkpoint as _checkpoint
from evdb import publish as _publish
from evdb.errors import CorruptDataError, InvalidArgumentError
from evdb.io.export_quantized import quantize_full
from evdb.quantized import QUANTIZED_DTYPES, QuantizedSnapshot
from evdb.tiers.frozen import QUANTIZED_BITS
from evdb.view import Overlay, TableView

from .failures import EXPECTED, FailureLog, cause, diagnose
from .settings import Settings
from .snapshots import Snapshot, SnapshotHolder

log = logging.getLogger("evdb.api.follow")

APPLY_SWITCH_S = 0.0001  # the GIL switch interval while applying (see Follower.poll)

__all__ = ["FollowSnapshot", "Follower", "cause", "install"]


class _Base:
    """A full snapshot's database (or its quantised copy, in the folder ``files``), shared by
    the views built on it; closed (and the folder removed) by the last."""

    def __init__(
        self, db: evdb.Database | QuantizedSnapshot, seq: int, files: Path | None = None
    ) -> None:
        self.db = db
        self.seq = seq
        self.files = files
        self._refs = 1  # the follower's own
        self._lock = threading.Lock()

    def acquire(self) -> _Base:
        with self._lock:
            self._refs += 1
        return self

    def release(self) -> None:
        with self._lock:
            self._refs -= 1
            close = self._refs == 0
        if close:
            self.db.close()
            if self.files is not None:
                shutil.rmtree(self.files, ignore_errors=True)


@dataclass
class FollowSnapshot(Snapshot):
    """A publish root at one seq: each table a ``TableView`` (``evdb.view``) of the full's
    table at the seq's step, with the rows of the deltas since the full over it."""

    base: _Base | None = None
    step: int = 0
    published: float = 0.0

    def close(self) -> None:
        if self.base is not None:
            self.base.release()

    def info(self) -> dict[str, Any]:
        full = None if self.base is None else self.base.seq  # the full the tiers hold
        return {
            **super().info(),
            "seq": self.seq,
            "full_seq": full,
            "step": self.step,
            "published": self.published,
        }


@dataclass
class FollowState:
    """What a follower reports (metrics, /readyz)."""

    applied_seq: int | None = None
    head_seq: int | None = None
    published: float | None = None  # publish time of the applied seq
    overlay_rows: int = 0
    polls: int = 0
    swaps: int = 0
    admin_reloads: int = 0  # explicit reloads while following: the one way versions go back
    failures: Counter[str] = field(default_factory=Counter)

    def staleness(self, now: float | None = None) -> float | None:
        """Seconds since the applied publication was written; None before the first."""
        if self.published is None:
            return None
        return max((time.time() if now is None else now) - self.published, 0.0)


class Follower:
    """Follows a publish root for one worker: ``poll`` applies what is new.

    Parameters
    ----------
    root : Path
        The publish root.
    holder : SnapshotHolder
        Where new views are swapped in.
    observe_apply : callable, optional
        Told the seconds of each apply (the ``evdb_delta_apply_seconds`` histogram).
    on_failure : callable, optional
        Told the reason of each refused publication (``evdb_delta_failures_total``).
    dtype : "float32" | "int8" | "int4"
        How the rows are served: as published, or quantised (see the module docstring).
    cache_dir : Path, optional
        Where a quantising follower makes its folder (default: the system's temporary one).
    """

    def __init__(
        self,
        root: Path,
        holder: SnapshotHolder,
        *,
        observe_apply: Callable[[float], None] | None = None,
        on_failure: Callable[[str], None] | None = None,
        dtype: str = "float32",
        cache_dir: Path | None = None,
    ) -> None:
        if dtype not in ("float32", *QUANTIZED_DTYPES):
            raise InvalidArgumentError(
                f"dtype must be one of {('float32', *QUANTIZED_DTYPES)}, got {dtype!r}"
            )
        self.dtype = dtype
        self._bits = QUANTIZED_BITS.get(dtype, 0)
        self._cache_dir = cache_dir
        self._files: Path | None = None  # this follower's folder of quantised fulls
        self.root = Path(root)
        self.holder = holder
        self.state = FollowState()
        self._observe_apply = observe_apply
        self._on_failure = on_failure
        self._lock = threading.Lock()  # one poll at a time
        self._base: _Base | None = None
        self._overlays: dict[str, Overlay] = {}  # per table
        self._link: tuple[int, str] | None = None  # (applied seq, its manifest's xxh3-128)
        self._step = 0
        self._reading: int | None = None  # the seq being checked or read (its failure's)
        self.log = FailureLog(log)

    def _fail(self, seq: int | None, reason: str, detail: str) -> None:
        """Count a refused publication; log it (one line) unless it is a repeat."""
        self.state.failures[reason] += 1
        if self._on_failure is not None:
            self._on_failure(reason)
        self.log.warning(
            (reason, seq, detail),
            "publication %s of %s refused (%s): %s; serving seq %s",
            seq,
            self.root,
            reason,
            detail,
            self.state.applied_seq,
        )

    def _refuse(self, seq: int, why: str) -> None:
        """Count and log publication seq, which ``check_publication`` refused for ``why``."""
        path = _publish.publication_dir(self.root, seq)
        if why == "gap":
            detail = f"{path}: missing, or not the child of the publication before it"
            self._fail(seq, why, detail)
        else:
            self._fail(seq, *diagnose(path, why))

    def poll(self, upto: int | None = None) -> bool:
        """Read HEAD and apply every newer publication that checks out, in one swap (with
        ``upto``, none after that seq: a follower held back, for tests and benchmarks).
        Returns whether a new view is served. Never raises for a bad publication: it is
        counted and the last good view stays."""
        with self._lock:
            self.state.polls += 1
            try:
                head = _publish.read_head(self.root)
            except CorruptDataError as e:
                self._fail(None, *cause(e, "head"))
                return False
            if head is None:
                return False
            self.state.head_seq = int(head["seq"])
            if upto is not None and upto < self.state.head_seq:
                head = {**head, "seq": upto}
                if int(head["full"]) > upto:  # the full before upto is not named: find it
                    head["full"] = self._full_before(upto)
                    if head["full"] is None:
                        return False
            applied = self.state.applied_seq
            if applied is not None and int(head["seq"]) <= applied:
                return False
            start = time.perf_counter()
            # While applying, this thread gives the GIL up after APPLY_SWITCH_S rather than
            # Python's 5 ms: a request waiting for it otherwise waited up to 5 ms (bench:
            # lookup p99 during applies 7 ms against 0.17 ms idle).
            switch = sys.getswitchinterval()
            sys.setswitchinterval(min(switch, APPLY_SWITCH_S))
            try:
                applied = self._catch_up(head, start)
            except EXPECTED as e:  # a damaged or unreadable file, a delta too big for memory
                seq = self._reading
                where = None if seq is None else _publish.publication_dir(self.root, seq)
                self._fail(seq, *cause(e, "read", where))
                return False
            finally:
                sys.setswitchinterval(switch)
            if applied:  # what failed at the seqs now served cannot fail again
                self.log.forget_through(self.state.applied_seq)
            return applied

    def _catch_up(self, head: dict[str, Any], start: float) -> bool:
        opened: list[_Base] = []
        try:
            return self._apply(head, start, opened)
        except BaseException:
            for base in opened:  # a full opened for a view that was never served
                base.release()
            raise

    def _apply(self, head: dict[str, Any], start: float, opened: list[_Base]) -> bool:
        head_seq, full_seq = int(head["seq"]), int(head["full"])
        base, overlays, link = self._base, self._overlays, self._link
        step, published = self._step, self.state.published
        new_base = None
        self._reading = full_seq
        if base is None or base.seq != full_seq:
            manifest, why = _publish.check_publication(self.root, full_seq, None)
            if manifest is None or why is not None:
                self._refuse(full_seq, why or "manifest")
                return False
            new_base = base = self._open_full(full_seq)
            opened.append(new_base)
            db = base.db
            bits = self._bits
            overlays = {name: Overlay.empty(db.table(name).dim, bits=bits) for name in db.tables()}
            link = (full_seq, _manifest_digest(self.root, full_seq))
            entry = manifest["publication"]
            step, published, seq = int(entry["step"]), float(entry["published"]), full_seq
        else:
            assert link is not None
            seq = link[0]
        pending: dict[str, list[_publish.Delta]] = {name: [] for name in overlays}
        for s in range(seq + 1, head_seq + 1):
            self._reading = s
            manifest, why = _publish.check_publication(self.root, s, link)
            if manifest is None or why is not None:
                self._refuse(s, why or "manifest")
                break  # never s + 1 without s: serve what checked out so far
            try:
                deltas = _publish.load_delta(self.root, s, manifest)
            except EXPECTED as e:  # checked, but unreadable or too big: refused the same way
                self._fail(s, *cause(e, "read", _publish.publication_dir(self.root, s)))
                break
            for name, delta in deltas.items():
                if name in pending:
                    pending[name].append(delta)
            link = (s, _manifest_digest(self.root, s))
            entry = manifest["publication"]
            step, published, seq = int(entry["step"]), float(entry["published"]), s
        if new_base is None and seq == self._link_seq():
            return False  # nothing new checked out
        merged = {name: overlays[name].applied(pending[name]) for name in overlays}
        assert base is not None
        db = base.db
        view = FollowSnapshot(
            db,
            self.root,
            str(seq),
            time.time(),
            {name: TableView(db.table(name), step, merged[name]) for name in db.tables()},
            seq=seq,
            base=base.acquire(),
            step=step,
            published=published or 0.0,
        )
        if new_base is not None and self._base is not None:
            self._base.release()  # the views on the old full keep it open until they end
        self._base, self._overlays, self._link, self._step = base, merged, link, step
        opened.clear()
        self.holder.swap(view)
        st = self.state
        st.applied_seq, st.published, st.swaps = seq, published, st.swaps + 1
        st.overlay_rows = sum(o.n_rows for o in merged.values())
        if self._observe_apply is not None:
            self._observe_apply(time.perf_counter() - start)
        return True

    def _open_full(self, seq: int) -> _Base:
        """The full publication seq (checked: the read-only open skips the checksum pass),
        opened, or quantised into this follower's folder and the float32 full closed."""
        db = evdb.open(
            _publish.publication_dir(self.root, seq),
            read_only=True,
            verify=False,
            cache_rows=self.holder.cache_rows,
            mmap_reads=self.holder.mmap_reads,
        )
        if self._bits == 0:
            return _Base(db, seq)
        try:
            if self._files is None:
                self._files = Path(tempfile.mkdtemp(prefix="evdb-follow-", dir=self._cache_dir))
            dest = self._files / str(seq)
            shutil.rmtree(dest, ignore_errors=True)  # what a failed try left
            try:
                quantized = quantize_full(db, dest, self.dtype)
            except BaseException:
                shutil.rmtree(dest, ignore_errors=True)
                raise
        finally:
            db.close()
        return _Base(quantized, seq, dest)

    def admin_reload(self, path: Path) -> None:
        """An admin reload swapped ``path`` in: served until the next publication applies."""
        self.state.admin_reloads += 1
        log.warning(
            "admin reload of %s while following %s (at seq %s): served until the next "
            "publication is applied",
            path,
            self.root,
            self.state.applied_seq,
        )

    def _full_before(self, seq: int) -> int | None:
        """The newest full publication at or before seq (None if none is left)."""
        for s in reversed(_publish.list_publications(self.root)):
            if s <= seq:
                manifest, _ = _publish.check_publication(self.root, s, None)
                if manifest is not None and manifest["publication"]["kind"] == "full":
                    return s
        return None

    def _link_seq(self) -> int | None:
        return None if self._link is None else self._link[0]

    def close(self) -> None:
        with self._lock:
            if self._base is not None:
                self._base.release()
                self._base = None
            if self._files is not None:  # views still open keep their files mapped
                shutil.rmtree(self._files, ignore_errors=True)
                self._files = None


def _manifest_digest(root: Path, seq: int) -> str:
    return _checkpoint.file_digest(_publish.publication_dir(root, seq) / _checkpoint.MANIFEST)


def _parse_seconds(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise InvalidArgumentError(f"{name} must be a number of seconds > 0, got {value!r}")
    return float(value)


class _FollowCollector(Collector):
    """This worker's follower, read at scrape time (a ``worker`` label with several)."""

    def __init__(self, follower: Follower, worker: bool) -> None:
        self.follower = follower
        self.worker = [str(os.getpid())] if worker else []

    def collect(self) -> Iterator[Metric]:
        by = ["worker"] if self.worker else []
        st = self.follower.state
        figures = [
            ("evdb_applied_seq", "Seq of the publication served (-1: none yet).", st.applied_seq),
            ("evdb_head_seq", "Seq HEAD named at the last poll (-1: none yet).", st.head_seq),
            (
                "evdb_staleness_seconds",
                "Now minus the publish time of the publication served (-1: none yet).",
                st.staleness(),
            ),
            (
                "evdb_overlay_rows",
                "Rows (and tombstones) held over the full snapshot, all tables.",
                st.overlay_rows,
            ),
            (
                "evdb_admin_reloads_while_following",
                "Admin reloads taken while following (the served version left the seqs).",
                st.admin_reloads,
            ),
        ]
        for name, doc, value in figures:
            gauge = GaugeMetricFamily(name, doc, labels=by)
            gauge.add_metric(self.worker, -1 if value is None else value)
            yield gauge


def install(app: FastAPI, settings: Settings, holder: SnapshotHolder) -> Follower:
    """Follow ``settings.follow_root`` in this worker: a first poll before the app is ready
    for requests (so it starts ready when HEAD has a good publication), then a poll every
    ``poll_interval_s`` (jittered by +-20%, so that workers spread their reads), off the
    event loop. Adds the follower's metrics; ``app.state.follower`` is the follower."""
    assert settings.follow_root is not None
    interval = _parse_seconds("poll_interval_s", settings.poll_interval_s)
    if settings.max_staleness_s is not None:
        _parse_seconds("max_staleness_s", settings.max_staleness_s)
    metrics = app.state.metrics
    apply_seconds = Histogram(
        "evdb_delta_apply_seconds",
        "Time to check, read and swap in new publications (one apply may merge several).",
        buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0),
        registry=metrics.registry,
    )
    failures = PromCounter(
        "evdb_delta_failures",
        "Publications refused (never applied), by reason: manifest, checksum, gap, head, read, "
        "unreadable (permission denied), memory (a delta too big to apply), error.",
        ["reason"],
        registry=metrics.registry,
    )
    follower = Follower(
        settings.follow_root,
        holder,
        observe_apply=apply_seconds.observe,
        on_failure=lambda reason: failures.labels(reason).inc(),
        dtype=settings.follow_dtype,
        cache_dir=settings.follow_cache,
    )
    metrics.add_collector(_FollowCollector(follower, worker=settings.metrics_dir is not None))
    app.state.follower = follower
    inner = app.router.lifespan_context
    rng = random.Random()

    async def poll_forever() -> None:
        while True:
            await asyncio.sleep(interval * rng.uniform(0.8, 1.2))
            try:
                await run_in_threadpool(follower.poll)
            except Exception as e:  # a bug must not end the following: counted, logged, retried
                follower.state.failures["error"] += 1
                failures.labels("error").inc()
                follower.log.warning(
                    ("error", None, f"{type(e).__name__}: {e}"),
                    "polling %s failed; retrying on the next poll",
                    follower.root,
                    exc_info=True,
                )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[Any]:
        async with inner(app) as state:
            await run_in_threadpool(follower.poll)
            task = asyncio.create_task(poll_forever())
            try:
                yield state
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                follower.close()

    app.router.lifespan_context = lifespan
    return follower
