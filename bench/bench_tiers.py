"""The RocksDB tier under DRAM: cold reads, spill-heavy training, write-back and compression,
as ratios against baselines measured in the same run.

What is measured (dim ``--dim``, float32 values, int64 keys; every store is a fresh directory
under ``--tmpdir``, so that file system is the disk measured):

* cold reads: a table of ``--rows`` rows (SGD, so a record is the values plus 20 bytes of
  metadata) with a DRAM tier of ``--cold-dram`` rows, filled with ``upsert`` (rows spill to
  RocksDB as they are evicted) and ``db.flush()``, so that nearly every row lives only in
  SST files. ``evdb``: ``Table.lookup(keys)`` of ``--batch`` distinct existing keys that the
  DRAM tier does not hold (checked with the DRAM tier's index; the timed calls' DRAM hits are
  counted and printed). ``raw``: a bare rocksdict database with the same options as evdb's
  (``evdb.tiers.store_options.rocks_options(DiskConfig().compression, Cache(32 MiB))``: the default
  compression, 16 MiB memtables, bloom filter
  of 10 bits per key, 32 MiB block cache), holding the same keys (``encode_keys``) with
  records of the same layout and bytes (``disk_dtype(dim, 0, "float32")``, same values),
  written in write batches without WAL and flushed; timed: ``Rdict.get(list)`` (one
  multi-get) of the same keys, encoded before the clock starts, without converting anything
  to numpy. Both stores are then compacted to one sorted run (``compact_range`` over every
  key), so both reads probe the same LSM shape (without it the shape depends on when the
  background compactions happened to run). ``in DRAM``: the same rows and batches in a table
  with ``disk=False``, for scale. Two OS page-cache states, each before every call of both
  sides: ``cached`` reads every file of the store in full first, so each block the call needs
  is in the OS page cache and only RocksDB's 32 MiB block cache (mostly) misses; ``dropped``
  fsyncs every file of the store and asks the kernel to drop its pages
  (``posix_fadvise(POSIX_FADV_DONTNEED)``), so the blocks come from the disk (on a VM: from
  the virtual disk, which the host may still cache). Fresh random keys each call (the same for
  both sides), so neither cache holds the blocks from the call before.
* spill-heavy training: ``--train-batch`` keys per step drawn from a Zipf(``--zipf-a``)
  distribution over ``--zipf-keys`` distinct keys: numpy's unbounded ``zipf`` draws are
  truncated to ranks 1..K by rejection (draws above K are redrawn), and rank r maps to
  ``keymap[r - 1]``, a fixed array of K random int64 keys, so hot keys are scattered over the
  key space (and over RocksDB's key order). Each step: ``pull`` + ``push`` (grads a fixed
  random (batch, dim) matrix, std 0.01, sliced to the distinct keys) + ``db.advance()``, Adagrad
  (lr 0.05). Run ``A``: ``dram_rows`` = ``--dram-share`` of K, ``disk=True``. Run ``B``: every
  row in DRAM (``dram_rows=None``, ``disk=False``). Both start empty in their own database and
  see the same pre-drawn batches; ``--train-warmup`` untimed steps, then ``--train-steps``
  timed ones. B runs first, then A, so A's background compactions cannot slow B. keys/s is
  keys of the timed steps over their total time (eviction and slab growth come in bursts, so
  the median step is shown next to it). Runs ``C`` and ``D`` (skipped with ``--model-ms 0``):
  A's table, each step sleeping ``--model-ms`` between pull and push, standing for an
  accelerator's forward and backward while the host waits; D also calls
  ``Table.prefetch(next batch)`` right after the pull, so its disk reads run in that wait.
  ``D / C`` is what the read ahead buys. The DRAM hit rate is over distinct keys per step
  (what ``stats()["tiers"]["dram"]`` counts), as are promotions (rows read back from disk),
  write-backs (dirty victims written down) and disk reads (found / not found: a key never
  spilled costs a bloom-filter probe).
* write-back: a table (Adagrad, so a record also carries dim float32 accumulators) whose DRAM
  tier holds ``--flush-rows`` dirty rows (``dram_rows=None``, ``disk=True``, filled with
  ``upsert``; nothing has spilled). ``evdb``: ``db.flush()``: every dirty row written to
  RocksDB, then a RocksDB checkpoint (memtables flushed to SST files, hard links, fsyncs).
  ``raw``: the same number of records of the same bytes, pre-encoded, written to a bare
  rocksdict database as evdb does it (write batches of 65,536 filled with
  ``deque(map(batch.put, keys, values), maxlen=0)``, WAL off), then ``Rdict.flush()`` of the
  memtable, so both sides end with the rows in SST files. Each repeat builds both stores
  afresh and runs ``os.sync()`` before its timed call.
* compression: ``--compress-rows`` rows of "trained-like" values (normal, std 0.05; SGD)
  flushed from DRAM for each of float32 with no compression, LZ4, ZSTD, and float16 with none
  and LZ4:
  bytes per row on disk (``stats()["tiers"]["rocksdb"]["bytes"]`` after the flush: SST files
  plus memtables), the flush's write rate, the time of a full ``compact_range``, and the cold
  read rate (``cached`` as above, after reopening the database so that DRAM is empty).

Every cold-read and write-back figure is the median of ``--repeat`` (``--flush-repeat``)
calls after one untimed warm-up call, with ``time.perf_counter``. Nothing is asserted about
times. Run: ``.venv/bin/python bench/bench_tiers.py`` or ``--quick``.
"""

