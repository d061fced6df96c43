"""Thread scaling of the kernels, and pull against lookup on the same keys.

Setup: one table of 1M rows (random int64 keys), dim 64, Adagrad, every row in DRAM.

* 2 threads against 1 (numba's pool, ``numba.set_num_threads``): ``lookup`` of 1M random
  existing keys into a reused output, and ``push`` of 100k distinct rows (the fused Adagrad
  update), each the median of ``--repeat`` calls. The speed issue's aim is at least 1.7x.
* ``pull`` of existing keys (hits only), and with 10% new keys, against ``lookup`` of the same
  batch into a reused output, at 16,384, 65,536 and 262,144 keys, on 2 threads (a pull
  allocates the batch's rows each time, as it must: they go to the trainer).

Run from the repository root: ``.venv/bin/python bench/bench_threads.py``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numba
import numpy as np
from _common import (
    adagrad_table_in_dram,
    batches_with_new_keys,
    cpu_line,
    discard,
    print_table,
    versions_line,
    wall_line,
)


def median_push_s(t: Any, keys: np.ndarray, grads: np.ndarray, repeat: int) -> float:
    """Median push time: each push on a fresh pull of the same keys (a push is tied to its
    pull: a batch is pushed once), the pull not timed."""
    times = []
    for _ in range(repeat):
        pulled = t.pull(keys)
        t0 = time.perf_counter()
        t.push(pulled, grads)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def median_s(fn: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


class Turns:
    """Call fn on the next batch of a list, round and round."""

    def __init__(self, fn: Callable[[np.ndarray], Any], batches: list[np.ndarray]) -> None:
        self.fn, self.batches, self.i = fn, batches, 0

    def __call__(self) -> None:
        self.i += 1
        self.fn(self.batches[self.i % len(self.batches)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    print("bench_threads: kernels on 2 threads against 1; pull against lookup")
    print(cpu_line())
    print(versions_line("-"))
    print(f"setup       {args.rows:,} rows, dim {args.dim}, Adagrad, all in DRAM")
    rng = np.random.default_rng(0)
    db, t, keys = adagrad_table_in_dram("evdb-threads-", args.rows, args.dim, rng)

    look = rng.choice(keys, 1_000_000)
    out = np.empty((look.shape[0], args.dim), np.float32)
    push_keys = rng.choice(keys, 100_000, replace=False)
    grads = np.full((100_000, args.dim), 0.01, np.float32)
    times = {}
    for threads in (1, 2):
        numba.set_num_threads(threads)
        times[threads] = (
            median_s(lambda: t.lookup(look, out=out), args.repeat),
            median_push_s(t, push_keys, grads, args.repeat),
        )
    rows = []
    for i, what in enumerate(("lookup of 1M keys", "push of 100k rows (Adagrad)")):
        one, two = times[1][i], times[2][i]
        rows.append([what, f"{one * 1e3:.1f}", f"{two * 1e3:.1f}", f"{one / two:.2f}x"])
    print()
    print_table(["kernel", "1 thread ms", "2 threads ms", "2 vs 1"], rows)

    numba.set_num_threads(2)
    rows = []
    for batch in (16_384, 65_536, 262_144):
        hits = [rng.choice(keys, batch) for _ in range(8)]
        fresh = batches_with_new_keys(rng, keys, batch, args.repeat)
        buffer = np.empty((batch, args.dim), np.float32)  # lookups reuse one (no page faults)
        lookup = median_s(Turns(lambda k, o=buffer: t.lookup(k, out=o), hits), args.repeat)
        pull = median_s(Turns(t.pull, hits), args.repeat)
        new = median_s(Turns(t.pull, fresh), args.repeat)
        rows.append(
            [
                f"{batch:,}",
                f"{batch / lookup / 1e6:.1f}M",
                f"{batch / pull / 1e6:.1f}M",
                f"{lookup / pull:.2f}x",
                f"{batch / new / 1e6:.1f}M",
                f"{lookup / new:.2f}x",
            ]
        )
    print()
    print_table(
        ["keys", "lookup keys/s", "pull hits", "vs lookup", "pull 10% new", "vs lookup"], rows
    )
    print(wall_line())
    discard(db)


if __name__ == "__main__":
    main()
