"""``Database``: the directory, the global step, the set of tables, flush and close.

A database directory holds::

    evdb.json              which checkpoint is current, and the column families RocksDB needs
                           to open it (replaced atomically: write, fsync, rename)
    checkpoints/<n>/       the state of the last completed flush: a RocksDB checkpoint (hard
                           links) holding every table's rows, plus the metadata (step, table
                           configs, counters, admission state) in its default column family
    rocksdb/               the working copy, recreated from the current checkpoint at open
    LOCK                   held (flock) by the process that has the database open

Between flushes, rows that eviction writes down go to the working copy only. ``flush`` writes
the dirty rows and the metadata, has RocksDB take a checkpoint (a consistent cut across every
column family), and then points ``evdb.json`` at it. A crash at any moment therefore reopens
to exactly the last completed flush, and nothing written after it can leak in.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import io
import json
import os
import re
import shutil
import threading
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import numpy as np

from evdb import checkpoint as _checkpoint
from evdb.admission import AdmissionPolicy, AdmitAll
from evdb.config import (
    DiskConfig,
    DramConfig,
    HbmConfig,
    HbmDevice,
    TableConfig,
    parse_hbm,
    parse_optional_int,
)
from evdb.errors import (
    ConfigError,
    CorruptDataError,
    DatabaseClosedError,
    DatabaseNotFoundError,
    InvalidArgumentError,
    ReadOnlyError,
    StorageError,
    TableExistsError,
    TableNotFoundError,
)
from evdb.initializers import Initializer, Normal
from evdb.keys import KeyType
from evdb.locking import RWLock, exclusive, shared
from evdb.optim import SGD, Optimizer
from evdb.records import RecordBatch
from evdb.table import Table
from evdb.tiers.hbm import require_device
from evdb.tiers.rocks import RocksStrings, RocksTier
from evdb.tiers.store import RocksStore, link_or_copy_tree

__all__ = ["Database", "open"]

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
FORMAT = "evdb-rocksdb-1"
POINTER = "evdb.json"
WORKING = "rocksdb"
CHECKPOINTS = "checkpoints"
# what a flush leaves in checkpoints/: <n>/, or RocksDB's <n>.tmp/ if it stopped midway
_CHECKPOINT_NAME = re.compile(r"[0-9]{10}(\.tmp)?")
# evdb's own entries of a database directory, which it deletes, truncates or rewrites
_INTERNAL = (CHECKPOINTS, WORKING, WORKING + ".tmp", POINTER + ".tmp", "LOCK")
_SNAPSHOT_TRIES = 50  # read-only opens: checkpoints a writer may remove under one open


def _column_family(table: str) -> str:
    return f"t.{table}"


def _strings_family(table: str) -> str:
    return f"s.{table}"


def _npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, allow_pickle=False, **arrays)
    return buf.getvalue()


def _npz_arrays(blob: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(blob), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _parse_table_name(name: Any) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidArgumentError(
            f"name must be 1-128 characters of letters, digits, '_', '.', '-' not starting "
            f"with '.' or '-', got {name!r}"
        )
    return name


class Database:
    """A directory of dynamic embedding tables sharing one global step.

    Open it with :func:`evdb.open`. One process holds a directory open at a time (a lock file
    enforces it). ``close()`` (or leaving the ``with`` block) flushes.

    Examples
    --------
    >>> import tempfile, evdb
    >>> path = tempfile.mkdtemp()
    >>> with evdb.open(path) as db:
    ...     t = db.create_table("user", dim=8)
    ...     _ = db.advance(3)
    >>> with evdb.open(path) as db:
    ...     db.step, db.tables()
    (3, ['user'])
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        read_only: bool = False,
        verify: bool = True,
        cache_rows: int | None = None,
        mmap_reads: bool = False,
        restore: str | os.PathLike[str] | None = None,
    ) -> None:
        self.path = Path(path)
        self.read_only = read_only
        if not isinstance(mmap_reads, bool):
            raise ConfigError(f"mmap_reads must be a bool, got {mmap_reads!r}")
        self._mmap_reads = mmap_reads
        if cache_rows is not None and not read_only:
            raise ConfigError(
                "cache_rows: only for read_only opens; a writer's DRAM size is each table's "
                "dram_rows"
            )
        self._cache_rows = parse_optional_int("cache_rows", cache_rows, 1)
        self._lock = -1
        self._closed = False
        self._rwlock = RWLock()  # reads share it, writes and close hold it alone (evdb.locking)
        self._tables: dict[str, Table] = {}
        self._dropped: set[str] = set()
        self._step = 0
        self._reads_at = threading.local()  # read_at's per-thread step
        self._checkpoint = 0
        self._publication: Any = None  # evdb.publish's memory of the last publication
        # a checkpoint to start from, checked before anything is created
        source = None if restore is None else self._parse_restore(restore, verify)
        created = False
        if read_only:
            if not (self.path / POINTER).exists():
                raise DatabaseNotFoundError(f"path: {self.path} holds no evdb database")
        else:
            self._refuse_checkpoint()  # before the LOCK file: not a byte written there
            if source is not None:
                self._require_empty()
            _refuse_links(self.path)
            created = not self.path.exists()
            self.path.mkdir(parents=True, exist_ok=True)
            self._lock = _checkpoint.lock_exclusive(
                self.path / "LOCK",
                f"path: {self.path} is open in another process or handle; close it first",
            )
        try:
            if source is not None:
                self._require_empty()  # again, now that no other process can start here
                self._store = self._materialize(source)
                self._load()
                self.flush()  # the work directory is a database from now on
                return
            manifest = _checkpoint.read_manifest(self.path)  # None when writable (refused)
            if manifest is not None and verify:
                _checkpoint.verify(self.path)
            if manifest is not None and manifest["kind"] == "incremental":
                raise ReadOnlyError(
                    f"path: {self.path} is an incremental checkpoint, which cannot be served "
                    f"as it is; restore it into a work directory first: "
                    f"evdb.open(workdir, restore={str(self.path)!r})"
                )
            self._store = self._open_store()
            self._load()
        except BaseException:
            if source is not None:
                self._undo_restore(created)
            self._release()
            raise

    def _parse_restore(self, restore: str | os.PathLike[str], verify: bool) -> Path:
        """The checkpoint ``restore=`` names, checked (and verified, unless told not to)."""
        if self.read_only:
            raise ConfigError(
                "restore: only for a writable open (read_only=True serves a checkpoint in "
                "place: evdb.open(ckpt, read_only=True))"
            )
        if not isinstance(restore, (str, os.PathLike)):
            raise InvalidArgumentError(f"restore must be a path, got {restore!r}")
        root = Path(restore)
        manifest = _checkpoint.read_manifest(root)
        if manifest is None:
            raise InvalidArgumentError(
                f"restore: {root} is not an evdb checkpoint (no {_checkpoint.MANIFEST})"
            )
        if manifest.get("kind") != "incremental" and not (root / POINTER).is_file():
            raise InvalidArgumentError(
                f"restore: {root} is a {manifest.get('kind')!r} export, not a checkpoint a "
                "database can start from"
            )
        if verify:
            _checkpoint.verify(root)
        return root

    def _refuse_checkpoint(self) -> None:
        """A writable open of a checkpoint in place would turn it into a database, consuming
        it (its manifest and deltas gone, its state moved on): refused, with the way to
        resume from it instead."""
        manifest = _checkpoint.read_manifest(self.path)
        if manifest is None:
            return
        where = str(self.path)
        raise InvalidArgumentError(
            f"path: {where} is an evdb checkpoint ({manifest.get('kind')}); opening it for "
            f"writing would consume it. Resume from it in a work directory: "
            f"evdb.open(workdir, restore={where!r}); or serve it as it is: "
            f"evdb.open({where!r}, read_only=True)"
        )

    def _require_empty(self) -> None:
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

    def _undo_restore(self, created: bool) -> None:
        """A restore that failed leaves the work directory as it found it (missing or empty):
        the directory was empty, so everything in it is this open's."""
        store: RocksStore | None = getattr(self, "_store", None)
        if store is not None:
            with contextlib.suppress(Exception):
                store.close()
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

    def _read_pointer(self, root: Path | None = None) -> dict[str, Any] | None:
        path = (self.path if root is None else root) / POINTER
        meta = _checkpoint.read_json(path, "database pointer")
        if meta is None:
            return None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            found = meta.get("format") if isinstance(meta, dict) else meta
            raise CorruptDataError(f"{path}: unknown format {found!r}, expected {FORMAT!r}")
        return meta

    def _open_snapshot(self) -> RocksStore:
        """Read-only: open the checkpoint the pointer names. A writer's flush may remove it
        before the store holds its files (the store pins them once it has them, see
        ``RocksStore``); then the pointer has moved on, and the next checkpoint is tried. A
        failure with the pointer unchanged is the snapshot's own, and raised."""
        for attempt in range(1, _SNAPSHOT_TRIES + 1):
            pointer = self._read_pointer()
            assert pointer is not None
            source = self.path / CHECKPOINTS / str(pointer["checkpoint"])
            try:
                return RocksStore(
                    source, pointer["column_families"], read_only=True, mmap_reads=self._mmap_reads
                )
            except CorruptDataError:
                if attempt == _SNAPSHOT_TRIES or self._read_pointer() == pointer:
                    raise
        raise AssertionError("unreachable")

    def _open_store(self) -> RocksStore:
        """Recreate the working copy from the current checkpoint (or start empty); read-only,
        open the current checkpoint itself."""
        if self.read_only:
            return self._open_snapshot()
        pointer = self._read_pointer()
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
            return RocksStore(working, {}, mmap_reads=self._mmap_reads)
        source = checkpoints / str(current)
        if not source.is_dir():
            raise CorruptDataError(f"{self.path}: checkpoint {source} is missing")
        _refuse_link(self.path, source, directory=True)  # the next flush removes it
        self._checkpoint = int(str(current))
        RocksStore.restore(source, working)
        return RocksStore(working, pointer["column_families"], mmap_reads=self._mmap_reads)

    def _load(self) -> None:
        blob = self._store.get_meta("manifest")
        if blob is None:
            if not self.read_only:
                self.flush()  # a new database: make the directory a valid one at once
            return
        meta = json.loads(blob)
        self._step = int(meta["step"])
        for name, cfg in meta["tables"].items():
            try:
                config = TableConfig.from_dict(cfg)
            except (KeyError, TypeError, ValueError) as e:
                raise CorruptDataError(f"{self.path}: table {name!r} cannot be loaded ({e})") from e
            if config.hbm is not None:
                require_device(config.hbm.device)  # this machine, not the data, is at fault
            if self._cache_rows is not None and config.disk is not None:
                # read-only: the DRAM tier only caches rows the disk holds, so any size works
                dram = dataclasses.replace(config.dram, capacity_rows=self._cache_rows)
                config = dataclasses.replace(config, dram=dram)
            try:
                state_blob = self._store.get_meta(f"table/{name}")
                if state_blob is None:
                    raise KeyError(f"table/{name}")
                state = _npz_arrays(state_blob)
                table = Table(
                    self, name, config, self._backing(name, config), self._strings(name, config)
                )
                table.load_state(state)
            except (KeyError, TypeError, ValueError) as e:
                raise CorruptDataError(f"{self.path}: table {name!r} cannot be loaded ({e})") from e
            self._tables[name] = table

    def _strings(self, name: str, config: TableConfig) -> RocksStrings | None:
        return _rocks_strings(self._store, name, config)

    def _backing(self, name: str, config: TableConfig) -> RocksTier:
        return _rocks_tier(self._store, name, config)

    # -- lifecycle ------------------------------------------------------------------------
    def check_open(self) -> None:
        """Raise ``DatabaseClosedError`` once the database is closed."""
        if self._closed:
            raise DatabaseClosedError(f"database {self.path} is closed")

    def check_writable(self) -> None:
        """Raise unless the database is open for writing (``ReadOnlyError`` otherwise)."""
        self.check_open()
        if self.read_only:
            raise ReadOnlyError(f"database {self.path} is open read-only")

    # -- checkpoints ----------------------------------------------------------------------
    @exclusive
    def checkpoint(
        self, dest: str | os.PathLike[str], base: str | os.PathLike[str] | None = None
    ) -> dict[str, Any]:
        """Flush, then write a self-contained, checksummed copy of the database to dest,
        atomically (a crash leaves no dest or a complete one). With ``base`` (an earlier
        checkpoint, left unopened), store only the rows changed since it.
        ``evdb.open(workdir, restore=dest)`` resumes from either, leaving dest as it is, and
        ``evdb.open(dest, read_only=True)`` serves a full one. Returns the checkpoint's
        manifest."""
        self.check_writable()
        return _checkpoint.checkpoint(self, dest, base)

    @exclusive
    def publish(
        self, root: str | os.PathLike[str], *, full: bool | None = None, keep: int = 2
    ) -> dict[str, Any]:
        """Write one publication of every table into the publish root ``root``, for servers
        that follow it (``evdb serve ROOT --follow``); see ``evdb.publish`` for the format.

        Parameters
        ----------
        root : path
            The publish root (created if missing); one publisher at a time.
        full : bool, optional
            None: a delta (the rows whose version rose and the keys removed since the last
            publication) when one is exact, else a full one; True: a full one; False: a
            delta, or ``InvalidArgumentError`` saying why one cannot be exact.
        keep : int
            Full publications kept; older ones, and the deltas before them, are removed.

        Returns
        -------
        dict
            ``seq`` (rises by 1 per publication), ``kind`` ("full" | "delta"), ``rows``
            (rows written), ``deleted`` (keys removed), ``bytes``, ``seconds``, and for a
            full one the ``reason``.

        Examples
        --------
        >>> import tempfile, evdb
        >>> root = tempfile.mkdtemp()
        >>> with evdb.open(root + "/db") as db:
        ...     t = db.create_table("user", dim=2)
        ...     t.upsert([1, 2], [[1, 1], [2, 2]])
        ...     first = db.publish(root + "/pub")
        ...     t.upsert([2], [[3, 3]]); _ = t.delete([1])
        ...     second = db.publish(root + "/pub")
        >>> [(r["seq"], r["kind"], r["rows"], r["deleted"]) for r in (first, second)]
        [(1, 'full', 2, 0), (2, 'delta', 1, 1)]
        """
        self.check_writable()
        from evdb import publish as _publish  # above Database: imported where it is used

        return _publish.publish(self, root, full=full, keep=keep)

    def _metadata(self) -> dict[str, bytes]:
        """The metadata a flush stores (and a checkpoint copies)."""
        meta: dict[str, bytes] = {}
        for name, table in self._tables.items():
            meta[f"table/{name}"] = _npz_bytes(table.flush_state())
        manifest = {
            "step": self._step,
            "tables": {n: t.config.to_dict() for n, t in self._tables.items()},
        }
        meta["manifest"] = json.dumps(manifest).encode()
        return meta

    def _copy_current_checkpoint(self, dest: Path) -> None:
        """dest = a database directory holding the current checkpoint (just flushed)."""
        name = f"{self._checkpoint:010d}"
        link_or_copy_tree(self.path / CHECKPOINTS / name, dest / CHECKPOINTS / name)
        pointer = {
            "format": FORMAT,
            "checkpoint": name,
            "column_families": self._store.column_families,
        }
        (dest / POINTER).write_text(json.dumps(pointer, indent=1))

    def _write_metadata_file(self, path: Path) -> None:
        """The metadata of the last flush, for an incremental checkpoint."""
        meta = {
            k: self._store.get_meta(k) for k in ["manifest"] + [f"table/{n}" for n in self._tables]
        }
        arrays = {k: np.frombuffer(v or b"", dtype=np.uint8) for k, v in meta.items()}
        arrays["column_families"] = np.frombuffer(
            json.dumps(self._store.column_families).encode(), dtype=np.uint8
        )
        np.savez(path, allow_pickle=False, **arrays)

    def _materialize(self, root: Path) -> RocksStore:
        """A working copy of the state of the checkpoint at root: its RocksDB checkpoint (for
        an incremental one, the full checkpoint at the root of its chain, then each
        incremental's deletions and changed rows, in order). Reads root, never writes there:
        table files are hard-linked, the rest copied, into this database's working copy."""
        chain = _checkpoint.chain_of(root)
        full = chain[0]
        pointer = self._read_pointer(full)
        if pointer is None:
            raise CorruptDataError(f"{full}: no {POINTER}: not a full checkpoint")
        working = self.path / WORKING
        RocksStore.restore(full / CHECKPOINTS / str(pointer["checkpoint"]), working)
        store = RocksStore(working, pointer["column_families"], mmap_reads=self._mmap_reads)
        for step in chain[1:]:
            with np.load(step / "metadata.npz", allow_pickle=False) as z:
                meta = {k: z[k].tobytes() for k in z.files}
            families = json.loads(meta.pop("column_families"))
            tables = json.loads(meta["manifest"])["tables"]
            for cf in set(store.column_families) - set(families):
                store.drop_column_family(cf)
            for name, cfg in tables.items():
                config = TableConfig.from_dict(cfg)
                _apply_delta(
                    _rocks_tier(store, name, config),
                    _rocks_strings(store, name, config),
                    step / _checkpoint.DELTA / name,
                )
            old = [bytes(k).decode() for k in store.db.keys()]  # type: ignore[arg-type]
            store.delete_meta([k for k in old if k not in meta])
            store.put_meta(meta)
        return store

    @exclusive
    def flush(self) -> None:
        """Make the current state durable: every dirty row, every table's counters and
        admission state, and the global step. After it returns, a crash loses nothing; a
        crash before it returns reopens to the previous flush.

        An I/O error (a full disk) raises ``StorageError`` and loses nothing: the previous
        flush stays the durable state, no part of this one is left behind, and every change
        stays in the database. Once the cause is gone (space freed), calling ``flush`` again
        completes it; it first resumes the RocksDB that stopped on the error."""
        self.check_writable()
        checkpoints = self.path / CHECKPOINTS
        number = self._checkpoint + 1
        name = f"{number:010d}"
        tmp = self.path / (POINTER + ".tmp")
        try:
            self._store.put_meta(self._metadata())
            self._store.delete_meta([f"table/{n}" for n in self._dropped - self._tables.keys()])
            self._dropped.clear()
            checkpoints.mkdir(exist_ok=True)
            self._store.checkpoint(checkpoints / name)
            _checkpoint.fsync_path(checkpoints)
            pointer = {
                "format": FORMAT,
                "checkpoint": name,
                "column_families": self._store.column_families,
            }
            with tmp.open("w") as f:
                json.dump(pointer, f, indent=1)
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
        _checkpoint.fsync_path(self.path)
        if old.exists():
            shutil.rmtree(old)

    def _release(self) -> None:
        """Close the RocksDB (if open) and let go of the directory's lock: always both, so
        the path can be opened again in this process (an open that failed midway too)."""
        self._closed = True
        store: RocksStore | None = getattr(self, "_store", None)
        try:
            if store is not None:
                store.close()  # (a no-op if closed)
        finally:
            if self._lock >= 0:
                fcntl.flock(self._lock, fcntl.LOCK_UN)
                os.close(self._lock)
                self._lock = -1

    @exclusive
    def close(self, *, flush: bool = True) -> None:
        """Flush and release the directory. Closing twice is a no-op.

        If the final flush meets an I/O error (``StorageError``: a full disk), close raises
        and the database stays open, with every change and the directory's lock: free space
        and call ``close()`` again (releasing instead would drop the changes since the last
        flush). Any other error still closes the database and releases the lock.

        ``flush=False`` closes without flushing: the changes since the last flush are
        dropped, as a crash would drop them (the way out when no space can be freed)."""
        if self._closed:
            return
        try:
            if flush and not self.read_only:
                self.flush()
        except StorageError:
            raise  # still open, with every change: close() again once space is freed
        except BaseException:
            self._release()
            raise
        self._release()

    def __enter__(self) -> Database:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- the global step ------------------------------------------------------------------
    @property
    def step(self) -> int:
        """The global step: the trainer's clock for TTL and LFU ageing (read-only, the step
        this thread reads at, if ``read_at`` set one)."""
        return getattr(self._reads_at, "step", self._step)

    def read_at(self, step: int) -> None:
        """Read-only: this thread's reads judge TTL at ``step`` from now on (a server's views of
        publications share one database, each at its own step; a thread-local step keeps two
        requests on two views from judging at each other's)."""
        if not self.read_only:
            raise ReadOnlyError(
                f"database {self.path} is open for writing; advance() moves its step"
            )
        self._reads_at.step = int(step)

    @exclusive
    def advance(self, n: int = 1) -> int:
        """Move the global step forward by n >= 0; returns the new step."""
        self.check_writable()
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InvalidArgumentError(f"n must be an int >= 0, got {n!r}")
        self._step += n
        return self._step

    # -- tables ---------------------------------------------------------------------------
    @exclusive
    def create_table(
        self,
        name: str,
        dim: int,
        *,
        key_type: KeyType = "int64",
        initializer: Initializer | None = None,
        admission: AdmissionPolicy | None = None,
        optimizer: Optimizer | None = None,
        ttl_steps: int | None = None,
        l2_threshold: float | None = None,
        default_value: Literal["init"] | float = "init",
        keep_strings: bool = False,
        dram_rows: int | None = None,
        dram: DramConfig | None = None,
        disk: bool | DiskConfig = True,
        hbm_rows: int | None = None,
        device: HbmDevice | None = None,
        hbm: HbmConfig | None = None,
    ) -> Table:
        """Create a table; see ``TableConfig`` for each option.

        ``dram_rows`` is shorthand for ``dram=DramConfig(capacity_rows=dram_rows)``.
        ``disk=True`` (the default) puts a RocksDB tier with default settings under DRAM, so
        rows beyond ``dram_rows`` spill to disk; ``disk=False`` keeps every row in DRAM.
        ``hbm_rows=N, device=D`` (shorthand for ``hbm=HbmConfig(N, D)``) puts an HBM tier of N
        rows on top of DRAM, on CUDA device D (0 by default), or emulated on the CPU with
        ``device="cpu"``. Raises ``TableExistsError`` (a ValueError) if the name is taken, and
        ``ConfigError`` where the HBM tier cannot run (no cupy, no CUDA device).
        """
        self.check_writable()
        _parse_table_name(name)
        if name in self._tables:
            raise TableExistsError(f"name: table {name!r} already exists in {self.path}")
        if dram is not None and dram_rows is not None:
            raise ConfigError("pass dram_rows or dram=DramConfig(...), not both")
        config = TableConfig(
            dim=dim,
            key_type=key_type,
            initializer=Normal(0.0, 0.01, 0) if initializer is None else initializer,
            admission=AdmitAll() if admission is None else admission,
            optimizer=SGD() if optimizer is None else optimizer,
            ttl_steps=ttl_steps,
            l2_threshold=l2_threshold,
            default_value=default_value,
            keep_strings=keep_strings,
            dram=DramConfig(capacity_rows=dram_rows) if dram is None else dram,
            disk=_parse_disk(disk),
            hbm=parse_hbm(hbm_rows, device, hbm),
        )
        if config.hbm is not None:  # before the table's column family is created
            require_device(config.hbm.device)
        table = Table(self, name, config, self._backing(name, config), self._strings(name, config))
        self._tables[name] = table
        self._dropped.discard(name)
        return table

    @shared
    def table(self, name: str) -> Table:
        """The table called name; ``TableNotFoundError`` (a KeyError) if there is none."""
        self.check_open()
        try:
            return self._tables[name]
        except (KeyError, TypeError):
            raise TableNotFoundError(
                f"name: no table {name!r} in {self.path}; tables: {sorted(self._tables)}"
            ) from None

    @shared
    def tables(self) -> list[str]:
        """Names of the tables, sorted."""
        self.check_open()
        return sorted(self._tables)

    @exclusive
    def drop_table(self, name: str) -> None:
        """Delete a table and its rows (from disk at the next flush)."""
        self.check_writable()
        self.table(name)
        del self._tables[name]
        self._store.drop_column_family(_column_family(name))  # the checkpoint keeps it
        self._store.drop_column_family(_strings_family(name))
        self._dropped.add(name)

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"step={self._step}, tables={sorted(self._tables)}"
        return f"Database({str(self.path)!r}, {state})"


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


