"""``Database``: the directory, the global step, the set of tables, flush and close.

A database is a directory (``evdb.storage``: its lock, pointer, checkpoints and the RocksDB
working copy) holding tables that share one global step. Between flushes, every change lives
in the tables and the working copy only; ``flush`` writes the dirty rows and the metadata
(the step, each table's config and state) and makes them one durable checkpoint, so a crash
at any moment reopens to exactly the last completed flush. ``restore=`` starts a database
from a checkpoint (``evdb.checkpoint_restore``); ``checkpoint`` and ``publish`` write copies
of it for others (``evdb.checkpoint``, ``evdb.publish``).
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

from evdb import checkpoint as _checkpoint
from evdb import checkpoint_restore as _restore
from evdb.admission import AdmissionPolicy, AdmitAll
from evdb.config import (
    DiskConfig,
    DramConfig,
    HbmConfig,
    HbmDevice,
    Rounding,
    RowDtype,
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
from evdb.storage import CHECKPOINTS, POINTER, WORKING, Metadata, Storage
from evdb.table import Table
from evdb.tiers.hbm import require_device

if TYPE_CHECKING:
    from evdb.publish import Publisher

__all__ = ["CHECKPOINTS", "POINTER", "WORKING", "Database", "open"]

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


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
        if cache_rows is not None and not read_only:
            raise ConfigError(
                "cache_rows: only for read_only opens; a writer's DRAM size is each table's "
                "dram_rows"
            )
        self._cache_rows = parse_optional_int("cache_rows", cache_rows, 1)
        self._closed = False
        self._rwlock = RWLock()  # reads share it, writes and close hold it alone (evdb.locking)
        self._tables: dict[str, Table] = {}
        self._dropped: set[str] = set()
        self._step = 0
        self._publisher: Publisher | None = None
        self.storage = Storage(self.path, read_only=read_only, mmap_reads=mmap_reads)
        """The directory, its checkpoints and the RocksDB store (``evdb.storage``)."""
        self.storage.refuse_other_paths()
        # a checkpoint to start from, checked before anything is created
        source = None if restore is None else self._parse_restore(restore, verify)
        created = False
        if read_only:
            if not self.storage.holds_database():
                raise DatabaseNotFoundError(f"path: {self.path} holds no evdb database")
        else:
            self.storage.refuse_checkpoint()  # before the LOCK file: not a byte written there
            if source is not None:
                self.storage.require_empty()
            self.storage.refuse_links()
            created = self.storage.lock()
        try:
            if source is not None:
                self.storage.require_empty()  # again, now that no other process can start here
                store = _restore.materialize(source, self.path / WORKING, mmap_reads=mmap_reads)
                self.storage.adopt(store)
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
            self.storage.open()
            self._load()
        except BaseException:
            if source is not None:
                self.storage.undo_restore(created)
            self._release()
            raise

    def _parse_restore(self, restore: str | os.PathLike[str], verify: bool) -> Path:
        """The checkpoint ``restore=`` names, checked (and verified, unless told not to)."""
        if self.read_only:
            raise ConfigError(
                "restore: only for a writable open (read_only=True serves a checkpoint in "
                "place: evdb.open(ckpt, read_only=True))"
            )
        return _restore.check_source(restore, verify)

    def _load(self) -> None:
        meta = self.storage.stored_manifest()
        if meta is None:
            if not self.read_only:
                self.flush()  # a new database: make the directory a valid one at once
            return
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
                state = self.storage.stored_state(name)
                table = self._new_table(name, config)
                table.load_state(state)
            except (KeyError, TypeError, ValueError) as e:
                raise CorruptDataError(f"{self.path}: table {name!r} cannot be loaded ({e})") from e
            self._tables[name] = table

    def _new_table(self, name: str, config: TableConfig) -> Table:
        """Table name over its column families in the store (created if missing)."""
        rows = self.storage.table_rows(name, config)
        return Table(self, name, config, rows, self.storage.table_strings(name, config))

    # -- lifecycle ------------------------------------------------------------------------
    @property
    def rwlock(self) -> RWLock:
        """The readers-writer lock its tables share (``evdb.locking``): reads hold it
        shared, writes and ``close`` exclusive."""
        return self._rwlock

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
    def restore_in_place(self, source: str | os.PathLike[str], *, verify: bool = True) -> None:
        """Replace this open database's state by the checkpoint at source (full or
        incremental; verified first unless ``verify=False``): the step, and every table's
        rows, config and state. The ``Table`` objects stay the same ones, so modules and
        callers holding them go on with the restored rows (what ``torch.distributed
        .checkpoint``'s in-place load needs: ``evdb.torch_checkpoint``); a table the
        checkpoint lacks is dropped, one it adds is created. The changes since the last flush
        are dropped; source is only read. If the restore fails, the database is back at its
        state when the call began (flushed first), and the error is raised."""
        self.check_writable()
        src = _restore.check_source(source, verify)
        if src.resolve() == self.path.resolve():
            raise InvalidArgumentError(f"source: {src} is this database itself")
        self.flush()  # what a failed restore comes back to
        live, working = self._tables, self.path / WORKING
        self.storage.store.close()
        try:
            self.storage.adopt(
                _restore.materialize(src, working, mmap_reads=self.storage.mmap_reads)
            )
            self._tables = {}
            self._load()
        except BaseException:
            self.storage.store.close()
            self.storage.open()  # the working copy again, from the flush above
            self._tables = {}
            self._load()
            self._keep_objects(live)
            raise
        self._keep_objects(live)
        self._publisher = None  # its memory of the last publication is of the replaced state
        self.flush()

    def _keep_objects(self, live: dict[str, Table]) -> None:
        """Each table just loaded moves into the object of its name in live (its state,
        whole), so whoever holds that object goes on with the loaded table."""
        for name, table in self._tables.items():
            if name in live:
                vars(live[name]).clear()
                vars(live[name]).update(vars(table))
                self._tables[name] = live[name]

    @exclusive
    def publish(
        self, root: str | os.PathLike[str], *, full: bool | None = None, keep: int = 2
    ) -> dict[str, Any]:
        """Write one publication of every table into the publish root ``root``, for servers
        that follow it (``evdb serve ROOT --follow``); see ``evdb.publish``, and
        ``evdb.publish_root`` for the format.

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
        return self.publisher.publish(root, full=full, keep=keep)

    @property
    def publisher(self) -> Publisher:
        """This database's side of its publications (``evdb.publish.Publisher``): what it
        remembers of the last one, in memory, and the writing of the next."""
        if self._publisher is None:
            from evdb.publish import Publisher  # builds on Database: imported where it is used

            self._publisher = Publisher(self)
        return self._publisher

    def _metadata(self) -> Metadata:
        """What a flush stores (and a checkpoint copies): the step, each table's config, and
        each table's state (``Table.flush_state`` writes its dirty rows down first)."""
        states = {name: table.flush_state() for name, table in self._tables.items()}
        configs = {name: table.config.to_dict() for name, table in self._tables.items()}
        return {"step": self._step, "tables": configs}, states

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
        self.storage.commit(self._metadata, sorted(self._dropped - self._tables.keys()))
        self._dropped.clear()

    def _release(self) -> None:
        """Mark the database closed and release its storage (the store and the lock: the path
        can be opened again in this process, after an open that failed midway too)."""
        self._closed = True
        self.storage.release()

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
        """The global step: the trainer's clock for TTL and LFU ageing (read-only; a reader
        judges TTL at another step by passing ``step=`` to a table's reads)."""
        return self._step

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
        dtype: RowDtype = "float32",
        rounding: Rounding = "stochastic",
        slot_dtype: RowDtype = "float32",
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
            dtype=dtype,
            rounding=rounding,
            slot_dtype=slot_dtype,
        )
        if config.hbm is not None:  # before the table's column family is created
            require_device(config.hbm.device)
        table = self._new_table(name, config)
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
        self.storage.drop_table(name)  # the current checkpoint keeps it
        self._dropped.add(name)

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"step={self._step}, tables={sorted(self._tables)}"
        return f"Database({str(self.path)!r}, {state})"


def _parse_disk(disk: Any) -> DiskConfig | None:
    if disk is True:
        return DiskConfig()
    if disk is False:
        return None
    if isinstance(disk, DiskConfig):
        return disk
    raise ConfigError(f"disk must be True, False or a DiskConfig, got {disk!r}")


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
