"""The write log of a ``RocksStore``: the keys of the writes RocksDB's memtables may still hold.

Writes skip RocksDB's write-ahead log, so what the memtables hold exists nowhere else until
they are flushed. When an I/O error (a full disk) stops RocksDB, the store rebuilds its
working copy from the files on disk plus the rows of every logged key, which
``WriteLog.copy_rows`` reads from the stopped RocksDB (it still reads) into the fresh one.
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Any

import numpy as np
import rocksdict

from evdb.tiers.store_options import WRITE_CHUNK

__all__ = ["WriteLog"]

# Keys a column family's write log takes, beyond twice its distinct keys, before they are
# merged into one array of distinct keys (see WriteLog.note).
_LOG_COMPACT = 1 << 18
# Distinct keys a column family's write log holds (8 bytes each) before the family's
# memtables are flushed to disk, which empties it: the log's memory stays bounded however
# long a database goes between its own flushes.
_LOG_FLUSH_KEYS = 1 << 23


def _distinct_keys(log: list[Any]) -> np.ndarray:
    """The distinct 8-byte keys of a write log (lists of keys, or arrays of them), sorted,
    as the numbers they spell big-endian (native uint64: sorting them is fast)."""
    parts = [
        p if isinstance(p, np.ndarray) else np.frombuffer(b"".join(p), ">u8").astype(np.uint64)
        for p in log
    ]
    keys = np.sort(np.concatenate(parts)) if parts else np.empty(0, np.uint64)
    # (not np.unique: numpy 2.4's hashes, 10x slower than a sort here)
    return keys[np.concatenate(([True], keys[1:] != keys[:-1]))] if keys.shape[0] else keys


class WriteLog:
    """Per column family (``"default"``: metadata), the keys written since the family's
    memtables were last flushed, oldest first: lists of keys as written, or (a table's, as it
    grows) one array of distinct ones.

    The log keeps every key written since the last checkpoint, which flushes the memtables
    and clears it. (What the memtables hold is not the only thing to keep: a flush that
    RocksDB installed but failed to record on disk is lost to a reopen too.) A table's log is
    merged into one array of distinct keys as it grows: its memory is 8 bytes per distinct
    key written since the last flush, plus at most ``_LOG_COMPACT`` keys as they came.
    """

    def __init__(self) -> None:
        self._keys: dict[str, list[Any]] = {}
        self._rows: dict[str, int] = {}  # per family, the keys its log holds

    def is_full(self, name: str) -> bool:
        """Whether the log of column family ``name`` holds more than ``_LOG_FLUSH_KEYS``
        distinct keys: the family's memtables are to be flushed (and ``forget(name)``
        called) before its next write is noted."""
        log = self._keys.get(name, [])
        distinct = log[0].shape[0] if log and isinstance(log[0], np.ndarray) else 0
        return bool(distinct > _LOG_FLUSH_KEYS)

    def note(self, name: str, keys: list[bytes]) -> None:
        """Note the keys of a write to column family ``name`` (before it is tried: a failed
        one may be applied)."""
        log = self._keys.setdefault(name, [])
        log.append(keys)
        rows = self._rows.get(name, 0) + len(keys)
        distinct = log[0].shape[0] if isinstance(log[0], np.ndarray) else 0
        if name != "default" and rows > 2 * distinct + _LOG_COMPACT:
            log[:] = [_distinct_keys(log)]
            rows = log[0].shape[0]
        self._rows[name] = rows

    def forget(self, name: str) -> None:
        """Empty the log of column family ``name`` (its memtables were flushed, or it was
        dropped)."""
        self._keys.pop(name, None)
        self._rows.pop(name, None)

    def clear(self) -> None:
        """Empty every family's log (every memtable was flushed)."""
        self._keys.clear()
        self._rows.clear()

    def copy_rows(
        self,
        src: rocksdict.Rdict,
        dst: rocksdict.Rdict,
        column_families: list[str],
        write: rocksdict.WriteOptions,
    ) -> None:
        """Copy from database ``src`` into database ``dst`` the row of every logged key (put,
        or deleted where ``src`` has none) of the default family and ``column_families``,
        and flush each family of ``dst``; raises if any step fails."""
        handles: list[rocksdict.Rdict] = []
        try:
            for name in ["default", *column_families]:
                if name == "default":
                    source, target_db = src, dst
                else:
                    source, target_db = src.get_column_family(name), dst.get_column_family(name)
                    handles += [source, target_db]
                log = self._keys.get(name, [])
                if name == "default":  # metadata: a few names of any length
                    keys: list[Any] = sorted(set(itertools.chain(*log)))
                else:  # rows: 8-byte keys, millions maybe
                    keys = _distinct_keys(log).astype(">u8").view("V8").tolist()  # bytes again
                target = target_db.get_column_family_handle(name) if name != "default" else None
                for start in range(0, len(keys), WRITE_CHUNK):
                    chunk = keys[start : start + WRITE_CHUNK]
                    batch = rocksdict.WriteBatch(raw_mode=True)
                    if target is not None:
                        batch.set_default_column_family(target)
                    got: list[Any] = source.get(chunk) or []
                    for key, value in zip(chunk, got, strict=True):
                        if value is None:
                            batch.delete(key)
                        else:
                            batch.put(key, value)
                    dst.write(batch, write)
                target_db.flush()
        finally:
            for handle in handles:
                with contextlib.suppress(Exception):
                    handle.close()
            del handles
