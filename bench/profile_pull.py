"""Where a pull's time goes: cProfile over repeated pulls, the functions that take the time.

Setup: one table of ``--rows`` rows (random int64 keys), dim 64, Adagrad, every row in DRAM,
as in ``bench_threads.py``; ``--dtype bfloat16`` (or float16) stores its rows in half
precision (issue 29), to set a half-precision pull's functions beside float32's. For each
batch size, ``--repeat`` pulls of existing keys (hits only) and of batches with 10% new keys
(created, since admission is admit-all) run under cProfile after as many untimed ones; the
table lists the functions with the most own time, in microseconds per pull, beside ``lookup``
of the same hits into a reused output.

Run from the repository root: ``.venv/bin/python bench/profile_pull.py``.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
import time
from collections.abc import Callable
from typing import Any

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

import evdb


def half_table(
    dtype: str, rows: int, dim: int, rng: np.random.Generator
) -> tuple[evdb.Database, evdb.Table, np.ndarray]:
    """adagrad_table_in_dram's table with its rows stored in ``dtype``."""
    db = evdb.open(tempfile.mkdtemp(prefix="evdb-profile-"))
    t = db.create_table(
        "t", dim=dim, dtype=dtype, optimizer=evdb.optim.Adagrad(lr=0.05), disk=False
    )
    keys = rng.integers(-(2**62), 2**62, rows)
    for chunk in np.array_split(keys, 16):
        t.upsert(chunk, np.ones((chunk.shape[0], dim), np.float32))
    return db, t, keys


def profile(
    fn: Callable[[np.ndarray], Any], batches: list[list[np.ndarray]], top: int
) -> tuple[float, list[list[str]]]:
    """``batches``: three lists (warm-up, timed, profiled), disjoint where a call changes
    what the next one finds. Returns the median wall time per timed call (no profiler), and
    the top functions by own time per profiled call."""
    warm, timed, profiled = batches
    for b in warm:  # compiled, the index settled
        fn(b)
    times = []
    for b in timed:
        t0 = time.perf_counter()
        fn(b)
        times.append(time.perf_counter() - t0)
    prof = cProfile.Profile()
    prof.enable()
    for b in profiled:
        fn(b)
    prof.disable()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    rows = []
    for (path, line, name), (_, ncalls, own, _cum, _) in stats.items():
        where = f"{path.rsplit('/', 2)[-1] if '/' in path else path}:{line}({name})"
        rows.append((own / len(profiled), ncalls / len(profiled), where))
    rows.sort(reverse=True)
    return float(np.median(times)), [
        [where, f"{calls:.0f}", f"{own * 1e6:,.0f}"] for own, calls, where in rows[:top]
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batches", type=int, nargs="+", default=[16_384, 65_536])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--top", type=int, default=8)
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    args = parser.parse_args()
    print("profile_pull: where a pull's time goes")
    print(cpu_line())
    print(versions_line("-"))
    print(f"setup       {args.rows:,} rows, dim {args.dim}, {args.dtype}, Adagrad, all in DRAM")
    rng = np.random.default_rng(0)
    if args.dtype == "float32":
        db, t, keys = adagrad_table_in_dram("evdb-profile-", args.rows, args.dim, rng)
    else:
        db, t, keys = half_table(args.dtype, args.rows, args.dim, rng)
    for batch in args.batches:
        hits = [rng.choice(keys, batch) for _ in range(args.repeat)]
        fresh = [  # warm-up, timed and profiled calls each create their own new rows
            batches_with_new_keys(rng, keys, batch, args.repeat) for _ in range(3)
        ]
        buffer = np.empty((batch, args.dim), np.float32)
        lookup, _ = profile(lambda k, o=buffer: t.lookup(k, out=o), [hits] * 3, 0)
        for label, batches in (("hits", [hits] * 3), ("10% new", fresh)):
            wall, top = profile(t.pull, batches, args.top)
            print()
            print(
                f"pull of {batch:,} keys, {label}: {wall * 1e3:.2f} ms "
                f"(lookup of as many hits: {lookup * 1e3:.2f} ms; lookup/pull {lookup / wall:.2f}x)"
            )
            print_table(["function (own time)", "calls", "us per pull"], top, first_left=1)
    print(wall_line())
    discard(db)


if __name__ == "__main__":
    main()
