"""A database's storage: its directory, lock, pointer and checkpoints, and the RocksDB store
that holds every table's rows.

A database directory holds::

    evdb.json              which checkpoint is current, and the column families RocksDB needs
                           to open it (replaced atomically: write, fsync, rename)
    checkpoints/<n>/       the state of the last completed flush: a RocksDB checkpoint (hard
                           links) holding every table's rows, plus the metadata (step, table
                           configs, counters, admission state) in its default column family
    rocksdb/               the working copy, recreated from the current checkpoint at open
    LOCK                   held (flock) by the process that has the database open

Between flushes, rows that eviction writes down go to the working copy only. A flush
(``Storage.commit``) stores the metadata, has RocksDB take a checkpoint (a consistent cut
across every column family), and then points ``evdb.json`` at it. A crash at any moment
therefore reopens to exactly the last completed flush, and nothing written after it can leak
in. A read-only open reads the current checkpoint itself, pinned (``RocksStore``).
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from evdb.checkpoint import fsync_path, lock_exclusive
from evdb.config import DiskConfig, TableConfig
from evdb.errors import CorruptDataError, InvalidArgumentError, StorageError
from evdb.manifest import read_json, read_manifest
from evdb.tiers.rocks import RocksStrings, RocksTier
from evdb.tiers.store import Compression, RocksStore, link_or_copy_tree

__all__ = [
    "CHECKPOINTS",
    "FORMAT",
    "POINTER",
    "WORKING",
    "Metadata",
    "Storage",
    "read_pointer",
    "rocks_strings",
    "rocks_tier",
]

FORMAT = "evdb-rocksdb-1"
POINTER = "evdb.json"
WORKING = "rocksdb"
CHECKPOINTS = "checkpoints"
# what a flush leaves in checkpoints/: <n>/, or RocksDB's <n>.tmp/ if it stopped midway
_CHECKPOINT_NAME = re.compile(r"[0-9]{10}(\.tmp)?")
# evdb's own entries of a database directory, which it deletes, truncates or rewrites
_INTERNAL = (CHECKPOINTS, WORKING, WORKING + ".tmp", POINTER + ".tmp", "LOCK")
# What evdb.distributed writes at a sharded root (evdb.distributed.layout.LAYOUT); storage
# cannot import the layer above it, so it names the file to say what it found.
_SHARDED_LAYOUT = "sharding.json"
_SNAPSHOT_TRIES = 50  # read-only opens: checkpoints a writer may remove under one open

# What a commit stores beside the rows: the database's manifest ({"step", "tables": name ->
# config dict}), and each table's state that is not rows (``Table.flush_state``), by name.
Metadata = tuple[dict[str, Any], dict[str, dict[str, np.ndarray]]]


def _column_family(table: str) -> str:
    return f"t.{table}"


def _strings_family(table: str) -> str:
    return f"s.{table}"


def rocks_tier(store: RocksStore, name: str, config: TableConfig) -> RocksTier:
    """A table's rows in the store (its column family created if missing)."""
    disk = config.disk or DiskConfig(dtype=config.dtype)  # what the table stores, at its size
    return RocksTier(
        store,
        _column_family(name),
        config.dim,
        config.optimizer.n_slots(config.dim),
        compression=disk.compression,
        dtype=disk.dtype,
        slot_dtype=config.slot_dtype,
    )


def rocks_strings(store: RocksStore, name: str, config: TableConfig) -> RocksStrings | None:
    """A table's original key strings in the store, if it keeps them (else None)."""
    return RocksStrings(store, _strings_family(name)) if config.keep_strings else None


def read_pointer(root: Path) -> dict[str, Any] | None:
    """The ``evdb.json`` of the database directory (or full checkpoint) root; None if there
    is none; ``CorruptDataError`` if it is not one."""
    path = root / POINTER
    meta = read_json(path, "database pointer")
    if meta is None:
        return None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else meta
        raise CorruptDataError(f"{path}: unknown format {found!r}, expected {FORMAT!r}")
    return meta


