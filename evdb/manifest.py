"""Manifests: the checksummed list of files of a checkpoint, export or publication.

``MANIFEST.json`` sits at the root of the directory it describes and lists every other file
by relative name, with its size and xxh3-128; its ``kind`` says what the directory is
(``full`` and ``incremental`` checkpoints, ``publish-full`` and ``publish-delta``
publications, ``export-<format>`` exports) and the fields that kind carries. ``verify``
checks a directory against it; ``evdb.checkpoint.finish_dir`` writes it.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from pathlib import Path
from typing import Any, NoReturn

import xxhash

from evdb.errors import CorruptDataError

__all__ = [
    "FORMAT",
    "MANIFEST",
    "file_digest",
    "read_json",
    "read_manifest",
    "regular_files",
    "size_and_digest",
    "verify",
]

MANIFEST = "MANIFEST.json"
FORMAT = "evdb-checkpoint-1"
_CHUNK = 1 << 20


def file_digest(path: Path) -> str:
    """The xxh3-128 of a file's bytes, as 32 hex digits (what a manifest lists)."""
    h = xxhash.xxh3_128()
    with path.open("rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


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


def regular_files(root: Path) -> set[str]:
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


def size_and_digest(path: Path) -> tuple[int, str]:
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
    found = regular_files(root)
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
        size, digest = size_and_digest(path)
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
