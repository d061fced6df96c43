"""Checkpoints: self-contained, checksummed copies of a database, full or incremental.

A full checkpoint is a database directory (``evdb.json`` + ``checkpoints/0000000001/``, the
RocksDB checkpoint of the last flush, hard-linked where the file system allows) plus
``MANIFEST.json``: the size and xxh3-128 of every file, the step and each table's version.
An incremental one holds, per table, the rows whose ``version`` is above the base's, and the
sorted list of every key stored (8 bytes a row), so that opening it can drop the base's rows
that were deleted since; its manifest names the base and the base manifest's checksum.

Both are built under a temporary name beside ``dest`` and renamed into place after every file
and directory is fsynced: a crash leaves either no ``dest`` or a complete one.
``evdb.open(workdir, restore=dest)`` (and a read-only ``evdb.open(dest)``) verifies every
checksum first and fails naming the damaged file; nothing opens a checkpoint for writing.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import secrets
import shutil
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np
import xxhash

from evdb.errors import (
    CorruptDataError,
    DatabaseLockedError,
    InvalidArgumentError,
    StorageError,
)

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
    """The manifest of a checkpoint, export or publication at root; None if root has none.

    Every field evdb reads from it is checked here, once, so that a damaged or hand-edited
    manifest fails with ``CorruptDataError`` naming the file and the field rather than with a
    ``KeyError`` somewhere later: ``files`` (relative names that stay inside root, each with
    ``size`` and ``xxh3_128``), ``kind``, ``step``, ``created``, the ``tables`` of a
    checkpoint or export, the ``base`` of an incremental checkpoint, and the ``publication``
    entry of a publication."""
    path = root / MANIFEST
    manifest = read_json(path, "manifest")
    if manifest is None:
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CorruptDataError(f"{path}: not an evdb checkpoint manifest")
    _Fields(path).manifest(manifest)
    return manifest


_HEX128 = re.compile(r"[0-9a-f]{32}")
_KINDS = ("full", "incremental", "publish-full", "publish-delta")  # and "export-<format>"


class _Fields:
    """Checks a manifest's fields, raising ``CorruptDataError`` naming the file and field."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, field: str, what: str, value: Any) -> NoReturn:
        shown = repr(value)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        raise CorruptDataError(f"{self.path}: field {field} must be {what}, got {shown}")

    def get(self, obj: dict[str, Any], key: str, field: str) -> Any:
        if key not in obj:
            raise CorruptDataError(f"{self.path}: field {field} is missing")
        return obj[key]

    def object(self, obj: dict[str, Any], key: str, field: str) -> dict[str, Any]:
        value = self.get(obj, key, field)
        if not isinstance(value, dict):
            self.fail(field, "an object", value)
        return value

    def count(self, obj: dict[str, Any], key: str, field: str, *, none: bool = False) -> None:
        value = self.get(obj, key, field)
        if none and value is None:
            return
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            self.fail(field, "an int >= 0" + (" or null" if none else ""), value)

    def text(self, obj: dict[str, Any], key: str, field: str, *, pattern: Any = None) -> None:
        value = self.get(obj, key, field)
        if not isinstance(value, str) or not value or (pattern and not pattern.fullmatch(value)):
            self.fail(field, "a non-empty string" if pattern is None else "an xxh3-128", value)

    def number(self, value: Any, field: str, *, none: bool) -> None:
        if none and value is None:
            return
        if isinstance(value, bool) or not isinstance(value, float | int):
            self.fail(field, "a number", value)

    def manifest(self, m: dict[str, Any]) -> None:
        kind = m.get("kind")
        if not isinstance(kind, str) or not (kind in _KINDS or kind.startswith("export-")):
            self.fail("kind", f"one of {_KINDS} or 'export-<format>'", kind)
        self.count(m, "step", "step")
        self.number(m.get("created"), "created", none=True)  # optional: only evdb info reads it
        for rel, entry in self.object(m, "files", "files").items():
            field = f"files[{rel!r}]"
            problem = _name_problem(rel)
            if problem:
                raise CorruptDataError(f"{self.path}: {field}: {problem}")
            if not isinstance(entry, dict):
                self.fail(field, "an object", entry)
            self.count(entry, "size", f"{field}.size")
            self.text(entry, "xxh3_128", f"{field}.xxh3_128", pattern=_HEX128)
        if kind.startswith("publish-"):
            self.publication(self.object(m, "publication", "publication"), kind)
            return
        for name, t in self.object(m, "tables", "tables").items():
            if not isinstance(t, dict):
                self.fail(f"tables[{name!r}]", "an object", t)
            self.count(t, "rows", f"tables[{name!r}].rows")
            if not kind.startswith("export-"):  # what an incremental checkpoint reads
                self.text(t, "uid", f"tables[{name!r}].uid")
                self.count(t, "version", f"tables[{name!r}].version")
        if kind == "incremental":
            self.text(m, "base", "base")
            self.text(m, "base_manifest", "base_manifest", pattern=_HEX128)
            for name in self.object(m, "changed_rows", "changed_rows"):
                self.count(m["changed_rows"], name, f"changed_rows[{name!r}]")

    def publication(self, p: dict[str, Any], kind: str) -> None:
        """The fields of ``evdb.publish``'s entry that publish and its followers read."""
        if p.get("kind") != kind.removeprefix("publish-"):
            self.fail("publication.kind", repr(kind.removeprefix("publish-")), p.get("kind"))
        for key in ("seq", "full", "step"):
            self.count(p, key, f"publication.{key}")
        self.count(p, "parent", "publication.parent", none=True)
        digest = self.get(p, "parent_manifest", "publication.parent_manifest")
        if digest is not None and not (isinstance(digest, str) and _HEX128.fullmatch(digest)):
            self.fail("publication.parent_manifest", "an xxh3-128 or null", digest)
        self.number(p.get("published"), "publication.published", none=False)
        for name, t in self.object(p, "tables", "publication.tables").items():
            if not isinstance(t, dict):
                self.fail(f"publication.tables[{name!r}]", "an object", t)
            dim = self.get(t, "dim", f"publication.tables[{name!r}].dim")
            if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
                self.fail(f"publication.tables[{name!r}].dim", "an int >= 1", dim)


