"""The server's side of freshness: follow a publish root (``evdb serve ROOT --follow``).

The trainer writes publications (``Database.publish``, ``evdb.publish``): now and then a full
serving snapshot, in between small deltas. A :class:`Follower` polls ``HEAD``, checks each
newer publication (manifest present, every checksum, the parent link of each delta), and
swaps in a new :class:`FollowSnapshot` through the :class:`SnapshotHolder`:

    served view = full snapshot (RocksDB, opened read-only, never written)
                + overlay per table: the rows of every delta since that full, merged
                  (sorted keys, values, last_step, and tombstones for removed keys), in
                  two layers (older, recent)
                + the step of the newest applied publication (TTL verdicts)

Why an overlay rather than applying deltas to a writable copy of the database: the RocksDB
files stay immutable and shared (any number of workers open them read-only, nothing is
copied), a delta is applied by building new numpy arrays off the request path (in a thread)
and swapping one reference, so requests in flight finish on the view they started with and
never see half a delta; and a lookup pays one ``searchsorted`` per overlay layer on top of
the snapshot's read. An overlay has two layers: a recent one that each apply merges into,
folded into the older one once past an eighth of it, so an apply copies the recent rows, not
every row changed since the full. The overlay grows with those rows; the trainer writes a new
full when the deltas add up to half the table (``evdb.publish.REBASE_FRACTION``)
and the follower then rebases: it opens the new full and starts an empty overlay. Rejected: a
writable working copy per worker (a full copy per worker and RocksDB writes on the serving
path, which DeepRec's in-place apply shows as latency spikes and half-applied reads); one
overlay shared and mutated in place (needs a lock on every lookup).

Pending publications are merged and swapped in at once: a follower 50 deltas behind applies
them in one swap (two when a newer full is among them: it loads that full and the deltas
after it, still one swap). A publication that fails a check, or cannot be read or held in
memory, is never applied, nor anything after it: the follower keeps serving its last good
view (or the good prefix of the pending deltas), counts the failure by reason, and retries on
the next poll. It logs the failure as one line naming the cause and the file, once, then at
most every ``REPEAT_LOG_S`` while it repeats (a follower polls every second). Versions never
go back: the served seq only rises (``X-Evdb-Version`` on every lookup and infer answer, and
the KServe model version), except by an explicit admin reload (logged and counted).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import sys
import threading
import time
import zipfile
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from fastapi import FastAPI
from prometheus_client import Counter as PromCounter
from prometheus_client import Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.concurrency import run_in_threadpool

import evdb
from evdb import checkpoint as _checkpoint
from evdb import publish as _publish
from evdb.bags import parse_bags
from evdb.errors import CorruptDataError, EvdbError, InvalidArgumentError
from evdb.kernels import cpu
from evdb.kernels.cpu.merge import merge_newest
from evdb.keys import normalize_keys
from evdb.ttl import min_live_step

from .settings import Settings
from .snapshots import Snapshot, SnapshotHolder

log = logging.getLogger("evdb.api.follow")

APPLY_SWITCH_S = 0.0001  # the GIL switch interval while applying (see Follower.poll)
_RECENT_ROWS = 65536  # the recent layer folds into the older past this (or an eighth of it)
REPEAT_LOG_S = 300.0  # a failure that repeats poll after poll is logged again after this
_FAILURES_KEPT = 256  # distinct failures remembered for REPEAT_LOG_S (oldest forgotten first)

# What reading or applying a publication can raise when a file is damaged, cannot be read, or
# is too big for this server: counted and logged as one line, never a traceback. Anything
# else is a bug (logged with its traceback, counted as "error").
EXPECTED = (EvdbError, OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, MemoryError)

__all__ = ["FollowSnapshot", "Follower", "Overlay", "install"]


@dataclass(frozen=True)
class Overlay:
    """One table's rows changed since the full snapshot: keys (m,) int64 sorted, values
    (m, dim) float32, last_step (m,) int64, removed (m,) bool (a tombstone: the key has no
    row, whatever the snapshot holds)."""

    keys: np.ndarray
    values: np.ndarray
    last_step: np.ndarray
    removed: np.ndarray

    @classmethod
    def empty(cls, dim: int) -> Overlay:
        z = np.empty(0, dtype=np.int64)
        return cls(z, np.empty((0, dim), np.float32), z, np.empty(0, dtype=bool))

    @property
    def n_rows(self) -> int:
        return int(self.keys.shape[0])

    def as_delta(self) -> _publish.Delta:
        """This overlay as one delta (its rows, and its tombstones as removed keys)."""
        live = ~self.removed
        return _publish.Delta(
            self.keys[live], self.values[live], self.last_step[live], self.keys[self.removed]
        )

    def merged(self, deltas: list[_publish.Delta]) -> Overlay:
        """This overlay with deltas applied in order (a later entry of a key wins). Each
        delta's rows and tombstones (disjoint, each sorted) become one sorted row set, the
        deltas fold into one, and that merges into this overlay: linear merges in a numba
        kernel that releases the GIL, so request threads keep running beside an apply. (The
        numpy version, a stable sort of every key and gathers, held the GIL: lookup p99
        during applies was 3.7-4.3x idle in bench_freshness.)"""
        if not deltas:
            return self
        dim = self.values.shape[1]
        newer: Overlay | None = None
        for d in deltas:
            r = d.removed.shape[0]
            rows = Overlay(d.keys, d.values, d.last_step, np.zeros(d.keys.shape[0], dtype=bool))
            tombstones = Overlay(
                d.removed,
                np.zeros((r, dim), dtype=np.float32),
                np.zeros(r, dtype=np.int64),
                np.ones(r, dtype=bool),
            )
            one = _merge_newest(rows, tombstones)
            newer = one if newer is None else _merge_newest(newer, one)
        assert newer is not None
        return _merge_newest(self, newer)


def _merge_newest(older: Overlay, newer: Overlay) -> Overlay:
    """The rows of both, sorted by key, newer's where both have a key."""
    n = older.n_rows + newer.n_rows
    dim = older.values.shape[1]
    out = Overlay(
        np.empty(n, dtype=np.int64),
        np.empty((n, dim), dtype=np.float32),
        np.empty(n, dtype=np.int64),
        np.empty(n, dtype=bool),
    )
    m = merge_newest(
        *(np.ascontiguousarray(a) for a in (older.keys, older.values, older.last_step)),
        np.ascontiguousarray(older.removed),
        *(np.ascontiguousarray(a) for a in (newer.keys, newer.values, newer.last_step)),
        np.ascontiguousarray(newer.removed),
        out.keys,
        out.values,
        out.last_step,
        out.removed,
    )
    return Overlay(out.keys[:m], out.values[:m], out.last_step[:m], out.removed[:m])


