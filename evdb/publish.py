"""The trainer's side of freshness: a log of publications that servers follow.

``Database.publish(root)`` writes one publication of every table into the publish root; a
server (``evdb serve ROOT --follow``, ``evdb.api.follow``) serves the newest one. The root::

    HEAD                    {"format", "seq", "full", "published"}: the newest publication
                            and the full one it chains to; replaced atomically, last
    000000000007/           seq 7, a full one: a read-only serving database (evdb.json +
                            checkpoints/<n>/) + MANIFEST.json
    000000000008/           seq 8, a delta: <table>.npz per table + MANIFEST.json
    .000000000009.tmp-<pid> being built (a crash leaves it; the next publish removes it)
    .lock                   flock'ed while a publication is written: one publisher per root

``seq`` rises by 1 per publication, full or delta. Each ``MANIFEST.json`` is the checkpoint
manifest (size and xxh3-128 of every file, ``evdb.verify`` checks it) with a
``publication`` entry: ``seq``, ``kind`` ("full" | "delta"), ``parent`` (the previous seq,
None for the first), ``parent_manifest`` (xxh3-128 of the parent's MANIFEST.json: a delta
applies only on top of exactly that parent), ``full`` (the seq of the full it chains to),
``step`` (the trainer's global step: TTL verdicts on the server are taken at it),
``published`` (unix time) and ``tables`` (per table ``dim``, ``key_type``, ``ttl_steps``,
``rows`` and ``removed``: changed rows and removed keys, or the rows of a full).

A full publication is a values-only serving snapshot (SGD: no slots, no admission) that keeps
each row's ``last_step`` and the table's ``ttl_steps``, so that the server's TTL verdicts
match the trainer's at every step. A delta's ``<table>.npz`` holds ``keys`` (m,) int64
(sorted), ``values`` (m, dim) float32 and ``last_step`` (m,) int64 of the rows whose version
rose since the parent, and ``removed`` (r,) int64 (sorted), the keys whose rows left every
tier since (``delete``, ``compact()``, TTL expiry, L2 pruning, eviction without a disk tier).
String tables publish their hashed keys; the original strings are not published (serving
hashes the strings it is sent).

How a delta stays proportional to what changed: each table keeps a bounded
:class:`evdb.changelog.ChangeLog` of touched and removed keys, started by the first
publication to a root; a delta reads the current rows of the touched keys, never a scan. A
publication is full when it cannot be exact as a delta: the first to a root (or after a
restart of the trainer, whose logs are in memory), ``full=True``, a log that overflowed, a
table created or dropped since, HEAD moved by someone else, or deltas since the last full
adding up to more than ``REBASE_FRACTION`` of the live rows and ``REBASE_MIN_ROWS`` (a
follower's overlay of changed rows is rebased onto the new full, so this bounds its memory).
The reason is returned.

Durability: a publication is built under a temporary name, checksummed, fsynced and renamed
into place; then HEAD is replaced (write, fsync, rename, fsync the root). A crash at any
moment leaves the root readable at the previous HEAD. The change logs are emptied only after
HEAD is replaced, so a failed publication loses nothing: the next one carries it.

Retention (``keep=K``): publications older than the K-th newest full one are removed after
HEAD moves; a follower that fell behind further loads the newest full.

Sharded databases (``evdb.distributed``) publish into the same kind of root: each rank
writes its part, and rank 0 merges the parts into one ordinary publication
(``evdb.distributed.publish``), so a follower needs no notion of shards.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from evdb import checkpoint as _checkpoint
from evdb._types import Float32Array, Int64Array
from evdb.config import DiskConfig, TableConfig
from evdb.database import CHECKPOINTS, WORKING
from evdb.database import open as open_database
from evdb.errors import CorruptDataError, EvdbError, InvalidArgumentError, StorageError
from evdb.optim import SGD
from evdb.records import RecordBatch

if TYPE_CHECKING:
    from evdb.database import Database
    from evdb.table import Table

__all__ = [
    "DEFAULT_KEEP",
    "HEAD",
    "REBASE_FRACTION",
    "Delta",
    "check_publication",
    "list_publications",
    "load_delta",
    "publication_dir",
    "publish",
    "read_head",
    "serve_at",
]

HEAD = "HEAD"
FORMAT = "evdb-publish-1"
DEFAULT_KEEP = 2  # full publications kept (and every delta after the oldest of them)
REBASE_FRACTION = 0.5  # deltas since the last full above this share of the rows: a new full
REBASE_MIN_ROWS = 65536  # ... and above this many rows (an overlay this small costs nothing)
_SEQ = re.compile(r"\d{12}")
_CHUNK_ROWS = 65536


@dataclass
class _State:
    """What a database remembers of its last publication (in memory: a restarted trainer
    publishes a full one first, since its change logs are new)."""

    root: Path
    seq: int
    digest: str  # xxh3-128 of its MANIFEST.json: the next delta's parent link
    full: int
    rows_since_full: int
    tables: dict[str, str]  # name -> uid: a table created or dropped since makes a full


def publication_dir(root: Path, seq: int) -> Path:
    """The directory of publication ``seq`` under the publish root (12 digits: names sort
    as seqs)."""
    return root / f"{seq:012d}"


def read_head(root: str | os.PathLike[str]) -> dict[str, Any] | None:
    """HEAD of a publish root; None if it has none yet. ``CorruptDataError`` if unreadable."""
    head = _checkpoint.read_json(Path(root) / HEAD, "publish HEAD")
    if head is None:
        return None
    if not isinstance(head, dict) or head.get("format") != FORMAT:
        raise CorruptDataError(f"{Path(root) / HEAD}: not an evdb publish HEAD")
    return head


def list_publications(root: Path) -> list[int]:
    """Seqs of the publication directories under root (complete or not), ascending."""
    if not root.is_dir():
        return []
    return sorted(int(p.name) for p in root.iterdir() if _SEQ.fullmatch(p.name) and p.is_dir())


def publish(
    db: Database,
    root: str | os.PathLike[str],
    *,
    full: bool | None = None,
    keep: int = DEFAULT_KEEP,
) -> dict[str, Any]:
    """``Database.publish`` (see there)."""
    check_arguments(full, keep)
    start = time.perf_counter()
    root = Path(root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    with _RootLock(root):
        head = read_head(root)
        clear_stale(root, head)
        tables = {name: db.table(name) for name in db.tables()}
        reason = _full_reason(db, root, head, tables, full)
        if reason is not None and full is False:
            raise InvalidArgumentError(f"full=False, but a delta cannot be exact here: {reason}")
        state = db._publication
        if reason is not None:
            written = write_publication(
                root, head, None, db.step, lambda tmp, e: _write_full(db, tmp, tables, e)
            )
        else:
            assert state is not None

            def delta(tmp: Path, entries: dict[str, Any]) -> tuple[int, int]:
                tmp.mkdir()
                return _write_delta(tmp, tables, entries)

            written = write_publication(root, head, state.full, db.step, delta)
        # Durable and visible: only now may the logs forget what this publication carries.
        for t in tables.values():
            if reason is not None:
                t.changes.start()
            else:
                t.changes.clear()
        since = 0 if reason is not None else (state.rows_since_full if state else 0)
        db._publication = _State(
            root,
            written.seq,
            written.digest,
            written.full,
            since + (0 if reason is not None else written.rows),
            {n: t.meta.uid for n, t in tables.items()},
        )
        _retain(root, written.seq, keep)
    return written.result(time.perf_counter() - start, reason)


def check_arguments(full: Any, keep: Any) -> None:
    """``publish``'s options, checked before anything is written."""
    if full not in (None, True, False):
        raise InvalidArgumentError(f"full must be None, True or False, got {full!r}")
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise InvalidArgumentError(f"keep must be an int >= 1, got {keep!r}")


def clear_stale(root: Path, head: dict[str, Any] | None) -> None:
    """Remove what publications that crashed left: temporary directories, and seq
    directories at or past the next seq (renamed into place, but HEAD never moved)."""
    seq = 1 if head is None else int(head["seq"]) + 1
    for stale in root.iterdir():
        if stale.name.startswith(".") and ".tmp-" in stale.name:
            shutil.rmtree(stale, ignore_errors=True)
        elif _SEQ.fullmatch(stale.name) and int(stale.name) >= seq:
            shutil.rmtree(stale, ignore_errors=True)


@dataclass(frozen=True)
class Written:
    """What ``write_publication`` wrote."""

    seq: int
    kind: str
    full: int  # the seq of the full publication it chains to (itself for a full)
    rows: int
    removed: int
    bytes: int
    digest: str  # xxh3-128 of its MANIFEST.json

    def result(self, seconds: float, reason: str | None) -> dict[str, Any]:
        """``publish``'s answer."""
        out: dict[str, Any] = {
            "seq": self.seq,
            "kind": self.kind,
            "rows": self.rows,
            "deleted": self.removed,
            "bytes": self.bytes,
            "seconds": seconds,
        }
        if reason is not None:
            out["reason"] = reason
        return out


def write_publication(
    root: Path,
    head: dict[str, Any] | None,
    full: int | None,
    step: int,
    write: Callable[[Path, dict[str, Any]], tuple[int, int]],
    extra: dict[str, Any] | None = None,
) -> Written:
    """Publication HEAD + 1, made visible: ``write(tmp, entries)`` builds its body in the
    temporary directory tmp (creating it) and fills ``entries`` per table, returning (rows,
    removed); a full one when ``full`` is None, else a delta chained to the full seq ``full``.
    Then it is checksummed, fsynced and renamed into place, and HEAD is replaced. The caller
    holds the root's lock. ``extra`` adds entries to the manifest's ``publication``."""
    seq = 1 if head is None else int(head["seq"]) + 1
    parent_digest = None
    if head is not None:
        parent = publication_dir(root, int(head["seq"])) / _checkpoint.MANIFEST
        parent_digest = _checkpoint.file_digest(parent) if parent.exists() else None
    dest = publication_dir(root, seq)
    tmp = root / f".{dest.name}.tmp-{os.getpid()}"
    entry: dict[str, Any] = {
        "seq": seq,
        "kind": "full" if full is None else "delta",
        "parent": None if head is None else int(head["seq"]),
        "parent_manifest": parent_digest,
        "full": seq if full is None else full,
        "step": step,
        "tables": {},
        **(extra or {}),
    }
    try:
        rows, removed = write(tmp, entry["tables"])
        entry["published"] = time.time()
        manifest: dict[str, Any] = {
            "format": _checkpoint.FORMAT,
            "kind": f"publish-{entry['kind']}",
            "created": entry["published"],
            "step": step,
            "publication": entry,
        }
        _checkpoint.finish_dir(tmp, dest, manifest)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        _raise_storage_error(root, e)
        raise
    try:
        digest = _checkpoint.file_digest(dest / _checkpoint.MANIFEST)
        _write_head(root, {"format": FORMAT, "seq": seq, "full": entry["full"]}, entry)
    except BaseException as e:  # HEAD not moved: the publication must not stay behind
        (root / (HEAD + ".tmp")).unlink(missing_ok=True)
        current = read_head(root)
        if current is None or int(current["seq"]) != seq:
            shutil.rmtree(dest, ignore_errors=True)
        _raise_storage_error(root, e)
        raise
    n_bytes = sum(int(f["size"]) for f in manifest["files"].values())
    return Written(seq, entry["kind"], entry["full"], rows, removed, n_bytes, digest)


def _full_reason(
    db: Database, root: Path, head: dict[str, Any] | None, tables: dict[str, Table], full: Any
) -> str | None:
    """Why this publication must be a full one; None if a delta is exact."""
    state = db._publication
    if full is True:
        return "asked (full=True)"
    if head is None:
        return "first publication to this root"
    if state is None or state.root != root:
        return "first publication of this database to this root (its change logs start now)"
    if int(head["seq"]) != state.seq:
        return f"HEAD is seq {head['seq']}, this database last published seq {state.seq}"
    parent = publication_dir(root, state.seq) / _checkpoint.MANIFEST
    if not parent.exists() or _checkpoint.file_digest(parent) != state.digest:
        return f"publication {state.seq} is gone or changed"
    now = {n: t.meta.uid for n, t in tables.items()}
    if now != state.tables:
        return "tables created or dropped since the last publication"
    for t in tables.values():
        t.changes.settle()
    overflowed = sorted(n for n, t in tables.items() if t.changes.overflowed)
    if overflowed:
        return f"the change log of {overflowed} overflowed (see stats()['changelog'])"
    pending = sum(t.changes.pending()[0].shape[0] for t in tables.values())
    live = sum(len(t) for t in tables.values())
    if state.rows_since_full + pending > max(REBASE_FRACTION * live, REBASE_MIN_ROWS):
        return "the deltas since the last full add up to more than half the rows (rebase)"
    return None