def _name_problem(rel: Any) -> str | None:
    """Why rel cannot name a file inside a checkpoint (a relative POSIX path that stays in the
    directory: no absolute path, no "..", no empty or "." part), or None."""
    if not isinstance(rel, str) or not rel:
        return "not a file name"
    if "\0" in rel or rel.startswith("/"):
        return "an absolute path or a NUL byte: names must stay inside the directory"
    if any(part in ("", ".", "..") for part in rel.split("/")):
        return "a '..', '.' or empty part: names must stay inside the directory"
    if rel == MANIFEST:
        return f"the {MANIFEST} cannot list itself"
    return None


# _LOCK_NOTE: what may sit in a checkpoint besides its manifest and the files it lists is an
# empty LOCK: a writable open creates it (evdb.database) before the checksums are checked.


def _regular_files(root: Path) -> set[str]:
    """The relative names of every regular file under root. A symbolic link or a special
    file (FIFO, socket, device) anywhere below root is refused: a checkpoint holds only
    regular files, and a link would let it read (or serve) a file from elsewhere."""
    found: set[str] = set()
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        with os.scandir(root / rel_dir) as entries:
            for entry in entries:
                rel = f"{rel_dir}{entry.name}"
                if entry.is_symlink():
                    raise CorruptDataError(
                        f"{entry.path}: a symbolic link; a checkpoint holds only regular files"
                    )
                if entry.is_dir(follow_symlinks=False):
                    stack.append(rel + "/")
                elif entry.is_file(follow_symlinks=False):
                    found.add(rel)
                else:
                    raise CorruptDataError(
                        f"{entry.path}: not a regular file (a FIFO, socket or device)"
                    )
    return found


