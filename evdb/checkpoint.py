"""Checkpoints: self-contained, checksummed copies of a database, full or incremental.

A full checkpoint is a database directory (``evdb.json`` + ``checkpoints/0000000001/``, the
RocksDB checkpoint of the last flush, hard-linked where the file system allows) plus
``MANIFEST.json``: the size and xxh3-128 of every file, the step and each table's version.
An incremental one holds, per table, the rows whose ``version`` is above the base's, and the
sorted list of every key stored (8 bytes a row), so that opening it can drop the base's rows
that were deleted since; its manifest names the base and the base manifest's checksum.

Both are built under a temporary name beside ``dest`` and renamed into place after every file
and directory is fsynced: a crash leaves either no ``dest`` or a complete one.
``evdb.open(dest)`` verifies every checksum first and fails naming the damaged file.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import xxhash

from evdb.errors import CorruptDataError, DatabaseLockedError, InvalidArgumentError

if TYPE_CHECKING:
    from evdb.database import Database

__all__ = ["MANIFEST", "checkpoint", "read_manifest", "verify"]

MANIFEST = "MANIFEST.json"
FORMAT = "evdb-checkpoint-1"
DELTA = "delta"
_CHUNK = 1 << 20
_DELTA_ROWS = 1 << 18  # rows per delta file: bounds the memory of writing and applying one


def file_digest(path: Path) -> str:
    h = xxhash.xxh3_128()
    with path.open("rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


def fsync_path(path: Path) -> None:
    """fsync a file or a directory (a rename or a new entry is durable once its directory
    is)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def lock_exclusive(path: Path, busy: str) -> int:
    """The descriptor of path (created if missing), flock'ed exclusively for this process:
    a database's LOCK, a publish root's .lock. ``DatabaseLockedError(busy)`` if another
    process or handle holds it. Release with ``flock(fd, LOCK_UN)`` and ``close``."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DatabaseLockedError(busy) from None
    return fd


def read_json(path: Path, what: str) -> Any:
    """A JSON file's contents; None if it does not exist; ``CorruptDataError`` naming the file
    (and what it should have been) if it cannot be read."""
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CorruptDataError(f"{path}: cannot read the {what} ({e})") from e


def read_manifest(root: Path) -> dict[str, Any] | None:
    """The manifest of a checkpoint or export at root; None if root has none."""
    path = root / MANIFEST
    manifest = read_json(path, "manifest")
    if manifest is None:
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CorruptDataError(f"{path}: not an evdb checkpoint manifest")
    return manifest


def verify(root: str | os.PathLike[str]) -> dict[str, Any]:
    """Check the size and checksum of every file a manifest lists (and, for an incremental
    checkpoint, its base). Raises ``CorruptDataError`` naming the first bad file."""
    root = Path(root)
    manifest = read_manifest(root)
    if manifest is None:
        raise CorruptDataError(f"{root}: no {MANIFEST}: not a checkpoint or export")
    for rel, want in manifest["files"].items():
        path = root / rel
        if not path.is_file():
            raise CorruptDataError(f"{path}: missing (listed in {root / MANIFEST})")
        if path.stat().st_size != want["size"]:
            raise CorruptDataError(
                f"{path}: {path.stat().st_size} bytes, the manifest says {want['size']}"
            )
        if file_digest(path) != want["xxh3_128"]:
            raise CorruptDataError(f"{path}: checksum mismatch: the file is damaged")
    if manifest["kind"] == "incremental":
        base = Path(manifest["base"])
        if file_digest(base / MANIFEST) != manifest["base_manifest"]:
            raise CorruptDataError(
                f"{base / MANIFEST}: the base of {root} has changed since the incremental "
                "checkpoint was taken (opened and written to, or replaced)"
            )
        verify(base)
    return manifest


def _finish(tmp: Path, dest: Path, manifest: dict[str, Any]) -> None:
    """Checksum every file, write the manifest, fsync everything, rename into place."""
    files = {}
    for path in sorted(p for p in tmp.rglob("*") if p.is_file()):
        files[path.relative_to(tmp).as_posix()] = {
            "size": path.stat().st_size,
            "xxh3_128": file_digest(path),
        }
        fsync_path(path)
    manifest["files"] = files
    with (tmp / MANIFEST).open("w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    for d in sorted((p for p in tmp.rglob("*") if p.is_dir()), reverse=True):
        fsync_path(d)
    fsync_path(tmp)
    os.replace(tmp, dest)
    fsync_path(dest.parent)


def checkpoint(
    db: Database, dest: str | os.PathLike[str], base: str | os.PathLike[str] | None = None
) -> dict[str, Any]:
    """Flush db, then write a full (or, with ``base``, incremental) checkpoint to dest."""
    dest = Path(dest)
    if dest.exists():
        raise InvalidArgumentError(f"dest: {dest} already exists")
    base_manifest = None
    if base is not None:
        base = Path(base).resolve()
        base_manifest = read_manifest(base)
        if base_manifest is None:
            raise InvalidArgumentError(
                f"base: {base} is not a checkpoint (no {MANIFEST}; a checkpoint that was "
                "opened for writing has become a database)"
            )
    db.flush()
    dest.parent.mkdir(parents=True, exist_ok=True)
    for stale in dest.parent.glob(f".{dest.name}.tmp-*"):  # left by a crashed checkpoint
        shutil.rmtree(stale, ignore_errors=True)
    tmp = dest.parent / f".{dest.name}.tmp-{os.getpid()}"
    tables = {name: db.table(name)._checkpoint_info() for name in db.tables()}
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "created": time.time(),
        "step": db.step,
        "tables": tables,
    }
    try:
        if base_manifest is None:
            manifest["kind"] = "full"
            db._copy_current_checkpoint(tmp)
        else:
            manifest["kind"] = "incremental"
            manifest["base"] = str(base)
            manifest["base_manifest"] = file_digest(Path(str(base)) / MANIFEST)
            tmp.mkdir()
            rows = _write_delta(db, tmp, base_manifest["tables"])
            manifest["changed_rows"] = rows
            db._write_metadata_file(tmp / "metadata.npz")
        _finish(tmp, dest, manifest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def _write_delta(
    db: Database, root: Path, base_tables: dict[str, dict[str, Any]]
) -> dict[str, int]:
    """Per table: every stored key (sorted) and the records changed since the base."""
    changed = {}
    for name in db.tables():
        table = db.table(name)
        info = table._checkpoint_info()
        since = -1
        old = base_tables.get(name)
        if old is not None and old["uid"] == info["uid"]:
            since = int(old["version"])
        out = root / DELTA / name
        out.mkdir(parents=True)
        keys, n_changed, part = [], 0, 0
        buffer: list[tuple[np.ndarray, np.ndarray]] = []
        buffered = 0
        for chunk_keys, records in table._chain.scan(65536):
            keys.append(chunk_keys)
            new = records.version.astype(np.int64) > since
            if new.any():
                buffer.append((chunk_keys[new], records.take(new).pack()))
                buffered += int(np.count_nonzero(new))
            if buffered >= _DELTA_ROWS:
                _save_part(out, part, buffer, table)
                part, n_changed, buffer, buffered = part + 1, n_changed + buffered, [], 0
        if buffer:
            _save_part(out, part, buffer, table)
            n_changed += buffered
        all_keys = np.sort(np.concatenate(keys)) if keys else np.empty(0, np.int64)
        np.save(out / "keys.npy", all_keys)
        changed[name] = n_changed
    return changed


def _save_part(
    out: Path, part: int, buffer: list[tuple[np.ndarray, np.ndarray]], table: Any
) -> None:
    keys = np.concatenate([k for k, _ in buffer])
    records = np.concatenate([r for _, r in buffer])
    arrays = {"keys": keys, "records": records.view(np.uint8)}
    if table._strings is not None:  # the strings of the changed rows, as UTF-8 + ends
        encoded = [(s or "").encode() for s in table._strings.get(keys)]
        arrays["string_ends"] = np.cumsum([len(b) for b in encoded], dtype=np.int64)
        arrays["strings"] = np.frombuffer(b"".join(encoded), dtype=np.uint8)
    np.savez(out / f"rows-{part:06d}.npz", allow_pickle=False, **arrays)


def chain_of(root: Path) -> list[Path]:
    """The checkpoints to apply to rebuild root, oldest (the full one) first."""
    chain = [root]
    manifest = read_manifest(root)
    while manifest is not None and manifest["kind"] == "incremental":
        base = Path(manifest["base"])
        chain.append(base)
        manifest = read_manifest(base)
        if manifest is None:
            raise CorruptDataError(f"{base}: the base checkpoint is gone or no longer one")
    return chain[::-1]
