"""RocksDB options against a spill-like load on a bare rocksdict database (issue 32).

Not a benchmark of evdb: it measures what each of the anchor's options (FBGEMM's
EmbeddingRocksDB) would change under evdb's RocksDB tier, before evdb adopts it. Each step
writes the distinct keys of 1,600 Zipf(1.1) draws over 3M keys as 532-byte records (Adagrad
at dim 64, as ``profile_spill``'s write-backs) in one write batch without WAL, then reads 400
keys already written in one sorted multi-get (its promotions). Over the last two thirds of
the steps it prints the calling thread's CPU per key read and per step written, RocksDB's
background threads' CPU per step and their sum (``/proc/self/task``). Configurations run one
after another in the same process, ``--reps`` rounds in turn.

Configurations are the flags of ``bench/_rocks_configs.py`` (comma-separated, any order:
``wb28,cache8`` is 28 MiB memtables and an 8 MiB block cache); the empty configuration is
evdb's options.

    .venv/bin/python bench/probe_rocks_options.py --steps 900 --reps 2 '' mtbloom univ,wb64
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import tempfile
import time

import _rocks_configs
import numpy as np
import rocksdict

from evdb.tiers import store_options
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
    """evdb's options (one column family, no compression) changed as cfg says."""
    cache = _rocks_configs.cache_for(cfg, store_options.BLOCK_CACHE_BYTES)
    return _rocks_configs.configure(store_options.rocks_options("none", None), cfg, cache)


def run(name: str, steps: int, parent: str | None) -> None:
    cfg = _rocks_configs.parse(name)
    path = tempfile.mkdtemp(prefix="evdb-probe-options-", dir=parent)
    db = rocksdict.Rdict(path, options(cfg))
    try:
        read = _rocks_configs.read_options(cfg)
        write = rocksdict.WriteOptions()
        setattr(write, "disable_wal", True)  # noqa: B010 (a property)
        rng = np.random.default_rng(0)
        values = rng.integers(0, 255, (4096, RECORD), dtype=np.uint8).view(f"V{RECORD}")
        pool = values.ravel().tolist()
        written = np.zeros(0, np.int64)
        read_ns = n_read = write_ns = 0
        background0 = 0.0
        for step in range(steps):
            if step == steps // 3:
                background0, read_ns, n_read, write_ns = rocksdb_threads_cpu(), 0, 0, 0
            draws = rng.zipf(1.1, 1600) % 3_000_000
            keys = np.unique(draws.astype(np.int64) * 2654435761 % (1 << 62))
            encoded = encode_keys(keys)
            t0 = time.thread_time_ns()
            batch = rocksdict.WriteBatch(raw_mode=True)
            collections.deque(map(batch.put, encoded, pool[: keys.shape[0]]), maxlen=0)
            db.write(batch, write)
            write_ns += time.thread_time_ns() - t0
            written = np.concatenate([written, keys])
            asked = encode_keys(np.unique(written[rng.integers(0, written.shape[0], 400)]))
            t0 = time.thread_time_ns()
            db.get(asked, read_opt=read)
            read_ns += time.thread_time_ns() - t0
            n_read += len(asked)
        background = rocksdb_threads_cpu() - background0
        timed = steps - steps // 3
        sst = (db.property_int_value("rocksdb.total-sst-files-size") or 0) >> 20
        total = (read_ns + write_ns) / 1e6 / timed + background / timed * 1e3
        print(
            f"{name or '(evdb)':24s} read {read_ns / n_read / 1e3:5.2f} us/key   write "
            f"{write_ns / 1e6 / timed:5.2f} ms/step   background {background / timed * 1e3:5.2f} "
            f"ms/step   all {total:5.2f} ms/step   SST {sst} MiB",
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