def _size_and_digest(path: Path) -> tuple[int, str]:
    """A regular file's size and xxh3-128, opened without following a link (so a file
    swapped for a link after the directory was listed is refused, not read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:  # others (a file we may not read: EACCES) stay OSErrors, not damage
        if e.errno == errno.ELOOP:
            raise CorruptDataError(f"{path}: a symbolic link; a checkpoint holds only files") from e
        if e.errno == errno.ENOENT:
            raise CorruptDataError(f"{path}: missing (removed while it was checked)") from e
        raise
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CorruptDataError(f"{path}: not a regular file")
        h = xxhash.xxh3_128()
        while block := f.read(_CHUNK):
            h.update(block)
    return st.st_size, h.hexdigest()


def verify(root: str | os.PathLike[str]) -> dict[str, Any]:
    """Check a checkpoint's, export's or publication's directory against its manifest: the
    directory holds exactly the files the manifest lists (plus the manifest, and a database's
    empty LOCK), each of the listed size and xxh3-128, and no link or special file; for an
    incremental checkpoint, its base too. Returns the manifest.

    Raises
    ------
    CorruptDataError
        Naming the first bad file: missing, unlisted, resized, damaged, a link, or a manifest
        field that is missing, of the wrong type, or names a file outside the directory.
    """
    root = Path(root)
    manifest = read_manifest(root)
    if manifest is None:
        raise CorruptDataError(f"{root}: no {MANIFEST}: not a checkpoint or export")
    listed = manifest["files"]
    found = _regular_files(root)
    unlisted = sorted(found - listed.keys() - {MANIFEST})
    if "LOCK" in unlisted and (root / "LOCK").stat().st_size == 0:
        unlisted.remove("LOCK")  # the LOCK of a process that opens it (see _LOCK_NOTE)
    if unlisted:
        raise CorruptDataError(
            f"{root / unlisted[0]}: not listed in {root / MANIFEST} (added after it was written)"
        )
    for rel, want in sorted(listed.items()):
        path = root / rel
        if rel not in found:
            what = "not a regular file" if os.path.lexists(path) else "missing"
            raise CorruptDataError(f"{path}: {what} (listed in {root / MANIFEST})")
        size, digest = _size_and_digest(path)
        if size != want["size"]:
            raise CorruptDataError(f"{path}: {size} bytes, the manifest says {want['size']}")
        if digest != want["xxh3_128"]:
            raise CorruptDataError(f"{path}: checksum mismatch: the file is damaged")
    if manifest["kind"] == "incremental":
        base = Path(manifest["base"])
        if read_manifest(base) is None:
            raise CorruptDataError(
                f"{base}: the base of {root} is gone or no longer a checkpoint (no {MANIFEST})"
            )
        if file_digest(base / MANIFEST) != manifest["base_manifest"]:
            raise CorruptDataError(
                f"{base / MANIFEST}: the base of {root} has changed since the incremental "
                "checkpoint was taken (opened and written to, or replaced)"
            )
        verify(base)
    return manifest


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


def _finish(tmp: Path, dest: Path, manifest: dict[str, Any]) -> None:
    """Checksum every file, write the manifest, fsync everything, rename into place. A link
    or special file in tmp is refused here, as ``verify`` would refuse it later."""
    files = {}
    for rel in sorted(_regular_files(tmp)):
        path = tmp / rel
        size, digest = _size_and_digest(path)
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
            db._copy_current_checkpoint(tmp)
        else:
            manifest["kind"] = "incremental"
            manifest["base"] = str(base)
            manifest["base_manifest"] = file_digest(Path(str(base)) / MANIFEST)
            rows = _write_delta(db, tmp, base_manifest["tables"])
            manifest["changed_rows"] = rows
            db._write_metadata_file(tmp / "metadata.npz")
        _finish(tmp, dest, manifest)
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
    out: Path, part: int, buffer: list[tuple[np.ndarray, np.ndarray]], table: Any
) -> None:
    keys = np.concatenate([k for k, _ in buffer])
    records = np.concatenate([r for _, r in buffer])
    arrays = {"keys": keys, "records": records.view(np.uint8)}
    if table.keeps_strings:  # the strings of the changed rows, as UTF-8 + ends
        encoded = [(s or "").encode() for s in table.strings(keys)]
        arrays["string_ends"] = np.cumsum([len(b) for b in encoded], dtype=np.int64)
        arrays["strings"] = np.frombuffer(b"".join(encoded), dtype=np.uint8)
    np.savez(out / f"rows-{part:06d}.npz", allow_pickle=False, **arrays)


def chain_of(root: Path) -> list[Path]:
    """The checkpoints to apply to rebuild root, oldest (the full one) first."""
    chain = [root]
    manifest = read_manifest(root)
    while manifest is not None and manifest["kind"] == "incremental":
        base = Path(manifest["base"])
        if base.resolve() in {p.resolve() for p in chain}:  # verify=False skips the digests
            raise CorruptDataError(f"{root}: its chain of base checkpoints loops at {base}")
        chain.append(base)
        manifest = read_manifest(base)
        if manifest is None:
            raise CorruptDataError(f"{base}: the base checkpoint is gone or no longer one")
    return chain[::-1]
