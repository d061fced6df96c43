"""RocksDB options against a spill-like load on a bare rocksdict database (issue 32).

Not a benchmark of evdb: it measures what each of the anchor's options (FBGEMM's
EmbeddingRocksDB) would change under evdb's RocksDB tier, before evdb adopts it. Each step
writes the distinct keys of 1,600 Zipf(1.1) draws over 3M keys as 532-byte records (Adagrad
at dim 64, as ``profile_spill``'s write-backs) in one write batch without WAL, then reads 400
keys already written in one sorted multi-get (its promotions). Over the last two thirds of
the steps it prints the calling thread's CPU per key read and RocksDB's background threads'
CPU per step (``/proc/self/task``). Configurations run one after another in the same
process, ``--reps`` rounds in turn.

Configuration flags (comma-separated, any order): ``nover`` reads without block checksum
verification (what evdb does now), ``univ`` universal compaction, ``hits``
``optimize_filters_for_hits``, ``bs1k``/``bs2k`` 1/2 KiB blocks (4 KiB otherwise), ``dbhash``
data-block hash index, ``l0_4`` level-0 compaction trigger 4 (8 otherwise), ``wb28`` 28 MiB
memtables and an 8 MiB block cache (the same 64 MiB budget as evdb's 2 x 16 + 32), ``wb64``
64 MiB memtables, ``mmap`` memory-mapped reads. The empty configuration is evdb's options.

    .venv/bin/python bench/probe_rocks_options.py --steps 900 --reps 2 nover nover,univ,wb64
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import tempfile
import time

import numpy as np
import rocksdict

from evdb.tiers.rocks import encode_keys

RECORD = 532


def rocksdb_threads_cpu() -> float:
    """CPU seconds so far of this process's RocksDB background threads."""
    total = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if not f.read().startswith("rocksdb"):
                    continue
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def options(cfg: set[str]) -> rocksdict.Options:
    opts = rocksdict.Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.set_allow_mmap_reads("mmap" in cfg)
    opts.set_compression_type(rocksdict.DBCompressionType.none())
    memtable = 64 if "wb64" in cfg else 28 if "wb28" in cfg else 16
    opts.set_write_buffer_size(memtable << 20)
    opts.set_max_write_buffer_number(2)
    opts.set_max_background_jobs(2)
    opts.set_level_zero_file_num_compaction_trigger(4 if "l0_4" in cfg else 8)
    if "univ" in cfg:
        opts.set_compaction_style(rocksdict.DBCompactionStyle.universal())
    if "hits" in cfg:
        opts.set_optimize_filters_for_hits(True)
    table = rocksdict.BlockBasedOptions()
    table.set_bloom_filter(10, False)
    table.set_block_cache(rocksdict.Cache((8 if "wb28" in cfg else 32) << 20))
    if "bs1k" in cfg or "bs2k" in cfg:
        table.set_block_size(1024 if "bs1k" in cfg else 2048)
    if "dbhash" in cfg:
        table.set_data_block_index_type(rocksdict.DataBlockIndexType.binary_and_hash())
    opts.set_block_based_table_factory(table)
    return opts


def run(name: str, steps: int, parent: str | None) -> None:
    cfg = set(name.split(",")) - {""}
    path = tempfile.mkdtemp(prefix="evdb-probe-options-", dir=parent)
    db = rocksdict.Rdict(path, options(cfg))
    try:
        read = rocksdict.ReadOptions()
        if "nover" in cfg:
            read.set_verify_checksums(False)
        write = rocksdict.WriteOptions()
        setattr(write, "disable_wal", True)  # noqa: B010 (a property)
        rng = np.random.default_rng(0)
        values = rng.integers(0, 255, (4096, RECORD), dtype=np.uint8).view(f"V{RECORD}")
        pool = values.ravel().tolist()
        written = np.zeros(0, np.int64)
        read_ns = n_read = 0
        background0 = 0.0
        for step in range(steps):
            if step == steps // 3:
                background0, read_ns, n_read = rocksdb_threads_cpu(), 0, 0
            draws = rng.zipf(1.1, 1600) % 3_000_000
            keys = np.unique(draws.astype(np.int64) * 2654435761 % (1 << 62))
            batch = rocksdict.WriteBatch(raw_mode=True)
            collections.deque(map(batch.put, encode_keys(keys), pool[: keys.shape[0]]), maxlen=0)
            db.write(batch, write)
            written = np.concatenate([written, keys])
            asked = encode_keys(np.unique(written[rng.integers(0, written.shape[0], 400)]))
            t0 = time.thread_time_ns()
            db.get(asked, read_opt=read)
            read_ns += time.thread_time_ns() - t0
            n_read += len(asked)
        background = rocksdb_threads_cpu() - background0
        timed = steps - steps // 3
        sst = (db.property_int_value("rocksdb.total-sst-files-size") or 0) >> 20
        print(
            f"{name or '(evdb)':24s} read {read_ns / n_read / 1e3:5.2f} us/key   RocksDB "
            f"background {background / timed * 1e3:5.2f} ms/step   SST {sst} MiB",
            flush=True,
        )
    finally:
        db.close()
        shutil.rmtree(path, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("configs", nargs="+", help="comma-separated flags; '' for evdb's options")
    p.add_argument("--steps", type=int, default=900)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--tmpdir", default=None)
    args = p.parse_args()
    for _ in range(args.reps):
        for name in args.configs:
            run(name, args.steps, args.tmpdir)


if __name__ == "__main__":
    main()
