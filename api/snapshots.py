"""The snapshot being served, and the swap to a new one.

A :class:`Snapshot` is a database opened read-only (a serving export, or a database nobody is
writing to), or a quantised (int8/int4) serving export (``evdb.quantized``), and its tables as
the routers read them: each a ``ReadableTable`` (``evdb.view``), a ``Table`` itself here, a
``QuantizedTable`` of a quantised export, a view at a publication's step following a publish
root (``api.follow``). :class:`SnapshotHolder` owns the current one. A request takes the current
snapshot with :meth:`SnapshotHolder.acquire` and gives it back when its answer is built;
:meth:`SnapshotHolder.swap` makes new requests see the new snapshot at once and closes the old
one when its last request gives it back. So a reload never fails a request and never mixes two
snapshots in one answer.

With several worker processes, a reload reaches one of them. It writes the new path to the
state file; every worker compares the file's inode and mtime on each request (one ``stat``)
and follows.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import xxhash

import evdb
from evdb.quantized import QuantizedSnapshot, is_quantized
from evdb.view import ReadableTable

log = logging.getLogger("evdb.api")

# Every lookup and infer answer names the snapshot it was read from: following a publish
# root, the publication's seq (it never goes back on one worker); otherwise the version hash.
VERSION_HEADER = "X-Evdb-Version"


@dataclass
class Snapshot:
    db: evdb.Database | QuantizedSnapshot
    path: Path
    version: str
    loaded_at: float
    tables: dict[str, ReadableTable] = field(default_factory=dict)
    _users: int = 0
    _retired: bool = False
    seq: int | None = None  # following a publish root: the publication served (api.follow)

    @classmethod
    def open(
        cls,
        path: Path,
        cache_rows: int | None = None,
        *,
        verify: bool = True,
        mmap_reads: bool = False,
    ) -> Snapshot:
        """Open ``path`` read-only (checksums verified unless ``verify=False``; ``cache_rows``
        rows of each table in DRAM; ``mmap_reads`` as ``evdb.open``'s) and name its version: a
        hash of its manifest (an export or checkpoint) or of its pointer file (a database). A
        quantised export is memory-mapped whole (``cache_rows`` and ``mmap_reads`` do not
        apply: its rows are read in place)."""
        db: evdb.Database | QuantizedSnapshot
        if is_quantized(path):
            db = QuantizedSnapshot(path, verify=verify)
        else:
            db = evdb.open(
                path, read_only=True, verify=verify, cache_rows=cache_rows, mmap_reads=mmap_reads
            )
        try:
            tag = path / "MANIFEST.json"
            if not tag.exists():
                tag = path / "evdb.json"
            version = xxhash.xxh3_64_hexdigest(tag.read_bytes())
            tables: dict[str, ReadableTable] = {name: db.table(name) for name in db.tables()}
        except BaseException:
            db.close()
            raise
        return cls(db, path, version, time.time(), tables)

    def lookup(self, name: str, table: Any, keys: Any, *args: Any, **kwargs: Any) -> Any:
        """``self.tables[name].lookup(keys, ...)`` (``table`` is not read). Nothing in
        ``api/`` calls it: kept for ``tests/distributed/test_sharded.py`` and
        ``bench/bench_freshness.py`` until they call ``snap.tables[name].lookup``."""
        return self.tables[name].lookup(keys, *args, **kwargs)

    def close(self) -> None:
        """Close the database (the holder calls it once the last request is done)."""
        self.db.close()

    def info(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "version": self.version,
            "step": self.db.step,
            "loaded_at": self.loaded_at,
        }


class SnapshotHolder:
    """The current snapshot, reference-counted across the requests that use it."""

    def __init__(
        self,
        snapshot: Snapshot | None = None,
        state_file: Path | None = None,
        cache_rows: int | None = None,
        mmap_reads: bool = False,
    ) -> None:
        self._lock = threading.Lock()
        self.cache_rows = cache_rows
        self.mmap_reads = mmap_reads
        self._current = snapshot
        self.state_file = state_file
        # None: a worker that starts after a reload (uvicorn restarts one that died) reads the
        # published path at once, rather than serving the snapshot it was started with.
        self._state_mtime: tuple[int, int] | None = None
        self.reloads = 0
        # Told of each snapshot before it serves (metrics take its tables' counts then).
        self.on_swap: list[Callable[[Snapshot], None]] = []

    @property
    def current(self) -> Snapshot | None:
        return self._current

    def load(self, path: Path, *, verify: bool = True) -> Snapshot:
        """Open a snapshot the way this server opens them (not yet served: see ``swap``).
        ``verify=False`` where another process checked its checksums already."""
        return Snapshot.open(path, self.cache_rows, verify=verify, mmap_reads=self.mmap_reads)

    def acquire(self) -> Snapshot | None:
        with self._lock:
            snap = self._current
            if snap is not None:
                snap._users += 1
            return snap

    def release(self, snap: Snapshot) -> None:
        with self._lock:
            snap._users -= 1
            close = snap._retired and snap._users == 0
        if close:
            snap.close()

    def swap(self, snap: Snapshot) -> None:
        """Serve ``snap`` from now on; the old snapshot closes after its last request."""
        for hook in self.on_swap:
            try:
                hook(snap)
            except Exception:  # a figure not taken must not stop a snapshot from serving
                log.exception("taking the counts of %s failed", snap.path)
        with self._lock:
            old, self._current = self._current, snap
            self.reloads += 1
            close = old is not None and old._users == 0
            if old is not None:
                old._retired = True
        if close:
            assert old is not None
            old.close()

    def close(self) -> None:
        with self._lock:
            old, self._current = self._current, None
            if old is not None:
                old._retired = True
                close = old._users == 0
        if old is not None and close:
            old.close()

    # -- several workers ------------------------------------------------------------------
    def publish(self, path: Path) -> None:
        """Tell the other workers to serve ``path`` (atomic: write, then rename)."""
        if self.state_file is None:
            return
        tmp = self.state_file.with_name(self.state_file.name + f".{os.getpid()}.tmp")
        tmp.write_text(str(path))
        os.replace(tmp, self.state_file)
        self._state_mtime = _mtime(self.state_file)

    def published_path(self) -> Path | None:
        """The path another worker published since this one last looked, if any."""
        if self.state_file is None:
            return None
        mtime = _mtime(self.state_file)
        if mtime == self._state_mtime:
            return None
        self._state_mtime = mtime
        text = self.state_file.read_text().strip() if mtime is not None else ""
        current = self._current
        if not text or (current is not None and Path(text) == current.path):
            return None
        return Path(text)


def _mtime(path: Path | None) -> tuple[int, int] | None:
    """The file's identity: each publish renames a new file into place (a new inode), which
    tells two publishes apart even within the file system's coarse mtime tick."""
    if path is None:
        return None
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns
