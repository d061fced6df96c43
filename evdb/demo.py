"""The main job on an embedded default: ``python -m evdb.demo [PATH]`` (``make run``).

Streams a synthetic Zipf(1.1) key stream (a skewed item-id space, as recommender traffic is)
through a table with counter admission and a TTL, trains it with SGD against a toy target, and
prints what admission, TTL and compaction did, plus a few lookups. Needs no file outside the
repository; the database goes to PATH (default: a fresh temporary directory).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import numpy as np

import evdb


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m evdb.demo", description=__doc__)
    parser.add_argument("path", nargs="?", help="database directory (default: a temp dir)")
    parser.add_argument("--steps", type=int, default=200, help="training steps")
    parser.add_argument("--batch", type=int, default=8192, help="keys per step")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    path = args.path or tempfile.mkdtemp(prefix="evdb-demo-")
    rng = np.random.default_rng(args.seed)

    t0 = time.perf_counter()
    with evdb.open(path) as db:
        table = db.create_table(
            "item",
            dim=16,
            initializer=evdb.init.Normal(mean=0.0, std=0.01, seed=args.seed),
            admission=evdb.admission.Counter(min_count=3),
            optimizer=evdb.optim.SGD(lr=0.1),
            ttl_steps=50,
            l2_threshold=1e-3,
        )
        target = np.full(16, 0.5, dtype=np.float32)  # toy objective: pull every row toward 0.5
        for _ in range(args.steps):
            keys = rng.zipf(1.1, size=args.batch).astype(np.int64)
            pulled = table.pull(keys)
            table.push(pulled, pulled.rows - target)  # grad of 0.5 * ||row - target||^2
            db.advance()
        trained_rows = len(table)
        compacted = table.compact()
        hot = np.array([1, 2, 3, 10**9], dtype=np.int64)
        looked_up = table.lookup(hot)
        stats = table.stats()
        elapsed = time.perf_counter() - t0

    print(f"evdb demo: {args.steps} steps x {args.batch} Zipf(1.1) keys into {path}")
    print(f"  live rows after training: {trained_rows}; compact() removed {compacted}")
    print(f"  keys never admitted (pull occurrences): {stats['admission']['not_admitted']}")
    print(f"  pending admission counts: {stats['admission']['pending']}")
    for key, row in zip(hot.tolist(), looked_up, strict=True):
        print(f"  lookup({key}) -> mean {row.mean():+.4f} (hot keys train toward +0.5)")
    print("  stats:", json.dumps(stats["tiers"]["dram"], default=float))
    print(f"  done in {elapsed:.2f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
