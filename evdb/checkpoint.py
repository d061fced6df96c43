"""Checkpoints: self-contained, checksummed copies of a database, full or incremental.

A full checkpoint is a database directory (``evdb.json`` + ``checkpoints/0000000001/``, the
RocksDB checkpoint of the last flush, hard-linked where the file system allows) plus
``MANIFEST.json`` (``evdb.manifest``): the size and xxh3-128 of every file, the step and each
table's version. An incremental one holds, per table, the rows whose ``version`` is above the
base's, and the sorted list of every key stored (8 bytes a row), so that opening it can drop
the base's rows that were deleted since; its manifest names the base and the base manifest's
checksum, and its ``metadata.npz`` holds the database's metadata at the checkpoint.

Both are built under a temporary name beside ``dest`` and renamed into place after every file
and directory is fsynced (``finish_dir``, which exports and publications use too): a crash
leaves either no ``dest`` or a complete one. ``evdb.open(workdir, restore=dest)``
(``evdb.checkpoint_restore``) and a read-only ``evdb.open(dest)`` verify every checksum first
and fail naming the damaged file; nothing opens a checkpoint for writing.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import secrets
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from evdb.errors import DatabaseLockedError, InvalidArgumentError, StorageError
from evdb.manifest import (
    FORMAT,
    MANIFEST,
    file_digest,
    read_json,
    read_manifest,
    regular_files,
    size_and_digest,
    verify,
)

if TYPE_CHECKING:
    from evdb.database import Database
    from evdb.storage import Storage
    from evdb.table import Table

__all__ = [
    "DELTA",
    "FORMAT",
    "MANIFEST",
    "METADATA",
    "as_storage_error",
    "checkpoint",
    "file_digest",
    "finish_dir",
    "fsync_path",
    "lock_exclusive",
    "read_json",
    "read_manifest",
    "sweep_dead_temp_dirs",
    "temp_dir_beside",
    "verify",
]

DELTA = "delta"  # an incremental checkpoint's directory of changed rows, one folder a table
METADATA = "metadata.npz"  # an incremental checkpoint's copy of the database's metadata
_DELTA_ROWS = 1 << 18  # rows per delta file: bounds the memory of writing and applying one


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


_TEMP = re.compile(r"\..+\.tmp-[0-9]+-[0-9a-f]{8}")  # what temp_dir_beside names


def temp_dir_beside(dest: Path) -> tuple[Path, int]:
    """A new empty directory beside dest to build dest in, ``.<name>.tmp-<pid>-<random>``,
    and the descriptor of the flock this process holds on it until it is renamed to dest or
    removed (close the descriptor after that). First removes the temporary directories that
    writers which died left in the same parent (a killed checkpoint leaves a full copy of the
    database's files): their lock went with their process, whatever its PID namespace.

    The directory is locked after mkdir names it, so a concurrent sweep may remove it in
    between; that is seen (the name no longer leads to the locked directory) and a new one
    is made. A random suffix keeps two writers (in different PID namespaces too) apart."""
    sweep_dead_temp_dirs(dest.parent)
    for _ in range(8):  # a sweep can win the race only while it runs: bounded retries
        # not tempfile.mkdtemp: its mode 0700 would become the checkpoint's (umask's here)
        tmp = dest.parent / f".{dest.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            os.mkdir(tmp)
            fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except (FileExistsError, FileNotFoundError):
            continue
        fcntl.flock(fd, fcntl.LOCK_EX)  # waits only while a sweep removes it
        try:
            if os.stat(tmp, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                return tmp, fd
        except FileNotFoundError:
            pass
        os.close(fd)
    raise OSError(f"{dest.parent}: cannot make a temporary directory for {dest.name}")


def sweep_dead_temp_dirs(parent: Path) -> None:
    """Remove parent's temporary directories (named by ``temp_dir_beside``) whose writer
    died: nobody holds their lock. A live writer's is never touched; nor is anything else
    (links, files, other tools' temporary names)."""
    try:
        names = [e.name for e in os.scandir(parent) if _TEMP.fullmatch(e.name)]
    except FileNotFoundError:
        return
    for name in names:
        path = parent / name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:  # gone, a link, or not ours to open
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # still the directory locked (not renamed into place meanwhile): remove it
            if os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                shutil.rmtree(path, ignore_errors=True)
        except (BlockingIOError, FileNotFoundError):  # its writer is alive, or it is gone
            pass
        finally:
            os.close(fd)


def finish_dir(tmp: Path, dest: Path, manifest: dict[str, Any]) -> None:
    """Seal a directory built under a temporary name: checksum every file of tmp into the
    manifest's ``files``, write ``MANIFEST.json``, fsync every file and directory, and rename
    tmp to dest. A link or special file in tmp is refused here, as ``verify`` would refuse it
    later. Checkpoints, exports and publications are all finished this way."""
    files = {}
    for rel in sorted(regular_files(tmp)):
        path = tmp / rel
        size, digest = size_and_digest(path)
        files[rel] = {"size": size, "xxh3_128": digest}
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
            raise InvalidArgumentError(f"base: {base} is not a checkpoint (no {MANIFEST})")
        if base_manifest["kind"] not in ("full", "incremental"):
            raise InvalidArgumentError(
                f"base: {base} is an {base_manifest['kind']}, not a checkpoint: an "
                "incremental checkpoint needs a full or incremental one as its base"
            )
    db.flush()
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp, owner = temp_dir_beside(dest)
    tables = {name: db.table(name).checkpoint_info() for name in db.tables()}
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "created": time.time(),
        "step": db.step,
        "tables": tables,
    }
    try:
        if base_manifest is None:
            manifest["kind"] = "full"
            db.storage.copy_current_checkpoint(tmp)
        else:
            manifest["kind"] = "incremental"
            manifest["base"] = str(base)
            manifest["base_manifest"] = file_digest(Path(str(base)) / MANIFEST)
            rows = _write_delta(db, tmp, base_manifest["tables"])
            manifest["changed_rows"] = rows
            _write_metadata(db.storage, db.tables(), tmp / METADATA)
        finish_dir(tmp, dest, manifest)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        error = as_storage_error(e, f"dest: {dest}: checkpoint failed", dest)
        if error is None:
            raise
        raise error from e
    finally:
        os.close(owner)  # after the rename or the removal: a sweep never sees it unlocked
    return manifest


def as_storage_error(e: BaseException, what: str, path: Path) -> StorageError | None:
    """An I/O error (a full disk) that failed a checkpoint or export, as the ``StorageError``
    to raise, naming path; None for anything else (a missing source, bad input, a
    ``KeyboardInterrupt``), raised as it was."""
    if not isinstance(e, OSError) or isinstance(e, FileNotFoundError):
        return None
    why = e.strerror or str(e)  # (a StorageError's own names the temporary directory)
    return StorageError(e.errno, f"{what}: {why}", str(path))


def _write_delta(
    db: Database, root: Path, base_tables: dict[str, dict[str, Any]]
) -> dict[str, int]:
    """Per table: every stored key (sorted) and the records changed since the base."""
    changed = {}
    for name in db.tables():
        table = db.table(name)
        info = table.checkpoint_info()
        since = -1
        old = base_tables.get(name)
        if old is not None and old["uid"] == info["uid"]:
            since = int(old["version"])
        out = root / DELTA / name
        out.mkdir(parents=True)
        keys, n_changed, part = [], 0, 0
        buffer: list[tuple[np.ndarray, np.ndarray]] = []
        buffered = 0
        for chunk_keys, records in table.records(65536):
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
    out: Path, part: int, buffer: list[tuple[np.ndarray, np.ndarray]], table: Table
) -> None:
    keys = np.concatenate([k for k, _ in buffer])
    records = np.concatenate([r for _, r in buffer])
    arrays = {"keys": keys, "records": records.view(np.uint8)}
    if table.keeps_strings:  # the strings of the changed rows, as UTF-8 + ends
        encoded = [(s or "").encode() for s in table.strings(keys)]
        arrays["string_ends"] = np.cumsum([len(b) for b in encoded], dtype=np.int64)
        arrays["strings"] = np.frombuffer(b"".join(encoded), dtype=np.uint8)
    np.savez(out / f"rows-{part:06d}.npz", allow_pickle=False, **arrays)


def _write_metadata(storage: Storage, tables: list[str], path: Path) -> None:
    """The metadata of the last flush (the database's manifest and each table's state, as
    the store holds them) and the store's column families, for an incremental checkpoint
    (``evdb.checkpoint_restore`` reads it back)."""
    meta = storage.stored_metadata(tables)
    arrays = {k: np.frombuffer(v, dtype=np.uint8) for k, v in meta.items()}
    arrays["column_families"] = np.frombuffer(
        json.dumps(storage.column_families).encode(), dtype=np.uint8
    )
    np.savez(path, allow_pickle=False, **arrays)