def _raise_storage_error(root: Path, e: BaseException) -> None:
    """An OSError of the file system (a full disk) raised as a ``StorageError`` naming
    root; any other error is the caller's to raise."""
    if isinstance(e, OSError) and not isinstance(e, EvdbError):
        why = e.strerror or str(e)
        raise StorageError(
            e.errno, f"{root}: publication failed: {why}", str(e.filename or root)
        ) from e


def _write_head(root: Path, head: dict[str, Any], entry: dict[str, Any]) -> None:
    head["published"] = entry["published"]
    tmp = root / (HEAD + ".tmp")
    with tmp.open("w") as f:
        json.dump(head, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, root / HEAD)
    _checkpoint.fsync_path(root)


def _retain(root: Path, seq: int, keep: int) -> None:
    """Remove publications older than the keep-th newest full one (at or before seq)."""
    fulls = []
    for s in reversed(list_publications(root)):
        if s > seq:
            continue
        manifest = _checkpoint.read_json(publication_dir(root, s) / _checkpoint.MANIFEST, "m")
        if isinstance(manifest, dict) and manifest.get("kind") == "publish-full":
            fulls.append(s)
            if len(fulls) == keep:
                break
    if len(fulls) < keep:
        return
    for s in list_publications(root):
        if s < fulls[-1]:
            shutil.rmtree(publication_dir(root, s), ignore_errors=True)


class _RootLock:
    def __init__(self, root: Path) -> None:
        self.path = root / ".lock"
        self.fd = -1

    def __enter__(self) -> None:
        self.fd = _checkpoint.lock_exclusive(
            self.path, f"root: {self.path.parent} is being published to by another process"
        )

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


# -- writing --------------------------------------------------------------------------------


def _table_entry(config: TableConfig) -> dict[str, Any]:
    return {"dim": config.dim, "key_type": config.key_type, "ttl_steps": config.ttl_steps}


RowChunks = Iterator[tuple[Int64Array, RecordBatch]]


def live_chunks(t: Table) -> RowChunks:
    """A table's live rows, a chunk of whole records at a time, from every tier."""
    return t.records(_CHUNK_ROWS, live_only=True)


def _write_full(
    db: Database, tmp: Path, tables: dict[str, Table], entries: dict[str, Any]
) -> tuple[int, int]:
    """A serving database of the live rows of db's tables (see ``write_full_rows``)."""
    sources = {name: (t.config, live_chunks(t)) for name, t in tables.items()}
    return write_full_rows(tmp, db.step, sources, entries)


def write_full_rows(
    tmp: Path,
    step: int,
    sources: dict[str, tuple[TableConfig, RowChunks]],
    entries: dict[str, Any],
) -> tuple[int, int]:
    """A serving database at tmp of the given live rows per table (a sharded database's
    ranks each give theirs), each row keeping its ``last_step`` (a TTL table's rows expire on
    the server at the trainer's step); then only its checkpoint stays. Returns (rows, 0)."""
    total = 0
    out = open_database(tmp)
    try:
        out.advance(step)
        for name, (config, chunks) in sources.items():
            new = out.create_table(
                name,
                dim=config.dim,
                key_type=config.key_type,
                initializer=config.initializer,
                default_value=config.default_value,
                optimizer=SGD(),
                ttl_steps=config.ttl_steps,
                dram_rows=_CHUNK_ROWS,
                disk=DiskConfig(),
            )
            rows = 0
            for keys, records in chunks:
                m = keys.shape[0]
                copy = RecordBatch(
                    values=np.ascontiguousarray(records.values),
                    slots=np.empty((m, 0), dtype=np.float32),
                    freq=records.freq,
                    last_step=records.last_step,
                    version=records.version,
                )
                # As they are (upsert would stamp last_step = the step)
                new.restore_records(keys, copy)
                rows += m
            entries[name] = {**_table_entry(config), "rows": rows, "removed": 0}
            total += rows
        out.close()
    finally:
        out.close(flush=False)  # after a failure (a full disk): tmp goes, so none of it stays
    (tmp / "LOCK").unlink()
    shutil.rmtree(tmp / WORKING)
    if not any((tmp / CHECKPOINTS).iterdir()):
        raise CorruptDataError(f"{tmp}: the serving database has no checkpoint")
    return total, 0