from __future__ import annotations

import argparse
import collections
import gc
import importlib.metadata
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numba
import numpy as np
import rocksdict
from _common import (
    VALUE_STD,
    cpu_line,
    fill,
    fmt_count,
    fmt_rate,
    fmt_ratio,
    fs_of,
    log,
    malloc_trim,
    print_table,
    random_keys,
    timed,
    values_like_trained,
    versions_line,
    wall_line,
)

import evdb
from evdb.config import DiskConfig
from evdb.database import WORKING
from evdb.tiers import rocks
from evdb.tiers import store_options as rocks_store

TABLE = "bench"
WRITE_CHUNK = 65_536  # rows per raw write batch, as evdb.tiers.store.RocksStore.write_rows
GRAD_STD = 0.01
TRAIN_LR = 0.05
COLD_AIM = 0.8  # the aim for cold reads: evdb / raw >= 0.8
COMPRESS_CONFIGS = (  # (disk dtype, compression)
    ("float32", "none"),
    ("float32", "lz4"),
    ("float32", "zstd"),
    ("float16", "none"),
    ("float16", "lz4"),
)
OS_CACHE_STATES = ("cached", "dropped")


# -- results ------------------------------------------------------------------------------
@dataclass
class ColdResult:
    state: str  # OS page-cache state: "cached" or "dropped"
    evdb: float  # keys/s
    raw: float  # bare multi-get, the previous options (a baseline fixed across versions)
    floor: float  # bare multi-get, evdb's options and read options (the floor)
    dram_hits: int  # DRAM hits over evdb's timed calls (0: every row came from disk)


@dataclass
class ColdStores:
    """What the cold reads need: both stores, the directories of their files, the rows."""

    table: evdb.Table
    raw: rocksdict.Rdict
    floor: rocksdict.Rdict
    evdb_dir: Path  # evdb's working copy of RocksDB: the files its reads go to
    raw_dir: Path
    floor_dir: Path
    keys: np.ndarray
    values: np.ndarray
    encoded: list[bytes]  # keys, as RocksDB sees them
    on_disk: np.ndarray  # indices of the keys whose rows are in SST files only


@dataclass
class TrainRun:
    name: str
    dram_rows: int | None
    keys_per_s: float  # timed keys / total time of the timed steps
    median_step: float  # s
    max_step: float  # s
    deltas: dict[str, int]  # counters over the timed steps
    rows_at_end: int


@dataclass
class FlushResult:
    evdb: float  # median s
    evdb_checkpoint: float  # median s of the checkpoint inside evdb's flush
    raw: float  # median s


@dataclass
class CompressResult:
    dtype: str
    compression: str
    record_bytes: int
    disk_bytes_per_row: float
    flush_s: float
    compact_s: float
    lookup: float  # keys/s, cached


@dataclass
class Report:
    cold: list[ColdResult] = field(default_factory=list)
    in_dram: float = 0.0  # keys/s
    cold_build: dict[str, float] = field(default_factory=dict)
    train: list[TrainRun] = field(default_factory=list)
    train_unique: float = 0.0  # median distinct keys per step
    flush: FlushResult | None = None
    compress: list[CompressResult] = field(default_factory=list)


