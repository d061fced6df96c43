"""The main job on an embedded default: ``python -m evdb.demo [PATH]`` (``make run``).

Streams a synthetic Zipf(1.1) key stream (a skewed item-id space, as recommender traffic is)
through a table with counter admission and a TTL, whose DRAM tier holds only 4,096 rows (the
rest spill to RocksDB and come back when pulled), in bags of 4 keys per example: each step
pulls the batch, combines each bag (mean), takes the gradient of a toy loss that pulls every
bag toward a target vector, turns it into per-key gradients and pushes them through the fused
Adagrad update. It prints what admission, TTL, compaction and the tiers did, plus a few
lookups. Needs no file outside the repository; the database goes to PATH (default: a fresh
temporary directory).
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
            optimizer=evdb.optim.Adagrad(lr=0.1),
            ttl_steps=50,
            l2_threshold=1e-3,
            dram_rows=4096,  # the hot set; everything else lives on disk
        )
        target = np.full(16, 0.5, dtype=np.float32)  # toy objective: every bag's mean -> 0.5
        offsets = np.arange(0, args.batch, 4)  # bags of 4 keys
        losses = []
        for _ in range(args.steps):
            keys = rng.zipf(1.1, size=args.batch).astype(np.int64)
            pulled = table.pull(keys)
            bags = pulled.combine(offsets, combiner="mean")
            grad_bags = bags - target  # d/d bags of 0.5 * ||bags - target||^2
            losses.append(float(0.5 * (grad_bags**2).sum(axis=1).mean()))
            table.push(pulled, pulled.combine_backward(grad_bags, offsets, combiner="mean"))
            db.advance()
        trained_rows = len(table)
        compacted = table.compact()
        hot = np.array([1, 2, 3, 10**9], dtype=np.int64)
        looked_up = table.lookup(hot)
        fresh = rng.zipf(1.1, size=args.batch).astype(np.int64)
        served = table.lookup(fresh, offsets, combiner="mean")  # inference on unseen traffic
        stats = table.stats()
        elapsed = time.perf_counter() - t0

    print(f"evdb demo: {args.steps} steps x {args.batch} Zipf(1.1) keys in bags of 4 into {path}")
    print(f"  live rows after training: {trained_rows}; compact() removed {compacted}")
    print(f"  keys never admitted (pull occurrences): {stats['admission']['not_admitted']}")
    print(f"  pending admission counts: {stats['admission']['pending']}")
    print(
        f"  training loss (0.5 |bag mean - 0.5|^2): {losses[0]:.4f} at step 0 -> "
        f"{np.mean(losses[-10:]):.4f} over the last 10 steps"
    )
    served_loss = 0.5 * ((served - target) ** 2).sum(axis=1).mean()
    print(f"  lookup of a fresh batch of bags: loss {served_loss:.4f}, mean {served.mean():+.3f}")
    for key, row in zip(hot.tolist(), looked_up, strict=True):
        print(f"  lookup({key}) -> mean {row.mean():+.4f}")
    shown = ("rows", "dirty_rows", "hits", "misses", "promotions", "written_back", "bytes")
    for name, tier in stats["tiers"].items():
        print(f"  {name} tier:", json.dumps({k: tier[k] for k in shown}))
    print(f"  done in {elapsed:.2f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
