"""Training steps of a bfloat16 / float16 table against its float32 twin, in one process
(issue 29).

Each table is in DRAM only (``disk=False``), or with ``--dram-fraction f`` a DRAM tier of
``f * rows`` rows over the RocksDB tier (the rest spilled, values on disk in the table's
dtype); ``--rows`` rows of dim ``--dim`` upserted with
the same random values, the same optimizer (``--optimizer``: Adagrad or row-wise Adagrad,
lr 0.01). A step is ``pull``, ``combine`` (sum over bags of ``--bag`` keys),
``combine_backward``, ``push`` and ``db.advance()``, on Zipf(``--zipf-a``) keys of the table,
``--examples`` bags a batch; each table gets the same batches. The tables take turns step by
step (a stall of the machine hits all alike); each figure is the median of ``--repeat``
steps after ``--warmup``, and each half-precision table's is printed over float32's ("f32"),
with the pull and push phases on their own. Run: ``.venv/bin/python bench/bench_lowp_train.py``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any

import numpy as np
from _common import cpu_line, print_table, random_keys

import evdb

DTYPES = ("float32", "bfloat16", "float16")


def step(
    db: evdb.Database, t: evdb.Table, keys: np.ndarray, offsets: np.ndarray, grad: np.ndarray
) -> tuple[float, float, float]:
    """(step, pull, push) seconds of one training step."""
    c0 = time.perf_counter()
    p = t.pull(keys)
    c1 = time.perf_counter()
    p.combine(offsets, combiner="sum")
    g = p.combine_backward(grad, offsets, combiner="sum")
    c2 = time.perf_counter()
    t.push(p, g)
    c3 = time.perf_counter()
    db.advance()
    c4 = time.perf_counter()
    return c4 - c0, c1 - c0, c3 - c2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--examples", type=int, default=8192, help="bags a batch")
    ap.add_argument("--bag", type=int, default=8, help="keys a bag")
    ap.add_argument("--zipf-a", type=float, default=1.05)
    ap.add_argument("--optimizer", choices=["adagrad", "rowwise"], default="rowwise")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--dram-fraction", type=float, default=None, help="spill: DRAM rows / rows")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    spill = None if args.dram_fraction is None else max(1, int(args.rows * args.dram_fraction))
    where: dict[str, Any] = {"disk": False} if spill is None else {"dram_rows": spill}
    opt = {"adagrad": evdb.optim.Adagrad, "rowwise": evdb.optim.RowWiseAdagrad}[args.optimizer]
    keys = random_keys(rng, args.rows)
    perm = rng.permutation(args.rows)
    steps = args.warmup + args.repeat
    n = args.examples * args.bag
    batches = [keys[perm[(rng.zipf(args.zipf_a, n) - 1) % args.rows]] for _ in range(steps)]
    offsets = np.arange(args.examples, dtype=np.int64) * args.bag
    grad = rng.standard_normal((args.examples, args.dim), dtype=np.float32)
    print(
        f"bench_lowp_train: {args.rows:,} rows, dim {args.dim}, {args.optimizer}, "
        f"{args.examples} bags of {args.bag} Zipf({args.zipf_a}) keys, "
        + ("DRAM only" if spill is None else f"DRAM {spill:,} rows over RocksDB")
    )
    print(cpu_line())
    with tempfile.TemporaryDirectory() as tmp, evdb.open(f"{tmp}/db") as db:
        tables = {}
        for dtype in DTYPES:
            t = db.create_table(dtype, args.dim, dtype=dtype, optimizer=opt(lr=0.01), **where)
            values = np.random.default_rng(1)
            for start in range(0, args.rows, 65_536):
                part = keys[start : start + 65_536]
                t.upsert(part, values.standard_normal((part.shape[0], args.dim), np.float32))
            tables[dtype] = t
        times: dict[str, list[tuple[float, float, float]]] = {d: [] for d in DTYPES}
        for i in range(steps):
            for dtype, t in tables.items():
                s = step(db, t, batches[i], offsets, grad)
                if i >= args.warmup:
                    times[dtype].append(s)
        med = {d: [statistics.median(x[j] for x in times[d]) for j in range(3)] for d in DTYPES}
        base = med["float32"]
        print_table(
            ["rows of", "step ms", "pull ms", "push ms", "step / f32", "pull / f32", "push / f32"],
            [
                [
                    d,
                    f"{m[0] * 1e3:.2f}",
                    f"{m[1] * 1e3:.2f}",
                    f"{m[2] * 1e3:.2f}",
                    f"{m[0] / base[0]:.3f}x",
                    f"{m[1] / base[1]:.3f}x",
                    f"{m[2] / base[2]:.3f}x",
                ]
                for d, m in med.items()
            ],
            first_left=1,
        )


if __name__ == "__main__":
    main()