def _refuse_links(root: Path) -> None:
    """Before a writable open touches anything: none of evdb's own entries of root is a
    symbolic link."""
    for name in _INTERNAL:
        _refuse_link(root, root / name)


def _parse_disk(disk: Any) -> DiskConfig | None:
    if disk is True:
        return DiskConfig()
    if disk is False:
        return None
    if isinstance(disk, DiskConfig):
        return disk
    raise ConfigError(f"disk must be True, False or a DiskConfig, got {disk!r}")


def _rocks_tier(store: RocksStore, name: str, config: TableConfig) -> RocksTier:
    """A table's rows in the store (its column family created if missing)."""
    disk = config.disk or DiskConfig()
    return RocksTier(
        store,
        _column_family(name),
        config.dim,
        config.optimizer.n_slots(config.dim),
        compression=disk.compression,
        dtype=disk.dtype,
    )


def _rocks_strings(store: RocksStore, name: str, config: TableConfig) -> RocksStrings | None:
    return RocksStrings(store, _strings_family(name)) if config.keep_strings else None


def _apply_delta(tier: RocksTier, strings: RocksStrings | None, delta: Path) -> None:
    """Make a table's column family hold the keys of ``keys.npy``, with the changed rows."""
    keep = np.load(delta / "keys.npy")
    gone: list[np.ndarray] = []
    for keys in tier.scan_keys(65536):  # keys only: the values stay on disk
        at = np.searchsorted(keep, keys).clip(max=max(keep.shape[0] - 1, 0))
        missing = keys if keep.shape[0] == 0 else keys[keep[at] != keys]
        if missing.shape[0]:
            gone.append(missing)
    if gone:
        removed = np.concatenate(gone)
        tier.remove(removed, present=np.ones(removed.shape[0], dtype=bool))
        if strings is not None:
            strings.remove(removed)
    for part in sorted(delta.glob("rows-*.npz")):
        with np.load(part, allow_pickle=False) as z:
            records = RecordBatch.unpack(z["records"].tobytes(), tier.dim, tier.n_slots)
            keys = z["keys"]
            if strings is not None and "strings" in z.files:
                blob, ends = z["strings"].tobytes(), z["string_ends"].tolist()
                starts = [0, *ends[:-1]]
                strings.put(keys, [blob[a:b].decode() for a, b in zip(starts, ends, strict=True)])
        tier.put(keys, records, existed=np.zeros(keys.shape[0], dtype=bool))


