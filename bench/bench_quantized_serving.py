"""Quantised serving lookups (int8, int4) against float32 and float16 serving, in one run
(issue 29: aim >= 0.9x float32 serving).

One table of ``--rows`` random rows (normal(0, 0.05), int64 keys drawn from the whole
range) of dim ``--dim`` is exported for serving four times (``evdb.export(...,
format="serving", dtype=...)``) and each export opened as ``evdb serve`` opens it
(``evdb.api.snapshots.Snapshot.open``; float32 and float16 with ``cache_rows`` = every row,
all rows looked up once with ``promote=True`` first, so every variant answers from memory).
Then, for each batch size, what is timed is what a server's handler calls:

* ``lookup``: ``table.lookup(keys, out=out, found=found)`` of random existing keys (drawn
  with replacement; ``--absent`` of them keys without a row, which read their initializer
  value: none by default), ``out`` reused.
* ``bags``: ``table.lookup(keys, offsets, combiner="mean", out=out)``, bags of ``--bag``
  keys.
* ``take``: the baseline, ``numpy.take(values, idx, axis=0, out=out, mode="clip")`` of a
  float32 matrix with the row indices already known: no search, no conversion.

Each figure is the median of ``--repeat`` rounds; each round times every variant once, in a
rotating order, on the same keys (so drift on a shared machine hits all of them alike),
after one untimed warm-up call each. Ratios are keys/s over float32 serving's, and float32
serving's over ``take``'s. Run: ``.venv/bin/python bench/bench_quantized_serving.py``
(1M rows: about two minutes on 2 shared cores), ``--rows 100000`` for a quick look. On a
machine other work keeps busy, ``NUMBA_NUM_THREADS=1``: from 1,024 keys every variant's
kernel runs on numba's threads, whose wake-up then costs ~20 ms a call, alike for all. With
one thread the int8 / int4 kernels take their serial loop, while float32 and float16
serving's still launch a one-thread prange (what cost the frozen kernels ~10-15 us a call
at 4,096 keys).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numba
import numpy as np
from _common import (
    cpu_line,
    fmt_rate,
    fmt_ratio,
    log,
    print_table,
    random_keys,
    values_like_trained,
    versions_line,
    wall_line,
)

import evdb
from evdb.api.snapshots import Snapshot

DTYPES = ("float32", "float16", "int8", "int4")
CHUNK = 65_536


def build(root: Path, rows: int, dim: int, rng: np.random.Generator) -> tuple[np.ndarray, Any]:
    """The exports under root; the keys and the float32 rows (for the ``take`` baseline)."""
    keys = random_keys(rng, rows)
    values = values_like_trained(rng, rows, dim)
    with evdb.open(root / "source") as db:
        t = db.create_table("t", dim=dim, disk=False)
        for a in range(0, rows, CHUNK):
            t.upsert(keys[a : a + CHUNK], values[a : a + CHUNK])
        for dtype in DTYPES:
            t0 = time.perf_counter()
            evdb.export(db, root / dtype, dtype=dtype)
            log(f"export {dtype}: {time.perf_counter() - t0:.1f}s")
    return keys, values


def open_served(path: Path, keys: np.ndarray, dim: int) -> Snapshot:
    snap = Snapshot.open(path, cache_rows=keys.shape[0])
    table = snap.tables["t"]
    out = np.empty((CHUNK, dim), np.float32)
    for a in range(0, keys.shape[0], CHUNK):  # every row into memory, as serving warms up
        part = keys[a : a + CHUNK]
        table.lookup(part, out=out[: part.shape[0]], promote=True)
    return snap


def calls_for(
    snaps: dict[str, Snapshot],
    values: np.ndarray,
    idx: np.ndarray,
    asked: np.ndarray,
    offsets: np.ndarray,
    out: np.ndarray,
    bag_out: np.ndarray,
    found: np.ndarray,
) -> dict[str, Callable[[], Any]]:
    """The calls timed at one batch size, by name."""
    calls: dict[str, Callable[[], Any]] = {
        "take": lambda: np.take(values, idx, axis=0, out=out, mode="clip")
    }
    for d in DTYPES:
        t = snaps[d].tables["t"]
        calls[f"lookup {d}"] = lambda t=t: t.lookup(asked, out=out, found=found)
        calls[f"bags {d}"] = lambda t=t: t.lookup(asked, offsets, combiner="mean", out=bag_out)
    return calls


def median_seconds(calls: dict[str, Callable[[], Any]], repeat: int) -> dict[str, float]:
    for fn in calls.values():
        fn()  # warm-up: kernels loaded, pages of out touched
    times: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    for r in range(repeat):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            t0 = time.perf_counter()
            calls[name]()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch", type=int, nargs="+", default=[256, 4096, 65536])
    parser.add_argument("--bag", type=int, default=20, help="Keys a bag.")
    parser.add_argument("--repeat", type=int, default=31)
    parser.add_argument(
        "--absent",
        type=float,
        default=0.0,
        help="Fraction of the keys asked that have no row (a float32 or float16 snapshot "
        "asks RocksDB's filter for each).",
    )
    args = parser.parse_args()
    rows, dim = args.rows, args.dim
    rng = np.random.default_rng(0)
    print(
        f"bench_quantized_serving: {rows:,} rows, dim {dim}, int64 keys, float32 answers; "
        f"lookups of random keys ({args.absent:.0%} absent), bags of {args.bag} (mean); "
        f"median of {args.repeat} rounds"
    )
    print(cpu_line())
    print(versions_line("-") + f"; numba threads {numba.get_num_threads()}")
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        keys, values = build(Path(tmp), rows, dim, rng)
        snaps = {d: open_served(Path(tmp) / d, keys, dim) for d in DTYPES}
        print(
            "bytes a row served: "
            + ", ".join(
                f"{d} {snaps[d].tables['t'].stats()['tiers']['dram']['bytes_per_row']:.0f}"
                for d in DTYPES
            )
            + " (each table's DRAM tier stats)"
        )
        table_rows = []
        for batch in args.batch:
            idx = rng.integers(0, rows, batch)
            asked = keys[idx].copy()
            absent = rng.random(batch) < args.absent
            asked[absent] = rng.integers(-(2**62), 2**62, int(absent.sum()))  # ~never a key
            offsets = np.arange(0, batch, args.bag)
            out = np.empty((batch, dim), np.float32)
            bag_out = np.empty((offsets.shape[0], dim), np.float32)
            found = np.empty(batch, bool)
            secs = median_seconds(
                calls_for(snaps, values, idx, asked, offsets, out, bag_out, found), args.repeat
            )
            base = secs["take"]
            for op in ("lookup", "bags"):
                f32 = secs[f"{op} float32"]
                for d in DTYPES:
                    s = secs[f"{op} {d}"]
                    table_rows.append(
                        [
                            f"{batch:,}",
                            op,
                            d,
                            f"{s * 1e6:.0f}",
                            fmt_rate(batch / s),
                            fmt_ratio(f32 / s),
                            fmt_ratio(base / s),
                        ]
                    )
            table_rows.append(
                [f"{batch:,}", "take", "float32", f"{base * 1e6:.0f}", fmt_rate(batch / base),
                 "-", "1.00x"]
            )  # fmt: skip
        print_table(
            ["batch", "op", "rows", "us/call", "keys/s", "vs f32 serving", "vs take"],
            table_rows,
            first_left=3,
        )
        for snap in snaps.values():
            snap.close()
    print(wall_line())


if __name__ == "__main__":
    main()
