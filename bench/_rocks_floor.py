"""The floor of the RocksDB tier's reads: rocksdict's bare multi-get of the same keys.

``profile_spill`` records the encoded keys the RocksDB tier asked RocksDB for during its
timed steps (sorted, as the tier asks), then replays them here and reads the calling
thread's CPU time: on the tier's own column family, through ``RocksTier.get`` and as bare
``Rdict.get(list)`` calls in turn (the same LSM shape and caches, so the difference is
evdb's own work), and on fresh copies of its rows in bare databases opened with evdb's
options and read options (compacted to one sorted run, file pages in the OS page cache,
with and without memory-mapped reads). The lowest bare figure is the floor.
"""

from __future__ import annotations

import collections
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import rocksdict

from evdb.tiers import rocks, store_options
from evdb.tiers.rocks import decode_keys

COPY_CHUNK = 65_536


@dataclass
class Replay:
    name: str
    cpu_ns: int  # calling thread CPU over every call
    keys: int  # keys asked
    found: int  # of them, found

    @property
    def ns_per_key(self) -> float:
        return self.cpu_ns / max(1, self.keys)


def replay(name: str, db: Any, calls: list[list[bytes]], read_opt: Any = None) -> Replay:
    """Every call of ``calls`` as one bare multi-get, its calling-thread CPU summed."""
    cpu = found = keys = 0
    for call in calls:
        t0 = time.thread_time_ns()
        got = db.get(call) if read_opt is None else db.get(call, read_opt=read_opt)
        cpu += time.thread_time_ns() - t0
        keys += len(call)
        found += len(got) - got.count(None)
    return Replay(name, cpu, keys, found)


def _items(cf: Any) -> Iterator[list[tuple[bytes, bytes]]]:
    """Every (key, value) of a column family, a chunk at a time."""
    chunk: list[tuple[bytes, bytes]] = []
    for item in cf.items():
        chunk.append(item)
        if len(chunk) == COPY_CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def same_store_replays(tier: Any, calls: list[list[bytes]]) -> list[Replay]:
    """The calls replayed on the tier's own column family, each call by every side in turn
    (so all meet the same machine; which side goes first, and so reads the blocks into
    RocksDB's block cache, rotates): through ``RocksTier.get`` (keys decoded first, untimed),
    and as bare multi-gets with default and with the tier's read options."""
    cf, opts = tier.cf, store_options.read_options()
    split = getattr(rocks, "SPLIT_KEYS", None)  # (evdb before issue 32's second round: none)
    if split is not None:  # one thread's CPU per key on every side: the tier reads unsplit
        rocks.SPLIT_KEYS = 1 << 62
    try:
        return _replays_in_turn(tier, cf, opts, calls)
    finally:
        if split is not None:
            rocks.SPLIT_KEYS = split


def _replays_in_turn(tier: Any, cf: Any, opts: Any, calls: list[list[bytes]]) -> list[Replay]:
    sides = [
        Replay("RocksTier.get, replayed", 0, 0, 0),
        Replay("bare multi-get, evdb's column family", 0, 0, 0),
        Replay("  the same, the tier's read options", 0, 0, 0),
    ]
    reads = (tier.get, cf.get, lambda c: cf.get(c, read_opt=opts))
    for i, call in enumerate(calls):
        keys = decode_keys(b"".join(call))
        for j in range(len(sides)):  # each side first in turn: the first one warms the caches
            side, read = sides[(i + j) % len(sides)], reads[(i + j) % len(sides)]
            arg = keys if side is sides[0] else call
            t0 = time.thread_time_ns()
            got = read(arg)
            side.cpu_ns += time.thread_time_ns() - t0
            side.keys += len(call)
            side.found += int(got[0].sum()) if side is sides[0] else len(got) - got.count(None)
    return sides


def floor_replays(tier: Any, calls: list[list[bytes]], parent: str | None) -> list[Replay]:
    """``same_store_replays``, then the calls on compacted copies of the tier's rows in bare
    databases with evdb's options and the tier's read options, without and with
    memory-mapped reads (which evdb leaves off by default: mapped pages count in RSS)."""
    out = same_store_replays(tier, calls)
    path = Path(tempfile.mkdtemp(prefix="evdb-bench-floor-", dir=parent))
    try:
        for mmap in (False, True):
            db = rocksdict.Rdict(
                str(path / f"raw-{mmap}"),
                store_options.rocks_options(
                    "none", rocksdict.Cache(store_options.BLOCK_CACHE_BYTES), mmap
                ),
            )
            try:
                write = rocksdict.WriteOptions()
                setattr(write, "disable_wal", True)  # noqa: B010 (a property)
                for chunk in _items(tier.cf):
                    batch = rocksdict.WriteBatch(raw_mode=True)
                    collections.deque(map(lambda kv: batch.put(*kv), chunk), maxlen=0)
                    db.write(batch, write)
                db.flush(True)
                db.compact_range(None, None)
                replay("warm-up", db, calls[: max(1, len(calls) // 10)])  # index and filters
                opts = store_options.read_options()
                name = "bare copy, compacted" + (", mmap reads" if mmap else "")
                out.append(replay(name, db, calls, opts))
            finally:
                db.close()
    finally:
        shutil.rmtree(path, ignore_errors=True)
    return out