def open(
    path: str | os.PathLike[str],
    *,
    read_only: bool = False,
    verify: bool = True,
    cache_rows: int | None = None,
    mmap_reads: bool = False,
    restore: str | os.PathLike[str] | None = None,
) -> Database:
    """Open (creating if missing) the database directory at path.

    ``read_only=True`` opens the last flushed state without a lock or a working copy (a
    serving snapshot; writes raise ``ReadOnlyError``). A checkpoint's files are checked
    against its manifest first (``verify=False`` skips that). ``cache_rows`` (read-only
    only) sets how many rows each table with a disk tier keeps in DRAM, whatever its
    ``dram_rows`` was: the cache of a server's hot rows.

    ``mmap_reads=True`` has RocksDB read its files through memory maps instead of read calls
    (its ``allow_mmap_reads``): rows read back from disk cost less (README, "Performance"),
    but the file pages read then count in the process's resident set (file pages, which the
    kernel may reclaim), so the RSS bound of README's "Memory" no longer holds as measured.

    ``restore=ckpt`` (writable opens only) resumes from a checkpoint: it starts a new database
    at path, which must be missing or empty, from ckpt (full or incremental, verified first
    unless ``verify=False``), reading ckpt and never writing under it, so it stays verifiable
    and can be resumed from again. Opening a checkpoint itself for writing is refused
    (``InvalidArgumentError``): that would consume it.

    evdb deletes and rewrites its own entries of the directory (``checkpoints/`` and the
    checkpoints in it, ``rocksdb/``, ``LOCK``, temporary files), so a writable open refuses
    (``InvalidArgumentError``, naming it) where one of them is a symbolic link, rather than
    reach through it; other entries are left alone, and path itself may be a link."""
    return Database(
        path,
        read_only=read_only,
        verify=verify,
        cache_rows=cache_rows,
        mmap_reads=mmap_reads,
        restore=restore,
    )
