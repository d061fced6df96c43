"""A publish root on disk: the log of publications that a trainer writes and servers follow.

The root::

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

A delta's ``<table>.npz`` holds ``keys`` (m,) int64 (sorted), ``values`` (m, dim) float32
and ``last_step`` (m,) int64 of the rows whose version rose since the parent, and
``removed`` (r,) int64 (sorted), the keys whose rows left every tier since.

Durability (``write_publication``): a publication is built under a temporary name,
checksummed, fsynced and renamed into place; then HEAD is replaced (write, fsync, rename,
fsync the root). A crash at any moment leaves the root readable at the previous HEAD.
Retention (``retain``): publications older than the K-th newest full one are removed after
HEAD moves; a follower that fell behind further loads the newest full.

The writers are ``evdb.publish`` (one database) and ``evdb.distributed.publish`` (the shards
merged); the reader is ``evdb.api.follow`` (``check_publication``, ``load_delta``).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from evdb import checkpoint as _checkpoint
from evdb._types import Float32Array, Int64Array
from evdb.config import TableConfig
from evdb.errors import CorruptDataError, EvdbError, StorageError

__all__ = [
    "FORMAT",
    "HEAD",
    "Delta",
    "RootLock",
    "Written",
    "check_publication",
    "clear_stale",
    "list_publications",
    "load_delta",
    "publication_dir",
    "read_head",
    "retain",
    "table_entry",
    "write_publication",
]

HEAD = "HEAD"
FORMAT = "evdb-publish-1"
_SEQ = re.compile(r"\d{12}")


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


def retain(root: Path, seq: int, keep: int) -> None:
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


class RootLock:
    """The root's ``.lock``, held (flock) while a publication is written: one publisher per
    root; ``DatabaseLockedError`` if another process holds it."""

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


def table_entry(config: TableConfig) -> dict[str, Any]:
    """What a publication's manifest says of a table besides its counts."""
    return {"dim": config.dim, "key_type": config.key_type, "ttl_steps": config.ttl_steps}


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