def _write_delta(tmp: Path, tables: dict[str, Table], entries: dict[str, Any]) -> tuple[int, int]:
    """Per table, the current rows of the touched keys and the removed keys."""
    total_rows = total_removed = 0
    for name, t in tables.items():
        touched, removed = t.changes.pending()
        found, records = t.read_records(touched)  # live rows only, from whichever tier
        keys = touched[found]
        # A touched key without a live row now (deleted, expired, evicted) is removed too.
        gone = np.setdiff1d(np.union1d(removed, touched[~found]), keys, assume_unique=True)
        np.savez(
            tmp / f"{name}.npz",
            allow_pickle=False,
            keys=keys,
            values=np.ascontiguousarray(records.values, dtype=np.float32),
            last_step=records.last_step.astype(np.int64),
            removed=gone.astype(np.int64),
        )
        entries[name] = {
            **_table_entry(t.config),
            "rows": int(keys.shape[0]),
            "removed": len(gone),
        }
        total_rows += int(keys.shape[0])
        total_removed += len(gone)
    return total_rows, total_removed


# -- reading (the follower's side) ------------------------------------------------------------


@dataclass
class Delta:
    """One table's part of a delta publication (see the module docstring)."""

    keys: Int64Array  # (m,) sorted
    values: Float32Array  # (m, dim)
    last_step: Int64Array  # (m,)
    removed: Int64Array  # (r,) sorted


def check_publication(
    root: Path, seq: int, parent: tuple[int, str] | None
) -> tuple[dict[str, Any] | None, str | None]:
    """The manifest of publication seq, checked: (manifest, None), or (None, reason) with
    reason one of "gap" (no directory: removed, or never written; or a delta whose parent is
    not ``parent`` = (seq, xxh3-128 of its MANIFEST.json)), "manifest" (no or an unreadable
    MANIFEST.json: a crash before the rename), "checksum" (a file differs from the manifest)."""
    path = publication_dir(root, seq)
    if not path.is_dir():
        return None, "gap"
    try:
        manifest = _checkpoint.read_manifest(path)
    except CorruptDataError:
        return None, "manifest"
    if manifest is None or "publication" not in manifest:
        return None, "manifest"
    try:
        _checkpoint.verify(path)
    except (CorruptDataError, OSError):
        return None, "checksum"
    entry = manifest["publication"]
    if entry["kind"] == "delta" and (
        parent is None or (entry["parent"], entry["parent_manifest"]) != parent
    ):
        return None, "gap"
    return manifest, None


def load_delta(root: Path, seq: int, manifest: dict[str, Any]) -> dict[str, Delta]:
    """The tables of a checked delta publication, read into memory."""
    out = {}
    for name, entry in manifest["publication"]["tables"].items():
        path = publication_dir(root, seq) / f"{name}.npz"
        dim = int(entry["dim"])
        try:  # checksummed, so only a writer's bug gets here: named, never a KeyError
            with np.load(path, allow_pickle=False) as z:
                keys, values = z["keys"], z["values"]
                last_step, removed = z["last_step"], z["removed"]
        except (KeyError, ValueError, zipfile.BadZipFile) as e:
            raise CorruptDataError(f"{path}: not a delta of table {name!r} ({e})") from e
        m = keys.shape[0]
        if (
            keys.shape != (m,)
            or values.size != m * dim
            or last_step.shape != (m,)
            or removed.ndim != 1
        ):
            raise CorruptDataError(
                f"{path}: arrays of mismatched shapes (keys {keys.shape}, values "
                f"{values.shape} of dim {dim}, last_step {last_step.shape}, removed "
                f"{removed.shape})"
            )
        out[name] = Delta(keys, values.reshape(m, dim), last_step, removed)
    return out


def serve_at(db: Database, step: int) -> None:
    """Make this thread's reads of a read-only database judge TTL at a publication's step
    (``step`` of its manifest): a server's TTL verdicts are then the trainer's at that
    publication. Per thread (``Database.read_at``): views of one full share its database."""
    if not db.read_only:
        raise InvalidArgumentError(f"db: {db.path} is open for writing; advance() moves its step")
    db.read_at(step)
