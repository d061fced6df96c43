"""The fixed cost of one call: small ``lookup``, ``contains`` and ``pull`` + ``push`` calls,
as ratios against a numpy gather of the same rows measured alongside.

Every call pays the same fixed work whatever its size (argument checks, the database's
readers-writer lock since calls may come from several threads, the kernel dispatch), and at
1 to 64 keys that work is most of the call. Run it at two commits (each with its own
``PYTHONPATH``) to see what a change to the fixed work costs.

Setup: one table of ``--rows`` rows (dim 16, SGD, all in DRAM). For each batch size the same
pre-drawn batches of existing keys go to every call:

* ``lookup``: ``Table.lookup(keys)``;
* ``contains``: ``Table.contains(keys)``;
* ``pull+push``: ``Table.pull(keys)`` then ``Table.push(pulled, grads)`` (zero gradients:
  the rows keep their values), one training step of one table;
* ``gather``: ``numpy.take(values, idx, axis=0)`` with the row indices already known, the
  floor of a lookup, and the baseline of every ratio.

Each figure is the median over ``--rounds`` rounds of the mean time of ``--calls`` calls,
the four taking turns within each round. Run from the repository root:
``.venv/bin/python bench/bench_calls.py`` (about 20 s).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from _common import cpu_line, print_table, versions_line, wall_line

import evdb

DIM = 16


def mean_call_s(fn: Callable[[np.ndarray], Any], batches: list[np.ndarray]) -> float:
    t0 = time.perf_counter()
    for b in batches:
        fn(b)
    return (time.perf_counter() - t0) / len(batches)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 64, 1024])
    p.add_argument("--calls", type=int, default=2000, help="calls per round and figure")
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    print("bench_calls: the fixed cost of small calls, against a numpy gather")
    print(cpu_line())
    print(versions_line("-"))
    rng = np.random.default_rng(0)
    keys = rng.choice(np.iinfo(np.int64).max, args.rows, replace=False).astype(np.int64)
    values = rng.standard_normal((args.rows, DIM)).astype(np.float32)
    with tempfile.TemporaryDirectory(prefix="evdb-calls-") as path:
        db = evdb.open(path)
        t = db.create_table("t", dim=DIM, disk=False, optimizer=evdb.optim.SGD(lr=0.01))
        t.upsert(keys, values)
        rows = []
        for size in args.sizes:
            idx = [rng.integers(0, args.rows, size) for _ in range(args.calls)]
            batches = [keys[i] for i in idx]
            zeros = np.zeros((size, DIM), np.float32)

            def step(k: np.ndarray, g: np.ndarray = zeros) -> None:
                pulled = t.pull(k)
                t.push(pulled, g[: pulled.keys.shape[0]])

            runs: dict[str, tuple[Callable[[np.ndarray], Any], list[np.ndarray]]] = {
                "gather": (lambda i: np.take(values, i, axis=0), idx),
                "lookup": (t.lookup, batches),
                "contains": (t.contains, batches),
                "pull+push": (step, batches),
            }
            times: dict[str, list[float]] = {name: [] for name in runs}
            for r in range(args.rounds):
                names = list(runs)
                names = names[r % len(names) :] + names[: r % len(names)]  # turns rotate
                for name in names:
                    fn, arg = runs[name]
                    times[name].append(mean_call_s(fn, arg))
            med = {name: float(np.median(ts)) for name, ts in times.items()}
            for name in ("lookup", "contains", "pull+push"):
                rows.append(
                    [
                        f"{size:,}",
                        name,
                        f"{med[name] * 1e6:.2f}",
                        f"{med['gather'] * 1e6:.2f}",
                        f"{med[name] / med['gather']:.2f}x",
                    ]
                )
        db.close()
    print()
    print_table(["keys", "call", "us a call", "gather us", "vs gather"], rows)
    print(wall_line())


if __name__ == "__main__":
    main()
