"""The RocksDB store under a database: one rocksdict database for all of its tables.

The ``default`` column family keeps the database's metadata and each table's rows live in
their own column family, named ``t.<table>`` (``evdb.tiers.rocks`` reads and writes them as
records). This module owns the database itself: writes in batches with RocksDB's errors
named (``StorageError`` for I/O, ``CorruptDataError`` for damage), the in-process recovery
after an I/O error (a full disk), and checkpoints. Its parts live beside it: the options and
memory budget (``store_options``), the write log a recovery copies from (``store_log``) and
the private "shadow" directories read-only opens work in (``store_shadows``).

Writes skip RocksDB's write-ahead log: durability comes from the checkpoint that
``Database.flush`` takes (``RocksStore.checkpoint``), and after a crash the working copy is
thrown away and recreated from the last checkpoint (``RocksStore.restore``). So nothing written
between two flushes can leak into the state a crash reopens to.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import rocksdict

from evdb.errors import CorruptDataError, EvdbError, StorageError
from evdb.tiers import store_options
from evdb.tiers.store_log import WriteLog
from evdb.tiers.store_options import (
    BLOCK_CACHE_BYTES,
    WRITE_CHUNK,
    Compression,
    family_options,
    rocks_options,
)
from evdb.tiers.store_shadows import ReadOnlyShadow

__all__ = ["Compression", "RocksStore", "link_or_copy_tree", "rocks_error"]


# The errno of an I/O error RocksDB reports as text (rocksdict raises a plain Exception).
_ERRNOS = {
    "No space left on device": errno.ENOSPC,
    "Disk quota exceeded": errno.EDQUOT,
    "Permission denied": errno.EACCES,
    "Read-only file system": errno.EROFS,
    "Input/output error": errno.EIO,
    "Too many open files": errno.EMFILE,
}


def rocks_error(path: Path, what: str, error: BaseException) -> EvdbError:
    """The evdb error for an exception of rocksdict (a plain Exception whose text is RocksDB's
    status, or an OSError of its own file calls): an I/O error is a ``StorageError`` (an
    OSError naming path and errno), anything else (corruption, a missing file, a bad
    argument) a ``CorruptDataError``."""
    text = " ".join(str(error).split())
    if isinstance(error, OSError) and not isinstance(error, FileNotFoundError):
        code: int | None = error.errno
    elif "No such file or directory" in text or text.startswith("Corruption"):
        return CorruptDataError(f"{path}: {what} ({text})")
    elif text.startswith("IO error") or any(phrase in text for phrase in _ERRNOS):
        # (rocksdict's own file calls say "No space left on device (os error 28)")
        code = next((n for phrase, n in _ERRNOS.items() if phrase in text), None)
    else:
        return CorruptDataError(f"{path}: {what} ({text})")
    advice = ""
    if code in (errno.ENOSPC, errno.EDQUOT):
        advice = "; free space and call again (flush() or close() resume the database)"
    return StorageError(code, f"{path}: {what}: {text}{advice}", str(path))


def link_or_copy_tree(src: Path, dest: Path) -> None:
    """dest = a copy of the RocksDB files under src: table files (immutable) hard-linked, the
    small mutable ones (MANIFEST, CURRENT, OPTIONS, logs) copied."""
    dest.mkdir(parents=True)
    for entry in os.scandir(src):
        target = dest / entry.name
        if entry.is_dir():
            link_or_copy_tree(Path(entry.path), target)
            continue
        if entry.name.endswith((".sst", ".blob")):
            try:
                os.link(entry.path, target)
                continue
            except OSError:  # another file system: copy instead
                pass
        shutil.copy2(entry.path, target)


class RocksStore:
    """The database's RocksDB: column families, metadata, checkpoints.

    ``column_families`` maps each table's column family to its compression; the database keeps
    that map outside RocksDB (in its pointer file), because RocksDB needs it to open.
    ``mmap_reads``: RocksDB reads its files through memory maps (``allow_mmap_reads``).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        column_families: dict[str, Compression],
        *,
        read_only: bool = False,
        mmap_reads: bool = False,
    ) -> None:
        self.path = Path(path)
        self.read_only = read_only
        self._cache = rocksdict.Cache(BLOCK_CACHE_BYTES)
        self._compression = dict(column_families)
        access = (
            rocksdict.AccessType.read_only() if read_only else rocksdict.AccessType.read_write()
        )
        # rocksdict rewrites its rocksdict-config.json on every open, read-only included, so a
        # read-only open goes through a private shadow of links (see store_shadows): the
        # snapshot itself keeps every byte and mtime, and any number of processes may open it
        # at once. A store never closed still removes its shadow, when collected or at exit.
        self._shadow = ReadOnlyShadow(self.path) if read_only else None
        try:
            self.db = rocksdict.Rdict(
                str(self.path if self._shadow is None else self._shadow.path),
                rocks_options("none", self._cache, mmap_reads),  # default family: metadata only
                column_families=family_options(self._compression, self._cache),
                access_type=access,
            )
        except Exception as e:  # rocksdict raises plain Exception for corruption and I/O
            self._remove_shadow()
            raise rocks_error(self.path, "RocksDB cannot open", e) from e
        # The tier's multi-gets verify block checksums (see store_options.read_options).
        self.read_options = store_options.read_options()
        self._write = rocksdict.WriteOptions()
        # (a property at runtime, though rocksdict's stubs declare a method)
        setattr(self._write, "disable_wal", True)  # noqa: B010
        setattr(self._write, "no_slowdown", True)  # noqa: B010 (see _write_batch)
        self._handles: dict[str, rocksdict.Rdict] = {}  # each pins the DB until closed
        self._reader: ThreadPoolExecutor | None = None  # prefetches' thread, made on first use
        # Writes skip the WAL, so what RocksDB's memtables hold exists nowhere else until they
        # are flushed: per column family ("default": metadata), the keys of the writes they
        # may still hold, oldest first (see _log_write), which _recover copies over.
        self._log = WriteLog()
        self._failed: StorageError | None = None  # the I/O error that stopped RocksDB
        self._mmap_reads = mmap_reads
        self._closed = False
        self._moved = False  # _recover moved a complete working copy in but could not open it

    # -- reads on a background thread -----------------------------------------------------
    def read_later(self, read: Callable[[], Any]) -> Future[Any]:
        """Run ``read`` on the store's reader thread (RocksDB reads are thread-safe, and
        rocksdict lets go of the GIL inside them). ``close`` and ``drop_column_family``
        wait for what is queued, so no read outlives its column family."""
        if self._reader is None:
            self._reader = ThreadPoolExecutor(1, thread_name_prefix="evdb-prefetch")
        return self._reader.submit(read)

    def _wait_for_reads(self) -> None:
        if self._reader is not None:
            self._reader.shutdown(wait=True)
            self._reader = None

    # -- column families ------------------------------------------------------------------
    def column_family(self, name: str, compression: Compression) -> rocksdict.Rdict:
        """The column family called name, created (empty) if missing. Callers ask for it at
        each use and keep no handle: ``_recover`` replaces them all."""
        if name not in self._compression:
            self._resume()
            try:
                self.db.create_column_family(name, rocks_options(compression, self._cache))
            except Exception as e:
                raise self._error("RocksDB cannot create a column family", e) from e
            self._compression[name] = compression
        if name not in self._handles:
            self._handles[name] = self.db.get_column_family(name)
        return self._handles[name]

    def drop_column_family(self, name: str) -> None:
        if name in self._compression:
            self._wait_for_reads()
            self._resume()
            handle = self._handles.pop(name, None)
            if handle is not None:
                handle.close()
            try:
                self.db.drop_column_family(name)
            except Exception as e:
                raise self._error("RocksDB cannot drop a column family", e) from e
            del self._compression[name]
            self._log.forget(name)

    @property
    def column_families(self) -> dict[str, Compression]:
        return dict(self._compression)

    def write_rows(self, name: str, keys: list[bytes], values: list[bytes] | None) -> None:
        """Put (or, with values None, delete) rows of a column family, in write batches of
        ``WRITE_CHUNK`` rows. Up to that many rows are written whole or not at all; a
        ``StorageError`` after more says how many were written (the first ones)."""
        self._resume()
        self._log_write(name, keys)
        for start in range(0, len(keys), WRITE_CHUNK):

            def batch(start: int = start) -> rocksdict.WriteBatch:
                batch = rocksdict.WriteBatch(raw_mode=True)
                batch.set_default_column_family(self.db.get_column_family_handle(name))
                chunk = keys[start : start + WRITE_CHUNK]
                if values is None:  # deque(map(...)) runs the calls in C, not a Python loop
                    collections.deque(map(batch.delete, chunk), maxlen=0)
                else:
                    collections.deque(
                        map(batch.put, chunk, values[start : start + WRITE_CHUNK]), maxlen=0
                    )
                return batch

            done = f" ({start} of {len(keys)} rows written)" if start else ""
            self._write_batch(batch, f"RocksDB write failed{done}")

    # -- metadata (default column family) -------------------------------------------------
    def put_meta(self, items: dict[str, bytes]) -> None:
        self._write_meta([(key.encode(), value) for key, value in items.items()])

    def get_meta(self, key: str) -> bytes | None:
        value = self.db.get(key.encode())
        return None if value is None else bytes(value)

    def delete_meta(self, keys: list[str]) -> None:
        self._write_meta([(key.encode(), None) for key in keys])

    def _write_meta(self, items: list[tuple[bytes, bytes | None]]) -> None:
        """One write batch of puts (and, where the value is None, deletes): all or nothing."""
        self._resume()
        self._log_write("default", [key for key, _ in items])

        def batch() -> rocksdict.WriteBatch:
            batch = rocksdict.WriteBatch(raw_mode=True)
            for key, value in items:
                if value is None:
                    batch.delete(key)
                else:
                    batch.put(key, value)
            return batch

        self._write_batch(batch, "RocksDB metadata write failed")

    def _write_batch(self, batch: Callable[[], rocksdict.WriteBatch], what: str) -> None:
        """Write ``batch()`` (made again for each try: a write consumes it). A write that
        RocksDB would stall (it waits for a background flush or compaction) fails at once
        instead (``no_slowdown``) and is tried again once the stall is over, unless a
        background job failed meanwhile: on a full disk RocksDB retries its flush, and would
        keep the writer waiting, until space is freed; this raises ``StorageError``."""
        while True:
            try:
                self.db.write(batch(), self._write)
                return
            except Exception as e:
                if "Write stall" not in str(e):  # RocksDB's "Result incomplete: Write stall"
                    raise self._error(what, e) from e
            self._wait_out_stall(what)

    def _wait_out_stall(self, what: str) -> None:
        def prop(name: str) -> int:
            return self.db.property_int_value(f"rocksdb.{name}") or 0

        errors = prop("background-errors")
        delay = 0.001
        while True:  # bounded: the stall ends, or a background job fails (every second)
            time.sleep(delay)
            delay = min(2 * delay, 0.05)
            if prop("background-errors") > errors:
                st = os.statvfs(self.path)
                full = st.f_bavail * st.f_frsize < 2 * store_options.WRITE_BUFFER_BYTES
                why = "No space left on device" if full else "a background job failed"
                self._failed = StorageError(
                    errno.ENOSPC if full else errno.EIO,
                    f"{self.path}: {what}: RocksDB stalled writes and its background flush "
                    f"failed ({why}); free space and call again (flush() or close() resume "
                    "the database)",
                    str(self.path),
                )
                raise self._failed
            if not (prop("is-write-stopped") or prop("actual-delayed-write-rate")):
                return

    # -- durability -----------------------------------------------------------------------
    def checkpoint(self, dest: Path) -> None:
        """Flush the memtables and hard-link a consistent copy of every column family into
        dest (which must not exist). RocksDB builds it under a temporary name and renames it;
        on an error, the temporary directory is removed (dest, if RocksDB renamed it before
        failing, is the caller's to remove)."""
        self._resume()
        try:
            rocksdict.Checkpoint(self.db).create_checkpoint(str(dest))
        except Exception as e:
            shutil.rmtree(dest.with_name(dest.name + ".tmp"), ignore_errors=True)
            raise self._error(f"RocksDB checkpoint {dest} failed", e) from e
        self._log.clear()  # the checkpoint flushed every memtable: nothing left to lose

    # -- I/O errors and recovery ----------------------------------------------------------
    def _error(self, what: str, e: BaseException) -> EvdbError:
        """The evdb error for a failed RocksDB call; an I/O error also marks the store as
        stopped, so the next write first tries ``_resume``."""
        error = rocks_error(self.path, what, e)
        if isinstance(error, StorageError):
            self._failed = error
        return error

    def _log_write(self, name: str, keys: list[bytes]) -> None:
        """Note the keys of a write in the write log (before it is tried: a failed one may
        be applied), first flushing the family's memtables if its log is full."""
        if self.read_only:
            return
        if self._log.is_full(name):  # (before this write is tried: it is not logged yet)
            self._flush_family(name)
        self._log.note(name, keys)

    def _flush_family(self, name: str) -> None:
        """Flush a column family's memtables to disk and empty its write log: once RocksDB
        has recorded the flush, its rows are in the working copy's files, which a recovery
        starts from."""
        try:
            self.db.get_column_family(name).flush(True)
        except Exception as e:
            raise self._error(f"RocksDB flush of {name} failed", e) from e
        self._log.forget(name)

    def _resume(self) -> None:
        """Make a store that an I/O error stopped writable again, or raise ``StorageError``.

        RocksDB stops writing after a failed background flush (a full disk) and rocksdict
        cannot resume it. If a probe write still fails, ``_recover`` moves the working copy
        to a fresh RocksDB, changing nothing if it fails too."""
        if self._failed is None:
            return
        if self._moved:  # the working copy is complete on disk: only open it
            self.db = self._open_db()
            self._moved = False
            self._failed = None
            return
        try:
            probe = rocksdict.WriteBatch(raw_mode=True)
            probe.delete(b"evdb.probe")
            self.db.write(probe, self._write)  # refused while stopped, or stalled
        except Exception:
            self._recover()
        self._failed = None

    def _recover(self) -> None:
        """Rebuild the working copy from what is on disk plus what the memtables hold.

        The stopped RocksDB still reads. Its files on disk are hard-linked into a sibling
        directory, where a second RocksDB opens them (the state of its last completed
        background flush); every key of the write log (the writes its memtables may hold)
        is copied over from the stopped one, put or deleted as it reads there, and flushed.
        Only then is the stopped one closed and the new copy moved in its place. Any error
        before that leaves the stopped store as it was and raises ``StorageError``."""
        assert self._failed is not None
        fresh = self.path.with_name(self.path.name + ".tmp")  # what restore() clears too
        try:
            self.db.cancel_all_background(True)
            shutil.rmtree(fresh, ignore_errors=True)
            link_or_copy_tree(self.path, fresh)
            self._copy_log(fresh)
        except BaseException as e:
            shutil.rmtree(fresh, ignore_errors=True)
            if isinstance(e, EvdbError):
                raise
            if isinstance(e, Exception):
                raise self._error("RocksDB cannot resume after an I/O error", e) from e
            raise
        self._close_db()
        self._log.clear()  # fresh holds it all, flushed
        self._moved = True
        shutil.rmtree(self.path)  # (a crash now: the open recreates it from the checkpoint)
        os.replace(fresh, self.path)
        self.db = self._open_db()
        self._moved = False

    def _copy_log(self, fresh: Path) -> None:
        """Open fresh, copy into it every logged key's row from the stopped RocksDB, flush
        each column family and close it; raises if any step fails."""
        db = rocksdict.Rdict(
            str(fresh),
            rocks_options("none", self._cache),
            column_families=family_options(self._compression, self._cache),
        )
        try:
            self._log.copy_rows(self.db, db, list(self._compression), self._write)
        finally:
            db.close()

    def _open_db(self) -> rocksdict.Rdict:
        try:
            return rocksdict.Rdict(
                str(self.path),
                rocks_options("none", self._cache, self._mmap_reads),
                column_families=family_options(self._compression, self._cache),
            )
        except Exception as e:
            raise self._error("RocksDB cannot reopen after an I/O error", e) from e

    def _close_db(self) -> None:
        """Close the RocksDB and every handle on it; errors are the caller's to judge (a
        stopped RocksDB fails its final flush, which loses nothing that _recover copied)."""
        handles, self._handles = list(self._handles.values()), {}
        for handle in handles:
            with contextlib.suppress(Exception):
                handle.close()
        del handles
        with contextlib.suppress(Exception):
            self.db.close()

    @staticmethod
    def restore(checkpoint: Path, dest: Path) -> None:
        """Make dest a fresh working copy of checkpoint: table files (immutable) are
        hard-linked, the small mutable ones (MANIFEST, CURRENT, OPTIONS, logs) copied."""
        if dest.exists():
            shutil.rmtree(dest)
        tmp = dest.with_name(dest.name + ".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        link_or_copy_tree(checkpoint, tmp)
        os.replace(tmp, dest)

    def close(self) -> None:
        """Close RocksDB and every handle; a second call does nothing. It lets go of all
        of them even when RocksDB's final flush fails, and raises that error after."""
        if self._closed:
            return
        self._closed = True
        self._wait_for_reads()
        error: BaseException | None = None
        handles, self._handles = list(self._handles.values()), {}
        for handle in [*handles, self.db]:
            try:
                handle.close()
            except Exception as e:  # rocksdict drops the handle even when its flush fails
                error = error or e
        del handles
        self._remove_shadow()
        if error is not None and not self._moved and self._failed is None:
            raise rocks_error(self.path, "RocksDB close failed", error) from error

    def _remove_shadow(self) -> None:
        if self._shadow is not None:
            self._shadow.remove()
            self._shadow = None

    def compact_range(self, column_family: str | None = None) -> None:
        """RocksDB manual compaction of one column family's whole key range (of every column
        family, the default one included, when None).

        It rewrites the files down to the bottom level without deleted rows' tombstones and
        overwritten versions, so the space that deletions freed goes back to the file system
        once no checkpoint hard-links the old files (``Database.flush`` drops the previous
        one). Blocks until done; the bottom level is rewritten too (``force_optimized``).
        """
        from evdb.errors import InvalidArgumentError, ReadOnlyError

        if self.read_only:
            raise ReadOnlyError(f"{self.path}: cannot compact a store opened read-only")
        if column_family is not None and column_family not in self._compression:
            raise InvalidArgumentError(
                f"column_family: no column family {column_family!r} in {self.path}; "
                f"column families: {sorted(self._compression)}"
            )
        opts = rocksdict.CompactOptions()
        opts.set_bottommost_level_compaction(rocksdict.BottommostLevelCompaction.force_optimized())
        names = sorted(self._compression) if column_family is None else [column_family]
        try:
            if column_family is None:
                self.db.compact_range(None, None, opts)  # the default family: metadata
            for name in names:
                self.column_family(name, self._compression[name]).compact_range(None, None, opts)
        except Exception as e:  # rocksdict raises plain Exception for I/O and corruption
            raise self._error("RocksDB manual compaction failed", e) from e
