"""What a memory-mapped layout for immutable cold rows would read at: the floor under RocksDB.

``profile_spill`` replays the multi-gets its RocksDB tier made (``_rocks_floor``); this
replays the same keys on the same rows laid out as one immutable file (what a serving
snapshot, which never changes after export, could use): the keys sorted, int64, then the
records, packed, in key order, the file memory-mapped. A read is ``np.searchsorted`` of the
call's keys in the mapped keys, a mask of those found and one gather of their records into a
fresh buffer: the same answer ``RocksTier.get`` gives (which keys were found, their record
bytes in input order). The file's pages are read once first (the OS page cache warm, as for
the compacted RocksDB copies). Calling-thread CPU per key asked, as the other replays.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from evdb.tiers.rocks import decode_keys

CHUNK = 65_536


def write_layout(cf: Any, path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Every row of a column family into ``path`` (keys, then records), mapped back:
    keys (n,) int64 sorted, records (n, record bytes) uint8."""
    keys: list[np.ndarray] = []
    values: list[bytes] = []
    chunk_keys: list[bytes] = []
    for key, value in cf.items():
        chunk_keys.append(key)
        values.append(value)
        if len(chunk_keys) == CHUNK:
            keys.append(decode_keys(b"".join(chunk_keys)))
            chunk_keys = []
    if chunk_keys:
        keys.append(decode_keys(b"".join(chunk_keys)))
    all_keys = np.concatenate(keys) if keys else np.zeros(0, np.int64)
    size = len(values[0]) if values else 1
    with open(path, "wb") as f:
        f.write(all_keys.tobytes())
        f.write(b"".join(values))
    n = all_keys.shape[0]
    mapped_keys = np.memmap(path, dtype=np.int64, mode="r", shape=(n,))
    records = np.memmap(path, dtype=np.uint8, mode="r", offset=8 * n, shape=(n, size))
    return mapped_keys, records


def read(keys: np.ndarray, records: np.ndarray, asked: np.ndarray) -> tuple[np.ndarray, Any]:
    """Which of ``asked`` are stored, and their records in input order."""
    at = np.searchsorted(keys, asked)
    np.minimum(at, keys.shape[0] - 1, out=at)
    found = keys[at] == asked
    return found, records[at[found]]


def replay_mmap(cf: Any, calls: list[list[bytes]], parent: str | None) -> tuple[float, int]:
    """Calling-thread CPU ns per key asked over the calls, and the keys found."""
    path = Path(tempfile.mkdtemp(prefix="evdb-bench-mmap-", dir=parent))
    try:
        keys, records = write_layout(cf, path / "rows.bin")
        _ = int(records.sum(dtype=np.uint64)) + int(keys.sum())  # every page in the cache
        asked = [decode_keys(b"".join(call)) for call in calls]  # untimed, as for RocksDB
        cpu = found = n = 0
        for call in asked:
            t0 = time.thread_time_ns()
            hit, _rows = read(keys, records, call)
            cpu += time.thread_time_ns() - t0
            found += int(hit.sum())
            n += call.shape[0]
        del keys, records
        return cpu / max(1, n), found
    finally:
        shutil.rmtree(path, ignore_errors=True)