class Storage:
    """The directory of one open database and the RocksDB store its tables' rows live in.

    ``Database`` owns one and asks it to open (``lock``, then ``open``, or ``adopt`` a store a
    restore built), to make the current state durable (``commit``) and to let go
    (``release``); checkpoints copy its current checkpoint, and each table's rows and strings
    are column families of its store (``table_rows``, ``table_strings``).

    Parameters
    ----------
    path : Path
        The database directory.
    read_only : bool
        Serve the current checkpoint in place: no lock, no working copy, nothing written.
    mmap_reads : bool
        RocksDB reads its files through memory maps (see ``evdb.open``).
    """

    def __init__(self, path: Path, *, read_only: bool, mmap_reads: bool) -> None:
        self.path = path
        self.read_only = read_only
        self.mmap_reads = mmap_reads
        self._lock = -1
        self._checkpoint = 0  # the number of the current checkpoint (0: none yet)
        self._store: RocksStore | None = None

    # -- before opening: what a writable open refuses ------------------------------------
    def refuse_other_paths(self) -> None:
        """Refuse, with what to do instead, a path that is a file or the root of a sharded
        database (a directory of shard databases, opened by every rank of a job)."""
        path = self.path
        if path.exists() and not path.is_dir():
            raise InvalidArgumentError(
                f"path: {path} is a file; evdb.open takes the directory of a database (created "
                "if missing) or of a checkpoint"
            )
        if (path / _SHARDED_LAYOUT).exists():
            raise InvalidArgumentError(
                f"path: {path} is a sharded database or checkpoint ({_SHARDED_LAYOUT}): open "
                "it with evdb.distributed.open(path) on every rank of a torch.distributed job, "
                f"or one shard with evdb.open({str(path / 'shard-00000')!r}, read_only=True); "
                f"for one process, reshard it to one shard first: evdb reshard {path} DEST "
                "--shards 1"
            )

    def holds_database(self) -> bool:
        """Whether the directory has a pointer (is a database or a full checkpoint)."""
        return (self.path / POINTER).exists()

    def refuse_checkpoint(self) -> None:
        """A writable open of a checkpoint in place would turn it into a database, consuming
        it (its manifest and deltas gone, its state moved on): refused, with the way to
        resume from it instead."""
        manifest = read_manifest(self.path)
        if manifest is None:
            return
        where = str(self.path)
        raise InvalidArgumentError(
            f"path: {where} is an evdb checkpoint ({manifest.get('kind')}); opening it for "
            f"writing would consume it. Resume from it in a work directory: "
            f"evdb.open(workdir, restore={where!r}); or serve it as it is: "
            f"evdb.open({where!r}, read_only=True)"
        )

    def require_empty(self) -> None:
        """``restore=`` starts a new database: the directory must be missing or empty (its
        LOCK aside, once this handle holds it), never a database whose state it would
        overwrite."""
        if not self.path.exists():
            return
        if not self.path.is_dir():
            raise InvalidArgumentError(f"path: {self.path} is not a directory")
        found = sorted(e.name for e in self.path.iterdir() if e.name != "LOCK")
        if found:
            raise InvalidArgumentError(
                f"path: {self.path} is not empty (it holds {', '.join(found[:3])}); restore= "
                "starts a new database from the checkpoint: pass a missing or empty directory"
            )

    def refuse_links(self) -> None:
        """Before a writable open touches anything: none of evdb's own entries of the
        directory is a symbolic link."""
        for name in _INTERNAL:
            _refuse_link(self.path, self.path / name)

    def lock(self) -> bool:
        """Create the directory if missing and lock it for this handle; returns whether it
        was created. ``DatabaseLockedError`` if another process or handle holds it."""
        created = not self.path.exists()
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock = lock_exclusive(
            self.path / "LOCK",
            f"path: {self.path} is open in another process or handle; close it first",
        )
        return created

    # -- opening ----------------------------------------------------------------------------
    def open(self) -> None:
        """Recreate the working copy from the current checkpoint (or start empty); read-only,
        open the current checkpoint itself."""
        self._store = self._open_snapshot() if self.read_only else self._open_working()

    def adopt(self, store: RocksStore) -> None:
        """Use store, a working copy a restore built at ``path / WORKING``, as this
        database's; the next ``commit`` makes it the first checkpoint."""
        self._store = store

    def _open_snapshot(self) -> RocksStore:
        """Read-only: open the checkpoint the pointer names. A writer's flush may remove it
        before the store holds its files (the store pins them once it has them, see
        ``RocksStore``); then the pointer has moved on, and the next checkpoint is tried. A
        failure with the pointer unchanged is the snapshot's own, and raised."""
        for attempt in range(1, _SNAPSHOT_TRIES + 1):
            pointer = read_pointer(self.path)
            assert pointer is not None
            source = self.path / CHECKPOINTS / str(pointer["checkpoint"])
            try:
                return RocksStore(
                    source, pointer["column_families"], read_only=True, mmap_reads=self.mmap_reads
                )
            except CorruptDataError:
                if attempt == _SNAPSHOT_TRIES or read_pointer(self.path) == pointer:
                    raise
        raise AssertionError("unreachable")

    def _open_working(self) -> RocksStore:
        pointer = read_pointer(self.path)
        working = self.path / WORKING
        checkpoints = self.path / CHECKPOINTS
        checkpoints.mkdir(exist_ok=True)
        current = None if pointer is None else str(pointer["checkpoint"])
        for entry in checkpoints.iterdir():  # left by a flush that did not complete
            if entry.name == current or not _CHECKPOINT_NAME.fullmatch(entry.name):
                continue  # the current one, or not evdb's: left alone
            _refuse_link(self.path, entry, directory=True)
            shutil.rmtree(entry)
        if pointer is None:
            if working.exists():
                shutil.rmtree(working)
            return RocksStore(working, {}, mmap_reads=self.mmap_reads)
        source = checkpoints / str(current)
        if not source.is_dir():
            raise CorruptDataError(f"{self.path}: checkpoint {source} is missing")
        _refuse_link(self.path, source, directory=True)  # the next flush removes it
        self._checkpoint = int(str(current))
        RocksStore.restore(source, working)
        return RocksStore(working, pointer["column_families"], mmap_reads=self.mmap_reads)

    @property
    def store(self) -> RocksStore:
        """The RocksDB store the tables' rows live in (once ``open`` or ``adopt`` gave one)."""
        assert self._store is not None, "the storage is not open"
        return self._store

    # -- the tables' column families --------------------------------------------------------
    def table_rows(self, name: str, config: TableConfig) -> RocksTier:
        """Table name's rows: its column family (created if missing)."""
        return rocks_tier(self.store, name, config)

    def table_strings(self, name: str, config: TableConfig) -> RocksStrings | None:
        """Table name's original key strings, if its config keeps them."""
        return rocks_strings(self.store, name, config)

    def drop_table(self, name: str) -> None:
        """Drop table name's column families from the working copy (the current checkpoint
        keeps them until the next commit)."""
        self.store.drop_column_family(_column_family(name))
        self.store.drop_column_family(_strings_family(name))

    def compact_tables(self, names: set[str]) -> None:
        """Have RocksDB compact every column family of the named tables (``"t.<table>"`` and
        any other ``"<x>.<table>"``), reclaiming the space of deleted rows."""
        for cf in self.store.column_families:
            if cf.partition(".")[2] in names:
                self.store.compact_range(cf)

    @property
    def column_families(self) -> dict[str, Compression]:
        """The store's column families and their compression (the pointer records them)."""
        return self.store.column_families

    def stored_manifest(self) -> dict[str, Any] | None:
        """The manifest of the last commit (see ``Metadata``); None before the first."""
        blob = self.store.get_meta("manifest")
        return None if blob is None else dict(json.loads(blob))

    def stored_state(self, table: str) -> dict[str, np.ndarray]:
        """Table's state as the last commit stored it; ``KeyError`` if it stored none."""
        blob = self.store.get_meta(f"table/{table}")
        if blob is None:
            raise KeyError(f"table/{table}")
        with np.load(io.BytesIO(blob), allow_pickle=False) as z:
            return {k: z[k] for k in z.files}

    def stored_metadata(self, tables: list[str]) -> dict[str, bytes]:
        """The metadata of the last commit as the store holds it (the manifest and the
        tables' states, by their keys in its default column family), for an incremental
        checkpoint to carry over as it is."""
        keys = ["manifest"] + [f"table/{n}" for n in tables]
        return {k: self.store.get_meta(k) or b"" for k in keys}

    # -- durability -------------------------------------------------------------------------
    def commit(self, metadata: Callable[[], Metadata], dropped: list[str]) -> None:
        """Make the store's state durable: store ``metadata()`` (which writes the tables'
        dirty rows down as it builds it), forget the state of the ``dropped`` tables, have
        RocksDB take checkpoint n + 1, point ``evdb.json`` at it, then remove checkpoint n.

        An I/O error raises ``StorageError``: the previous checkpoint stays current, and
        nothing of this one is left behind."""
        checkpoints = self.path / CHECKPOINTS
        number = self._checkpoint + 1
        name = f"{number:010d}"
        tmp = self.path / (POINTER + ".tmp")
        try:
            manifest, states = metadata()
            items = {f"table/{name}": _npz_bytes(state) for name, state in states.items()}
            items["manifest"] = json.dumps(manifest).encode()
            self.store.put_meta(items)
            self.store.delete_meta([f"table/{name}" for name in dropped])
            checkpoints.mkdir(exist_ok=True)
            self.store.checkpoint(checkpoints / name)
            fsync_path(checkpoints)
            with tmp.open("w") as f:
                json.dump(self._pointer(name), f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path / POINTER)
        except OSError as e:  # the new checkpoint is not current: none of it may stay
            shutil.rmtree(checkpoints / name, ignore_errors=True)
            tmp.unlink(missing_ok=True)
            if isinstance(e, StorageError):
                raise
            raise StorageError(
                e.errno, f"{self.path}: flush failed: {e}", e.filename or str(self.path)
            ) from e
        old = checkpoints / f"{self._checkpoint:010d}"
        self._checkpoint = number
        fsync_path(self.path)
        if old.exists():
            shutil.rmtree(old)

    def _pointer(self, name: str) -> dict[str, Any]:
        return {"format": FORMAT, "checkpoint": name, "column_families": self.column_families}

    def copy_current_checkpoint(self, dest: Path) -> None:
        """dest = a database directory holding the current checkpoint (just committed): its
        files hard-linked where the file system allows, and a pointer to it."""
        name = f"{self._checkpoint:010d}"
        link_or_copy_tree(self.path / CHECKPOINTS / name, dest / CHECKPOINTS / name)
        (dest / POINTER).write_text(json.dumps(self._pointer(name), indent=1))

    # -- letting go -------------------------------------------------------------------------
    def release(self) -> None:
        """Close the store (if open) and let go of the directory's lock: always both, so the
        path can be opened again in this process (an open that failed midway too)."""
        try:
            if self._store is not None:
                self._store.close()  # (a no-op if closed)
        finally:
            if self._lock >= 0:
                fcntl.flock(self._lock, fcntl.LOCK_UN)
                os.close(self._lock)
                self._lock = -1

    def undo_restore(self, created: bool) -> None:
        """A restore that failed leaves the work directory as it found it (missing or empty):
        the directory was empty, so everything in it is this open's."""
        if self._store is not None:
            with contextlib.suppress(Exception):
                self._store.close()
        for name in (WORKING, WORKING + ".tmp", CHECKPOINTS, POINTER, POINTER + ".tmp"):
            entry = self.path / name
            if entry.is_symlink() or entry.is_file():
                entry.unlink()
            elif entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
        if self._lock >= 0:
            (self.path / "LOCK").unlink(missing_ok=True)  # still held: nobody else made it
        if created:
            with contextlib.suppress(OSError):
                self.path.rmdir()


def _npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, allow_pickle=False, **arrays)
    return buf.getvalue()


def _refuse_link(root: Path, entry: Path, *, directory: bool = False) -> None:
    """evdb deletes and rewrites its own files and directories: through a symbolic link
    (or in place of something that is not what it made) that would reach data outside the
    database, so it refuses instead, naming the entry."""
    if entry.is_symlink():
        raise InvalidArgumentError(
            f"path: {entry} is a symbolic link (to {os.readlink(entry)}); evdb deletes and "
            f"rewrites what is there, so it never follows links inside {root}: replace the "
            "link with a real directory (a link to the whole database directory is fine)"
        )
    if directory and entry.exists() and not entry.is_dir():
        raise InvalidArgumentError(
            f"path: {entry} is not a directory; evdb did not make it (its checkpoints are "
            "directories): move it out of the database"
        )