class _Base:
    """A full snapshot's database, shared by the views built on it; closed by the last."""

    def __init__(self, db: evdb.Database, seq: int) -> None:
        self.db = db
        self.seq = seq
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


@dataclass
class FollowSnapshot(Snapshot):
    """A view of a publish root at one seq: the full's tables, the overlays, the step."""

    base: _Base | None = None
    step: int = 0
    published: float = 0.0
    layers: dict[str, tuple[Overlay, Overlay]] = field(default_factory=dict)  # older, recent
    _merged: dict[str, Overlay] | None = field(default=None, repr=False)

    @property
    def overlays(self) -> dict[str, Overlay]:
        """Each table's overlay as one layer (the recent merged over the older), built on
        first use and kept with the view: for readers that scan the rows changed since the
        full (the dashboard's sample, neighbours); lookups read the layers as they are."""
        if self._merged is None:
            self._merged = {
                name: older.merged([recent.as_delta()]) if recent.n_rows else older
                for name, (older, recent) in self.layers.items()
            }
        return self._merged

    def close(self) -> None:
        if self.base is not None:
            self.base.release()

    def info(self) -> dict[str, Any]:
        return {**super().info(), "seq": self.seq, "step": self.step, "published": self.published}

    def lookup(
        self,
        name: str,
        table: evdb.Table,
        keys: Any,
        offsets: Any = None,
        weights: Any = None,
        combiner: str | None = None,
        *,
        promote: bool = False,
        found: np.ndarray | None = None,
    ) -> np.ndarray:
        """``Table.lookup`` as the trainer's at this seq: the snapshot's rows at this view's
        step, with the overlays' rows and tombstones over them (a newer layer over an older)."""
        _publish.serve_at(self.db, self.step)  # views share the database; each has its step
        layers = [o for o in self.layers.get(name, ()) if o.n_rows]
        if not layers:
            return table.lookup(keys, offsets, weights, combiner, promote=promote, found=found)
        k = normalize_keys(keys, table.config.key_type)
        n = k.shape[0]
        plain = offsets is None and weights is None and combiner is None
        bags = None if plain else parse_bags(n, offsets, weights, combiner, None)
        have = np.empty(n, dtype=bool)
        values = table.lookup(k, promote=promote, found=have)
        min_live = min_live_step(self.step, table.config.ttl_steps)
        for overlay in layers:
            at = np.searchsorted(overlay.keys, k).clip(max=overlay.n_rows - 1)
            hit = np.flatnonzero(overlay.keys[at] == k)
            if hit.size == 0:
                continue
            p = at[hit]
            live = ~overlay.removed[p] & (overlay.last_step[p] >= min_live)
            values[hit[live]] = overlay.values[p[live]]
            have[hit[live]] = True
            dead = hit[~live]
            if dead.size:
                values[dead] = table.defaults(k[dead])
                have[dead] = False
        if found is not None:
            found[:] = have
        if bags is None:
            return values
        out = np.empty((bags.n_bags, table.dim), dtype=np.float32)
        index = np.arange(n, dtype=np.int64)
        cpu.gather_combine(values, index, bags.bounds, bags.weights, bags.combiner, np.inf, out)
        return out


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
    """

    def __init__(
        self,
        root: Path,
        holder: SnapshotHolder,
        *,
        observe_apply: Callable[[float], None] | None = None,
        on_failure: Callable[[str], None] | None = None,
    ) -> None:
        self.root = Path(root)
        self.holder = holder
        self.state = FollowState()
        self._observe_apply = observe_apply
        self._on_failure = on_failure
        self._lock = threading.Lock()  # one poll at a time
        self._base: _Base | None = None
        self._overlays: dict[str, tuple[Overlay, Overlay]] = {}  # (older, recent) per table
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
            self._fail(seq, *_diagnose(path, why))

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
            path = _publish.publication_dir(self.root, full_seq)
            # checked just above: the read-only open skips the checksum pass
            db = evdb.open(
                path,
                read_only=True,
                verify=False,
                cache_rows=self.holder.cache_rows,
                mmap_reads=self.holder.mmap_reads,
            )
            new_base = base = _Base(db, full_seq)
            opened.append(new_base)
            overlays = {}
            for name in db.tables():
                empty = Overlay.empty(db.table(name).dim)
                overlays[name] = (empty, empty)
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
        merged = {name: _layered(*overlays[name], pending[name]) for name in overlays}
        assert base is not None
        view = FollowSnapshot(
            base.db,
            self.root,
            str(seq),
            time.time(),
            {name: base.db.table(name) for name in base.db.tables()},
            seq=seq,
            base=base.acquire(),
            step=step,
            published=published or 0.0,
            layers=merged,
        )
        if new_base is not None and self._base is not None:
            self._base.release()  # the views on the old full keep it open until they end
        self._base, self._overlays, self._link, self._step = base, merged, link, step
        opened.clear()
        self.holder.swap(view)
        st = self.state
        st.applied_seq, st.published, st.swaps = seq, published, st.swaps + 1
        st.overlay_rows = sum(o.n_rows for layers in merged.values() for o in layers)
        if self._observe_apply is not None:
            self._observe_apply(time.perf_counter() - start)
        return True

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


def _layered(
    older: Overlay, recent: Overlay, deltas: list[_publish.Delta]
) -> tuple[Overlay, Overlay]:
    """Deltas merged into the recent layer, which is folded into the older one once it has
    grown past an eighth of it: an apply copies the recent layer, not every row changed since
    the full (measured: merging a 10,000-row delta into a 214,000-row overlay took 7.6 ms,
    3.5 of them copying the overlay's rows, all of it beside the request handlers)."""
    recent = recent.merged(deltas)
    if recent.n_rows > max(older.n_rows // 8, _RECENT_ROWS):
        return older.merged([recent.as_delta()]), Overlay.empty(recent.values.shape[1])
    return older, recent


def _manifest_digest(root: Path, seq: int) -> str:
    return _checkpoint.file_digest(_publish.publication_dir(root, seq) / _checkpoint.MANIFEST)


def cause(error: BaseException, reason: str, where: Path | None = None) -> tuple[str, str]:
    """(reason, detail) of an error met reading or applying a publication (at ``where``), for
    the metrics and the one log line: a file that cannot be opened is "unreadable"
    (permission denied is not damage, whatever ``reason`` the step that met it says), no
    memory for a delta is "memory", another I/O error "read"; the detail names the file (the
    error's, else ``where``)."""
    for e in (error, error.__cause__):  # evdb wraps what it cannot read in CorruptDataError
        if isinstance(e, PermissionError):
            return "unreadable", f"{e.filename or where}: permission denied"
    if isinstance(error, MemoryError):
        reason, detail = "memory", f"not enough memory to apply it ({error})"
    elif isinstance(error, OSError) and not isinstance(error, EvdbError) and error.filename:
        return "read", f"{error.filename}: {error.strerror or error}"
    else:
        detail = str(error) or type(error).__name__
    if where is not None and str(where) not in detail:
        detail = f"{where}: {detail}"
    return reason, detail


def _diagnose(path: Path, why: str) -> tuple[str, str]:
    """The cause of ``check_publication``'s "checksum" or "manifest" verdict on the
    publication at path: it gives no more than the word, and says "checksum" for a file it
    cannot open too. The check is made again to name the file and tell which (a refused
    publication is read twice; ``check_publication`` returning its error would spare that)."""
    try:
        _checkpoint.verify(path)
    except EXPECTED as e:
        return cause(e, why, path)
    return why, f"{path}: refused, then passed when checked again (it changed meanwhile)"


Failure = tuple[str, int | None, str]  # reason, seq, detail


class FailureLog:
    """Logs a failure once, as one line, and again only after ``REPEAT_LOG_S`` while it
    repeats (saying how often it did), so a follower that meets the same failure at every
    poll does not bury the log."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self._seen: dict[Failure, tuple[float, int]] = {}  # -> (logged at, repeats since)
        self._lock = threading.Lock()

    def warning(self, key: Failure, msg: str, *args: Any, exc_info: bool = False) -> None:
        now = time.monotonic()
        with self._lock:
            last = self._seen.get(key)
            if last is not None and now - last[0] < REPEAT_LOG_S:
                self._seen[key] = (last[0], last[1] + 1)
                return
            self._seen.pop(key, None)
            if len(self._seen) >= _FAILURES_KEPT:
                del self._seen[next(iter(self._seen))]
            self._seen[key] = (now, 0)
        if last is not None:
            msg += " (%d more times in the last %.0f s)"
            args = (*args, last[1] + 1, now - last[0])
        self.logger.warning(msg, *args, exc_info=exc_info)

    def forget_through(self, seq: int | None) -> None:
        """Forget the failures of publications up to seq (served now) and of no publication
        (HEAD): met again later, they are news."""
        with self._lock:
            for key in [k for k in self._seen if k[1] is None or seq is None or k[1] <= seq]:
                del self._seen[key]


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