# -- helpers ------------------------------------------------------------------------------
@contextmanager
def scratch_dir(parent: str | None, prefix: str) -> Iterator[Path]:
    """A fresh directory under parent, removed (with what a store left in it) afterwards."""
    path = Path(tempfile.mkdtemp(prefix=f"evdb-bench-{prefix}-", dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def store_files(path: Path) -> Iterator[str]:
    for root, _, files in os.walk(path):
        for name in files:
            yield os.path.join(root, name)


def cache_files(path: Path) -> None:
    """Read every file under path in full, so all its pages sit in the OS page cache."""
    buf = bytearray(1 << 20)
    for name in store_files(path):
        with open(name, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def drop_files(path: Path) -> None:
    """Write back, then ask the kernel to drop the page-cache pages of every file under
    path (their reads then go to the disk). Dropping needs no privilege, unlike
    /proc/sys/vm/drop_caches, and leaves every other file's pages alone."""
    for name in store_files(path):
        fd = os.open(name, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def prepare_os_cache(state: str, path: Path) -> None:
    (cache_files if state == "cached" else drop_files)(path)


def raw_store(path: Path, mmap_reads: bool, options: Any = None) -> rocksdict.Rdict:
    """A bare rocksdict database with evdb's options (or ``options(compression, cache,
    mmap_reads)``), and its own 32 MiB block cache."""
    cache = rocksdict.Cache(rocks_store.BLOCK_CACHE_BYTES)
    make = rocks_store.rocks_options if options is None else options
    return rocksdict.Rdict(str(path), make(DiskConfig().compression, cache, mmap_reads))


def raw_write(db: rocksdict.Rdict, keys: list[bytes], values: list[bytes]) -> None:
    """Write as evdb's RocksStore.write_rows does: batches of WRITE_CHUNK, WAL off."""
    opts = rocksdict.WriteOptions()
    setattr(opts, "disable_wal", True)  # noqa: B010 (a property; rocksdict's stubs disagree)
    for start in range(0, len(keys), WRITE_CHUNK):
        batch = rocksdict.WriteBatch(raw_mode=True)
        collections.deque(
            map(batch.put, keys[start : start + WRITE_CHUNK], values[start : start + WRITE_CHUNK]),
            maxlen=0,
        )
        db.write(batch, opts)


def packed_records(values: np.ndarray, slots: np.ndarray | None, dtype: str) -> list[bytes]:
    """Records in evdb's disk layout (metadata zero), one bytes object per row."""
    n, dim = values.shape
    n_slots = 0 if slots is None else slots.shape[1]
    layout = rocks.disk_dtype(dim, n_slots, dtype)  # type: ignore[arg-type]
    rec = np.zeros(n, dtype=layout)
    rec["value"] = values
    if slots is not None:
        rec["slots"] = slots
    return rec.view(f"V{layout.itemsize}").tolist()  # type: ignore[no-any-return]


def baseline_options(
    compression: Any = "none", cache: Any = None, mmap_reads: bool = False
) -> rocksdict.Options:
    """The options evdb opened RocksDB with at git 0dffac6 (before issue 32): the cold
    reads' raw baseline, kept fixed so that versions compare against the same store."""
    opts = rocksdict.Options(raw_mode=True)
    opts.set_allow_mmap_reads(mmap_reads)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    opts.set_compression_type(getattr(rocksdict.DBCompressionType, compression)())
    opts.set_write_buffer_size(16 << 20)
    opts.set_max_write_buffer_number(2)
    opts.set_max_background_jobs(2)
    opts.set_level_zero_file_num_compaction_trigger(8)
    table = rocksdict.BlockBasedOptions()
    table.set_bloom_filter(10, False)
    if cache is not None:
        table.set_block_cache(cache)
    opts.set_block_based_table_factory(table)
    return opts


# -- 1. cold reads ------------------------------------------------------------------------
def bench_cold(args: argparse.Namespace, report: Report) -> None:
    rng = np.random.default_rng(args.seed)
    n, dim, batch = args.rows, args.dim, args.batch
    keys = random_keys(rng, n)
    values = values_like_trained(rng, n, dim)
    with (
        scratch_dir(args.tmpdir, "cold") as evdb_dir,
        scratch_dir(args.tmpdir, "raw") as raw_dir,
    ):
        db = evdb.open(evdb_dir, mmap_reads=args.mmap_reads)
        try:
            t = db.create_table(TABLE, dim=dim, dram_rows=args.cold_dram, disk=True)
            build = report.cold_build
            build["evdb fill"] = timed(lambda: fill(t, keys, values))
            build["evdb flush"] = timed(db.flush)
            if len(t) != n:  # 2^-64 odds per pair, but a duplicate would skew the figures
                raise SystemExit(f"random keys collided: {len(t)} rows for {n}; rerun --seed")
            build["evdb compact"] = timed(lambda: db.storage.compact_tables({TABLE}))
            on_disk = np.flatnonzero(~t.resident(keys))  # rows in SST files only
            if on_disk.shape[0] < batch:
                raise SystemExit(f"only {on_disk.shape[0]} rows are on disk only; raise --rows")
            log(f"  evdb: {fmt_count(n)} rows, {fmt_count(on_disk.shape[0])} on disk only")

            encoded = rocks.encode_keys(keys)
            records = packed_records(values, None, "float32")
            raw = raw_store(raw_dir / "db", args.mmap_reads, baseline_options)
            floor = raw_store(raw_dir / "floor", args.mmap_reads)
            try:
                t0 = time.perf_counter()
                raw_write(raw, encoded, records)
                build["raw write"] = time.perf_counter() - t0
                build["raw flush"] = timed(lambda: raw.flush(True))
                build["raw compact"] = timed(lambda: raw.compact_range(None, None))
                raw_write(floor, encoded, records)
                floor.flush(True)
                floor.compact_range(None, None)
                del records
                gc.collect()
                stores = ColdStores(
                    t,
                    raw,
                    floor,
                    evdb_dir / WORKING,
                    raw_dir / "db",
                    raw_dir / "floor",
                    keys,
                    values,
                    encoded,
                    on_disk,
                )
                for state in OS_CACHE_STATES:
                    report.cold.append(cold_state(state, stores, args, rng))
                    log(f"  cold reads, OS cache {state}: done")
            finally:
                raw.close()
                floor.close()
            db.drop_table(TABLE)
        finally:
            db.close()

        db = evdb.open(
            evdb_dir / "dram", mmap_reads=args.mmap_reads
        )  # the same rows, all in DRAM, for scale
        try:
            t = db.create_table(TABLE, dim=dim, disk=False)
            fill(t, keys, values)
            batches = [keys[rng.choice(n, batch, replace=False)] for _ in range(args.repeat + 1)]
            t.lookup(batches[0])
            times = [timed(lambda b=b: t.lookup(b)) for b in batches[1:]]  # type: ignore[misc]
            report.in_dram = batch / statistics.median(times)
            db.drop_table(TABLE)  # close() then has no rows to write
        finally:
            db.close()


def cold_state(
    state: str, s: ColdStores, args: argparse.Namespace, rng: np.random.Generator
) -> ColdResult:
    """Median keys/s of evdb's lookup and the raw multi-get in one OS page-cache state; the
    two sides alternate, on the same fresh keys each call, the first call untimed."""
    evdb_times, raw_times, floor_times, hits = [], [], [], 0
    # (evdb before issue 32 had no read options of its own: RocksDB's defaults)
    read_opt = getattr(rocks_store, "read_options", rocksdict.ReadOptions)()
    for i in range(args.repeat + 1):
        idx = s.on_disk[rng.choice(s.on_disk.shape[0], args.batch, replace=False)]
        batch_keys = s.keys[idx]
        query = [s.encoded[j] for j in idx.tolist()]

        prepare_os_cache(state, s.evdb_dir)
        before = s.table.stats()["tiers"]["dram"]["hits"]
        t0 = time.perf_counter()
        out = s.table.lookup(batch_keys)
        evdb_s = time.perf_counter() - t0
        after = s.table.stats()["tiers"]["dram"]["hits"]

        prepare_os_cache(state, s.raw_dir)
        t0 = time.perf_counter()
        got = s.raw.get(query)
        raw_s = time.perf_counter() - t0

        prepare_os_cache(state, s.floor_dir)
        t0 = time.perf_counter()
        s.floor.get(query, read_opt=read_opt)
        floor_s = time.perf_counter() - t0

        if i == 0:  # the warm-up call: check both sides read what was written
            if not np.array_equal(out, s.values[idx]):
                raise SystemExit("evdb lookup returned other values than were upserted")
            if any(g is None for g in got):
                raise SystemExit("the raw store lost keys")
            continue
        evdb_times.append(evdb_s)
        raw_times.append(raw_s)
        floor_times.append(floor_s)
        hits += after - before
    return ColdResult(
        state,
        args.batch / statistics.median(evdb_times),
        args.batch / statistics.median(raw_times),
        args.batch / statistics.median(floor_times),
        hits,
    )


# -- 2. spill-heavy training --------------------------------------------------------------
def zipf_batches(args: argparse.Namespace, rng: np.random.Generator) -> list[np.ndarray]:
    """Batches of keys: Zipf ranks truncated to 1..K by rejection, mapped through keymap."""
    k, size = args.zipf_keys, args.train_batch
    keymap = random_keys(rng, k)
    batches = []
    for _ in range(args.train_warmup + args.train_steps):
        ranks = np.empty(0, dtype=np.int64)
        while ranks.shape[0] < size:
            z = rng.zipf(args.zipf_a, size=size + size // 2)
            ranks = np.concatenate([ranks, z[z <= k]])
        batches.append(keymap[ranks[:size] - 1])
    return batches


def train_counters(t: evdb.Table) -> dict[str, int]:
    tiers = t.stats()["tiers"]
    dram, disk = tiers["dram"], tiers.get("rocksdb", {})
    return {
        "hits": dram["hits"],
        "misses": dram["misses"],
        "promotions": dram["promotions"],
        "written_back": dram["written_back"],
        "disk_found": disk.get("hits", 0),
        "disk_missed": disk.get("misses", 0),
        "disk_filtered": disk.get("filtered", 0),
    }


def train_run(
    name: str,
    dram_rows: int | None,
    disk: bool,
    batches: list[np.ndarray],
    grads: np.ndarray,
    args: argparse.Namespace,
    model_s: float = 0.0,
    prefetch: bool = False,
) -> tuple[TrainRun, list[int]]:
    with scratch_dir(args.tmpdir, "train") as path:
        db = evdb.open(path, mmap_reads=args.mmap_reads)
        try:
            t = db.create_table(
                TABLE,
                dim=args.train_dim,
                dram_rows=dram_rows,
                disk=disk,
                optimizer=evdb.optim.Adagrad(lr=TRAIN_LR),
            )
            times, uniques = [], []
            c0 = train_counters(t)
            for i, b in enumerate(batches):
                if i == args.train_warmup:
                    c0 = train_counters(t)
                t0 = time.perf_counter()
                p = t.pull(b)
                if prefetch and i + 1 < len(batches):
                    t.prefetch(batches[i + 1])
                if model_s:
                    time.sleep(model_s)  # the host waits for the accelerator's step
                t.push(p, grads[: p.keys.shape[0]])
                db.advance()
                times.append(time.perf_counter() - t0)
                uniques.append(p.keys.shape[0])
            c1 = train_counters(t)
            timed_steps = times[args.train_warmup :]
            run = TrainRun(
                name,
                dram_rows,
                args.train_batch * len(timed_steps) / sum(timed_steps),
                statistics.median(timed_steps),
                max(timed_steps),
                {c: c1[c] - c0[c] for c in c0},
                len(t),
            )
            db.drop_table(TABLE)  # close() then has no rows to write
        finally:
            db.close()
    return run, uniques[args.train_warmup :]


def bench_train(args: argparse.Namespace, report: Report) -> None:
    rng = np.random.default_rng(args.seed + 1)
    t0 = time.perf_counter()
    batches = zipf_batches(args, rng)
    grads = rng.standard_normal((args.train_batch, args.train_dim), dtype=np.float32)
    grads *= GRAD_STD
    log(f"  drew {len(batches)} Zipf batches in {time.perf_counter() - t0:.0f}s")
    dram_rows = max(1, round(args.dram_share * args.zipf_keys))
    model_s = args.model_ms / 1e3
    runs: list[tuple[str, int | None, bool, float, bool]] = [
        ("B: all in DRAM", None, False, 0.0, False),
        ("A: DRAM + disk", dram_rows, True, 0.0, False),
    ]
    if model_s:
        runs += [
            (f"C: A, host waits {args.model_ms:g} ms", dram_rows, True, model_s, False),
            ("D: C + prefetch", dram_rows, True, model_s, True),
        ]
    for name, rows, disk, wait, ahead in runs:
        t0 = time.perf_counter()
        run, uniques = train_run(name, rows, disk, batches, grads, args, wait, ahead)
        report.train.append(run)
        report.train_unique = statistics.median(uniques)
        log(f"  {name}: {fmt_rate(run.keys_per_s)} ({time.perf_counter() - t0:.0f}s)")
        malloc_trim()


# -- 3. write-back ------------------------------------------------------------------------
def bench_flush(args: argparse.Namespace, report: Report) -> None:
    rng = np.random.default_rng(args.seed + 2)
    n, dim = args.flush_rows, args.dim
    optimizer = evdb.optim.Adagrad(lr=TRAIN_LR)
    keys = random_keys(rng, n)
    values = values_like_trained(rng, n, dim)
    encoded = rocks.encode_keys(keys)
    records = packed_records(values, optimizer.initial_slots(n, dim), "float32")
    evdb_times, checkpoint_times, raw_times = [], [], []
    for i in range(args.flush_repeat + 1):
        with scratch_dir(args.tmpdir, "flush") as path:
            db = evdb.open(path, mmap_reads=args.mmap_reads)
            try:
                t = db.create_table(TABLE, dim=dim, optimizer=optimizer, disk=True)
                fill(t, keys, values)
                dirty = t.stats()["tiers"]["dram"]["dirty_rows"]
                if dirty != n:
                    raise SystemExit(f"{dirty} dirty rows in DRAM, expected {n}")
                store = db.storage.store
                checkpoint = store.checkpoint
                spent = []

                def timed_checkpoint(
                    dest: Path, checkpoint: Any = checkpoint, spent: list[float] = spent
                ) -> None:
                    spent.append(timed(lambda: checkpoint(dest)))

                store.checkpoint = timed_checkpoint  # type: ignore[method-assign]
                os.sync()
                evdb_s = timed(db.flush)
                store.checkpoint = checkpoint  # type: ignore[method-assign]
                if t.stats()["tiers"]["rocksdb"]["rows"] != n:
                    raise SystemExit("the flush did not write every row")
                db.drop_table(TABLE)
            finally:
                db.close()
        with scratch_dir(args.tmpdir, "raw") as path:
            raw = raw_store(path / "db", args.mmap_reads)
            try:
                os.sync()
                t0 = time.perf_counter()
                raw_write(raw, encoded, records)
                raw.flush(True)
                raw_s = time.perf_counter() - t0
            finally:
                raw.close()
        if i:  # the first round is the warm-up
            evdb_times.append(evdb_s)
            checkpoint_times.append(spent[0])
            raw_times.append(raw_s)
        log(f"  flush round {i}: evdb {evdb_s:.2f}s, raw {raw_s:.2f}s")
    report.flush = FlushResult(
        statistics.median(evdb_times),
        statistics.median(checkpoint_times),
        statistics.median(raw_times),
    )


# -- 4. compression -----------------------------------------------------------------------
def bench_compress(args: argparse.Namespace, report: Report) -> None:
    rng = np.random.default_rng(args.seed + 3)
    n, dim = args.compress_rows, args.dim
    keys = random_keys(rng, n)
    values = values_like_trained(rng, n, dim)
    batch = min(args.batch, n)
    for dtype, compression in COMPRESS_CONFIGS:
        disk = DiskConfig(dtype=dtype, compression=compression)  # type: ignore[arg-type]
        with scratch_dir(args.tmpdir, "compress") as path:
            db = evdb.open(path, mmap_reads=args.mmap_reads)
            try:
                t = db.create_table(TABLE, dim=dim, disk=disk)
                fill(t, keys, values)
                os.sync()
                flush_s = timed(db.flush)
                disk_bytes = t.stats()["tiers"]["rocksdb"]["bytes"]
            finally:
                db.close()
            db = evdb.open(
                path, mmap_reads=args.mmap_reads
            )  # reopened: the rows are on disk only, DRAM is empty
            try:
                t = db.table(TABLE)
                compact_s = timed(lambda db=db: db.storage.compact_tables({TABLE}))
                working = path / WORKING
                times = []
                for i in range(args.repeat + 1):
                    batch_keys = keys[rng.choice(n, batch, replace=False)]
                    cache_files(working)
                    s = timed(lambda b=batch_keys, t=t: t.lookup(b))
                    if i:
                        times.append(s)
                db.drop_table(TABLE)
            finally:
                db.close()
        report.compress.append(
            CompressResult(
                dtype,
                compression,
                rocks.disk_dtype(dim, 0, dtype).itemsize,  # type: ignore[arg-type]
                disk_bytes / n,
                flush_s,
                compact_s,
                batch / statistics.median(times),
            )
        )
        log(f"  compression {dtype}/{compression}: done")


# -- output -------------------------------------------------------------------------------
def print_header(args: argparse.Namespace) -> None:
    record = rocks.disk_dtype(args.dim, 0, "float32").itemsize
    record_adagrad = rocks.disk_dtype(args.dim, args.dim, "float32").itemsize
    dram_rows = max(1, round(args.dram_share * args.zipf_keys))
    store = args.tmpdir or tempfile.gettempdir()
    lines = [
        "evdb tiered-storage benchmark (bench/bench_tiers.py)",
        cpu_line(),
        f"threads     numba {numba.get_num_threads()}",
        versions_line("not used"),
        f"rocksdb     rocksdict {importlib.metadata.version('rocksdict')}; evdb's options: "
        f"16 MiB memtables x 2, bloom 10 bits/key, {rocks_store.BLOCK_CACHE_BYTES >> 20} MiB block "
        "cache, WAL off" + (", mmap reads" if args.mmap_reads else ""),
        f"store       {store} ({fs_of(store)})",
        f"cold reads  {fmt_count(args.rows)} rows, dim {args.dim}, SGD (record {record} B), "
        f"DRAM {fmt_count(args.cold_dram)} rows, compression {DiskConfig().compression}; "
        f"lookup of {fmt_count(args.batch)} "
        "distinct keys on disk only, fresh per call; both stores fully compacted",
        f"training    Zipf a={args.zipf_a} over {fmt_count(args.zipf_keys)} keys (truncated "
        f"by rejection, scattered), {fmt_count(args.train_batch)} keys/step, dim "
        f"{args.train_dim}, Adagrad lr {TRAIN_LR}; A: dram_rows {fmt_count(dram_rows)} "
        f"({args.dram_share:.0%}) + disk, B: all in DRAM; {args.train_warmup} warm-up + "
        f"{args.train_steps} timed steps",
        f"write-back  {fmt_count(args.flush_rows)} dirty rows, dim {args.dim}, Adagrad "
        f"(record {record_adagrad} B): db.flush() vs raw write batches + Rdict.flush()",
        f"compression {fmt_count(args.compress_rows)} rows, dim {args.dim}, SGD, values "
        f"normal(0, {VALUE_STD})",
        f"timing      median of {args.repeat} calls (write-back: {args.flush_repeat}) after 1 "
        "warm-up, sides alternating; training: total time of the timed steps",
        "units       rows or keys/s (M = 1e6, K = 1e3); ratios are evdb / baseline (above 1x: "
        "evdb faster)",
    ]
    print("\n".join(lines))


def print_report(report: Report, args: argparse.Namespace) -> None:
    """The tables of the sections that ran."""
    if report.cold:
        print_cold(report, args)
    if report.train:
        print_train(report, args)
    if report.flush is not None:
        print_flush(report, args)
    if report.compress:
        print_compress(report, args)


def print_cold(report: Report, args: argparse.Namespace) -> None:
    b = report.cold_build
    print(
        f"\n1. cold reads: lookup of {fmt_count(args.batch)} distinct keys whose rows are on "
        f"disk only ({fmt_count(args.rows)} rows)"
    )
    rows = []
    for r in report.cold:
        ratio = r.evdb / r.raw
        verdict = "ok" if ratio >= COLD_AIM else "BELOW"
        rows.append(
            [
                r.state,
                fmt_rate(r.evdb, 2),
                fmt_rate(r.raw, 2),
                fmt_ratio(ratio),
                verdict,
                fmt_count(r.dram_hits),
            ]
        )
    rows.append(["in DRAM", fmt_rate(report.in_dram), "-", "-", "", "-"])
    header = ["OS cache", "evdb", "raw get", "evdb/raw", f"aim {COLD_AIM}x", "DRAM hits"]
    print_table(header, rows, first_left=1)
    for r in report.cold:  # (a line of its own: ab.py pairs the table above across versions)
        print(
            f"floor, OS cache {r.state}: bare multi-get with evdb's options and read options "
            f"{fmt_rate(r.floor, 2)}, evdb / floor {fmt_ratio(r.evdb / r.floor)}"
        )
    cached = next((r for r in report.cold if r.state == "cached"), None)
    if cached is not None:
        print(
            f"(in DRAM: disk=False, same rows and batch size; cached disk read / in DRAM = "
            f"{cached.evdb / report.in_dram:.3f}x)"
        )
    print(
        "(raw get: a bare multi-get on a store opened with evdb's options of git 0dffac6, "
        "a baseline that stays the same across versions; the floor: a bare multi-get on a "
        "store opened with evdb's options of this version, with the tier's read options)"
    )
    print(
        f"(build: evdb upsert {b['evdb fill']:.1f}s, flush {b['evdb flush']:.1f}s, compact "
        f"{b['evdb compact']:.1f}s; raw write {b['raw write']:.1f}s, flush "
        f"{b['raw flush']:.1f}s, compact {b['raw compact']:.1f}s)"
    )


def print_train(report: Report, args: argparse.Namespace) -> None:
    print(
        f"\n2. spill-heavy training: Zipf a={args.zipf_a} over {fmt_count(args.zipf_keys)} "
        f"keys, {fmt_count(args.train_batch)} keys/step (median "
        f"{fmt_count(report.train_unique)} distinct), per timed step"
    )
    header = [
        "run",
        "dram_rows",
        "keys/s",
        "median ms",
        "max ms",
        "DRAM hits",
        "promoted",
        "written back",
        "disk found",
        "disk missed",
        "of which filtered",
        "rows at end",
    ]
    rows = []
    for r in report.train:
        d, steps = r.deltas, args.train_steps
        reads = d["hits"] + d["misses"]
        rows.append(
            [
                r.name,
                "all" if r.dram_rows is None else fmt_count(r.dram_rows),
                fmt_rate(r.keys_per_s, 2),
                f"{r.median_step * 1e3:.1f}",
                f"{r.max_step * 1e3:.0f}",
                f"{d['hits'] / max(reads, 1):.1%}",
                fmt_count(d["promotions"] / steps),
                fmt_count(d["written_back"] / steps),
                fmt_count(d["disk_found"] / steps),
                fmt_count(d["disk_missed"] / steps),
                fmt_count(d["disk_filtered"] / steps),
                fmt_count(r.rows_at_end),
            ]
        )
    print_table(header, rows, first_left=1)
    runs = {r.name[0]: r for r in report.train}
    if "A" in runs and "B" in runs:
        a, b_ = runs["A"], runs["B"]
        print(
            f"A / B: {fmt_ratio(a.keys_per_s / b_.keys_per_s)} in keys/s (total time), "
            f"{fmt_ratio(b_.median_step / a.median_step)} by median step\nA over the "
            f"{fmt_count(args.train_steps)} timed steps: {fmt_count(a.deltas['promotions'])} "
            f"promotions, {fmt_count(a.deltas['written_back'])} rows written back"
        )
    if "C" in runs and "D" in runs:
        c, d_ = runs["C"], runs["D"]
        print(
            f"D / C: {fmt_ratio(d_.keys_per_s / c.keys_per_s)} in keys/s, median step "
            f"{c.median_step * 1e3:.1f} -> {d_.median_step * 1e3:.1f} ms: reading each next "
            f"batch's rows during the host's {args.model_ms:g} ms wait (Table.prefetch)"
        )
    print(
        "(DRAM hits: share of a step's distinct keys found in DRAM; B's misses are keys seen "
        "for the\n first time. disk found / missed: DRAM misses looked up on disk; a miss is a "
        "new key,\n and 'filtered' misses were ruled out by the in-memory key filter: no "
        "RocksDB read)"
    )


def print_flush(report: Report, args: argparse.Namespace) -> None:
    f = report.flush
    if f is not None:
        n = args.flush_rows
        print(f"\n3. write-back: {fmt_count(n)} dirty rows to SST files")
        rows = [
            [
                "evdb db.flush()",
                fmt_rate(n / f.evdb, 2),
                f"{f.evdb:.2f}",
                f"{f.evdb_checkpoint:.2f}",
            ],
            ["raw batches + flush", fmt_rate(n / f.raw, 2), f"{f.raw:.2f}", "-"],
            ["evdb / raw", fmt_ratio(f.raw / f.evdb), "", ""],
        ]
        print_table(["side", "rows/s", "s", "checkpoint s"], rows, first_left=1)


def print_compress(report: Report, args: argparse.Namespace) -> None:
    print(
        f"\n4. compression: {fmt_count(args.compress_rows)} rows, dim {args.dim}, SGD, values "
        f"normal(0, {VALUE_STD})"
    )
    base = next(
        (c for c in report.compress if (c.dtype, c.compression) == ("float32", "none")), None
    )
    rows = []
    for c in report.compress:
        rows.append(
            [
                c.dtype,
                c.compression,
                str(c.record_bytes),
                f"{c.disk_bytes_per_row:.1f}",
                fmt_ratio(c.disk_bytes_per_row / base.disk_bytes_per_row) if base else "-",
                fmt_rate(args.compress_rows / c.flush_s, 2),
                f"{c.compact_s:.2f}",
                fmt_rate(c.lookup, 2),
                fmt_ratio(c.lookup / base.lookup) if base else "-",
            ]
        )
    header = [
        "dtype",
        "compression",
        "record B",
        "disk B/row",
        "vs none",
        "flush rows/s",
        "compact s",
        "cold lookup",
        "vs none",
    ]
    print_table(header, rows, first_left=2)
    print(
        "(disk B/row: stats()['tiers']['rocksdb']['bytes'] / rows after the flush: SST files "
        "with keys,\n index and bloom filter; cold lookup: OS cache 'cached', after reopening)"
    )


# -- main ---------------------------------------------------------------------------------
def add_train_args(p: argparse.ArgumentParser) -> None:
    """The training section's workload (``profile_spill.py`` reruns it with the same)."""
    p.add_argument("--zipf-keys", type=int, default=10_000_000, help="distinct training keys")
    p.add_argument("--zipf-a", type=float, default=1.1)
    p.add_argument("--train-batch", type=int, default=16_384, help="keys per training step")
    p.add_argument("--train-dim", type=int, default=64)
    p.add_argument("--dram-share", type=float, default=0.05, help="run A's DRAM share of K")
    p.add_argument("--train-warmup", type=int, default=500, help="untimed steps")
    p.add_argument("--train-steps", type=int, default=1000, help="timed steps")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000, help="cold-read table rows")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--batch", type=int, default=65_536, help="keys per cold lookup")
    p.add_argument("--cold-dram", type=int, default=1000, help="DRAM rows of the cold table")
    p.add_argument("--repeat", type=int, default=5, help="timed calls per figure (median)")
    add_train_args(p)
    p.add_argument(
        "--model-ms",
        type=float,
        default=3.0,
        help="runs C and D: ms a step sleeps between pull and push, standing for an "
        "accelerator's forward and backward while the host waits (0: no C and D)",
    )
    p.add_argument("--flush-rows", type=int, default=1_000_000, help="dirty rows flushed")
    p.add_argument("--flush-repeat", type=int, default=3, help="timed flushes (median)")
    p.add_argument("--compress-rows", type=int, default=200_000)
    p.add_argument("--tmpdir", default=None, help="where the stores live (the disk measured)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--mmap-reads",
        action="store_true",
        help="open every store with evdb.open(mmap_reads=True) (the raw ones with the same "
        "options); the 'dropped' cold reads then stay cached, mapped pages are not dropped",
    )
    p.add_argument("--quick", action="store_true", help="smoke run: small sizes, seconds")
    p.add_argument(
        "--only",
        default="cold,train,flush,compress",
        help="comma-separated sections to run (cold, train, flush, compress); all by default",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.batch, args.repeat = 50_000, 8192, 3
        args.zipf_keys, args.train_warmup, args.train_steps = 200_000, 20, 40
        args.flush_rows, args.flush_repeat, args.compress_rows = 50_000, 1, 20_000
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print_header(args)
    sys.stdout.flush()
    report = Report()
    only = set(args.only.split(","))
    for key, name, fn in (
        ("cold", "cold reads", bench_cold),
        ("train", "spill-heavy training", bench_train),
        ("flush", "write-back", bench_flush),
        ("compress", "compression", bench_compress),
    ):
        if key not in only:
            continue
        log(f"[{name}]")
        t0 = time.perf_counter()
        fn(args, report)
        gc.collect()
        malloc_trim()
        log(f"  {time.perf_counter() - t0:.0f}s")
    print_report(report, args)
    print(f"\n{wall_line()}")


if __name__ == "__main__":
    main()
