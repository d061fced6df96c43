"""Lookup, pull and memory of an evdb table, as ratios against baselines measured alongside.

What is measured, for each table size (``--rows``), dim ``--dim``, float32 values, int64 keys:

* ``evdb``: ``Table.lookup(keys, out=out)`` of a batch of random *existing* keys (drawn with
  replacement), into an ``out`` buffer reused across calls: hash probe + TTL check + gather.
* ``take`` / ``torch``: the fastest plain gather, with the row indices already known, into a
  reused output buffer: ``numpy.take(values, idx, axis=0, out=out, mode="clip")`` (the default
  ``mode="raise"`` buffers through a temporary and is about 2x slower) and
  ``torch.index_select(values_t, 0, idx_t, out=out_t)`` on a zero-copy ``torch.from_numpy``
  view (skipped if torch is not importable). ``limit`` is the faster of the two: a lookup
  cannot beat a gather that already knows where the rows are.
* ``dict``: the plain Python answer, a ``dict`` key -> row index over the whole table, then
  ``numpy.take``; measured on the first ``--dict-sample`` keys of the batch (it is slow).
* ``pull``: ``Table.pull(keys)`` of a batch of 65,536 keys, 10% of them new (never seen, so
  admitted and created: the default admission is admit-all) and 90% existing. Each timed call
  gets fresh new keys, since a pull creates their rows. Compared with ``evdb`` lookup at the
  same batch size.
* memory: bytes per row as the table reports it (``stats()["tiers"]["dram"]["bytes_per_row"]``,
  slab columns up to the high-water row plus the hash index) and as the process RSS growth
  around building the table, raw and after glibc's ``malloc_trim(0)`` (without the free heap
  the allocator keeps from the build's temporaries), each against the raw ``4 * dim`` bytes of
  a row and against the aim "under 1.3x + 16 bytes": ``(bytes_per_row - 16) / (4 * dim) < 1.3``.

Every timing is the median of ``--repeat`` calls after one untimed warm-up call (numba's
cache load, page faults of the output buffer), with ``time.perf_counter``. Ratios are taken
within this one process and run, so they carry across machines better than the raw rates.

Run: ``.venv/bin/python bench/bench_lookup.py`` (about 2.6 GB of rows for the evdb slab at
10M x 64, as much again for the baselines' value matrix, ~1 GB for the dict) or ``--quick``.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numba
import numpy as np
from _common import (
    cpu_line,
    fmt_count,
    fmt_rate,
    fmt_ratio,
    malloc_trim,
    print_table,
    random_keys,
    rss,
    versions_line,
    wall_line,
)

import evdb

try:
    import torch
except ImportError:  # torch is optional: the torch column reads "-"
    torch = None

TABLE = "bench"
FILL_CHUNK = 1 << 20  # rows per upsert while building the table
PULL_BATCH = 65_536
PULL_NEW = 0.10  # share of never-seen keys in a pull batch
AIM_FACTOR, AIM_OVERHEAD = 1.3, 16  # memory aim: bytes_per_row < 1.3 * 4 * dim + 16


@dataclass
class BatchResult:
    """Rates in keys/s for one (rows, batch); None where not measured."""

    rows: int
    batch: int
    evdb: float
    take: float
    torch: float | None
    dict: float
    pull: float | None = None

    @property
    def limit(self) -> float:
        return max(self.take, self.torch or 0.0)


@dataclass
class MemoryResult:
    rows: int
    stats_bytes_per_row: float
    rss_bytes_per_row: float
    rss_trimmed_bytes_per_row: float | None  # after malloc_trim(0); None without glibc
    build_s: float


@dataclass
class Report:
    batches: list[BatchResult] = field(default_factory=list)
    memory: list[MemoryResult] = field(default_factory=list)


# -- helpers ------------------------------------------------------------------------------
def median_seconds(fn: Callable[[], Any], repeat: int) -> float:
    """Median wall time of fn() over repeat calls, after one untimed warm-up call."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def trimmed_rss() -> int | None:
    """RSS after glibc hands its free heap memory back: what live objects hold."""
    if not malloc_trim():
        return None
    return rss()


# -- the measurements ---------------------------------------------------------------------
def build_table(
    db: evdb.Database, keys: np.ndarray, values: np.ndarray
) -> tuple[evdb.Table, MemoryResult]:
    """Create and fill the table; measure its bytes per row two ways."""
    n, dim = values.shape
    gc.collect()
    trimmed_rss()  # start from a trimmed heap, so both measures share their baseline
    rss0 = rss()
    t0 = time.perf_counter()
    t = db.create_table(TABLE, dim=dim, initializer=evdb.init.Zeros())
    for start in range(0, n, FILL_CHUNK):
        t.upsert(keys[start : start + FILL_CHUNK], values[start : start + FILL_CHUNK])
    build_s = time.perf_counter() - t0
    gc.collect()
    grown = rss() - rss0
    trimmed = trimmed_rss()
    if len(t) != n:  # 2^-64 odds per pair, but a duplicate would skew rows and memory
        raise SystemExit(f"random keys collided: {len(t)} rows for {n} keys; rerun with --seed")
    per_row = float(t.stats()["tiers"]["dram"]["bytes_per_row"])
    trimmed_per_row = None if trimmed is None else (trimmed - rss0) / n
    return t, MemoryResult(n, per_row, grown / n, trimmed_per_row, build_s)


def bench_batch(
    t: evdb.Table,
    keys: np.ndarray,
    values: np.ndarray,
    row_of: dict[int, int],
    batch: int,
    args: argparse.Namespace,
    rng: np.random.Generator,
) -> BatchResult:
    """Lookup of `batch` random existing keys: evdb, the two plain gathers and the dict."""
    idx = rng.integers(0, keys.shape[0], size=batch, dtype=np.int64)
    batch_keys = keys[idx]
    out = np.empty((batch, values.shape[1]), dtype=np.float32)

    t.lookup(batch_keys, out=out)
    if not np.array_equal(out, np.take(values, idx, axis=0)):
        raise SystemExit("evdb lookup returned different rows than the gather baseline")

    rate: dict[str, float | None] = {}
    rate["evdb"] = batch / median_seconds(lambda: t.lookup(batch_keys, out=out), args.repeat)
    rate["take"] = batch / median_seconds(
        lambda: np.take(values, idx, axis=0, out=out, mode="clip"), args.repeat
    )
    rate["torch"] = None
    if torch is not None:
        values_t, idx_t, out_t = (torch.from_numpy(a) for a in (values, idx, out))
        rate["torch"] = batch / median_seconds(
            lambda: torch.index_select(values_t, 0, idx_t, out=out_t), args.repeat
        )

    sample = batch_keys[: args.dict_sample]
    sample_out = out[: sample.shape[0]]

    def dict_lookup() -> None:
        rows = np.fromiter(map(row_of.__getitem__, sample.tolist()), np.int64, sample.shape[0])
        np.take(values, rows, axis=0, out=sample_out, mode="clip")

    rate["dict"] = sample.shape[0] / median_seconds(dict_lookup, args.repeat)
    return BatchResult(keys.shape[0], batch, **rate)  # type: ignore[arg-type]


def bench_pull(t: evdb.Table, keys: np.ndarray, repeat: int, rng: np.random.Generator) -> float:
    """keys/s of pull(): PULL_BATCH keys, PULL_NEW of them never seen; fresh ones per call."""
    n_new = round(PULL_BATCH * PULL_NEW)
    batches = []
    for _ in range(repeat + 1):  # + the warm-up call
        old = keys[rng.integers(0, keys.shape[0], size=PULL_BATCH - n_new)]
        b = np.concatenate([old, random_keys(rng, n_new)])
        rng.shuffle(b)
        batches.append(b)
    it = iter(batches)
    return PULL_BATCH / median_seconds(lambda: t.pull(next(it)), repeat)


def warm_up(db: evdb.Database, dim: int) -> None:
    """Run every path once on a tiny table, so one-off costs (numba's cache load, its thread
    pool, allocator arenas) are neither timed nor counted in a table's RSS growth."""
    rng = np.random.default_rng(0)
    keys = random_keys(rng, 4096)
    t = db.create_table(TABLE, dim=dim, initializer=evdb.init.Zeros())
    t.upsert(keys, rng.random((keys.shape[0], dim), dtype=np.float32))
    t.lookup(keys, out=np.empty((keys.shape[0], dim), dtype=np.float32))
    t.pull(np.concatenate([keys[:1000], random_keys(rng, 100)]))
    del t
    db.drop_table(TABLE)


def bench_size(db: evdb.Database, n_rows: int, args: argparse.Namespace, report: Report) -> None:
    rng = np.random.default_rng(args.seed + n_rows)
    keys = random_keys(rng, n_rows)
    values = rng.random((n_rows, args.dim), dtype=np.float32)  # also the baselines' matrix

    t, mem = build_table(db, keys, values)
    report.memory.append(mem)
    print(f"  built {fmt_count(n_rows)} rows in {mem.build_s:.1f}s", file=sys.stderr)

    t0 = time.perf_counter()
    row_of = dict(zip(keys.tolist(), range(n_rows), strict=True))
    print(f"  built the dict in {time.perf_counter() - t0:.1f}s", file=sys.stderr)

    results = {}
    for batch in args.batches:
        results[batch] = bench_batch(t, keys, values, row_of, batch, args, rng)
        print(f"  batch {fmt_count(batch)} done", file=sys.stderr)
    del row_of
    results[PULL_BATCH].pull = bench_pull(t, keys, args.repeat, rng)
    report.batches.extend(results[b] for b in args.batches)

    del t
    db.drop_table(TABLE)  # the slab goes now, and close() has nothing big to flush
    gc.collect()


# -- output -------------------------------------------------------------------------------
def print_header(args: argparse.Namespace) -> None:
    torch_v = torch.__version__ if torch is not None else "not installed (column skipped)"
    torch_threads = f", torch threads {torch.get_num_threads()}" if torch is not None else ""
    lines = [
        "evdb lookup benchmark (bench/bench_lookup.py)",
        cpu_line(),
        f"threads     numba {numba.get_num_threads()}{torch_threads}",
        versions_line(torch_v),
        f"data        values float32, dim {args.dim} ({4 * args.dim} B/row raw); "
        "keys int64, uniform random",
        f"rows        {', '.join(fmt_count(r) for r in args.rows)}",
        f"batches     {', '.join(fmt_count(b) for b in args.batches)} random existing keys "
        f"(with replacement); dict on the first {fmt_count(args.dict_sample)}",
        f"pull        {fmt_count(PULL_BATCH)} keys, {PULL_NEW:.0%} new, fresh per call",
        f"timing      median of {args.repeat} after 1 warm-up, time.perf_counter",
        "units       keys/s (M = 1e6); ratios are evdb / baseline (above 1x: evdb faster)",
    ]
    print("\n".join(lines))


def print_report(report: Report, dim: int) -> None:
    print("\nthroughput (keys/s) and ratios")
    header = "rows batch evdb take torch limit dict pull evdb/limit evdb/take evdb/dict pull/evdb"
    rows = []
    for r in report.batches:
        rates = [r.evdb, r.take, r.torch, r.limit, r.dict, r.pull]
        ratios = [r.evdb / r.limit, r.evdb / r.take, r.evdb / r.dict]
        ratios.append(None if r.pull is None else r.pull / r.evdb)
        cells = [fmt_rate(x) for x in rates] + [fmt_ratio(x) for x in ratios]
        rows.append([fmt_count(r.rows), fmt_count(r.batch), *cells])
    print_table(header.split(), rows)

    raw = 4 * dim
    print(
        f"\nmemory (bytes per row; raw = 4 * dim = {raw} B; "
        f"aim: (B/row - {AIM_OVERHEAD}) / raw < {AIM_FACTOR}x)"
    )
    rows = []
    for m in report.memory:
        measures = {
            "stats()": m.stats_bytes_per_row,
            "RSS growth": m.rss_bytes_per_row,
            "RSS, trimmed": m.rss_trimmed_bytes_per_row,
        }
        for name, per_row in measures.items():
            if per_row is None:
                continue
            aim = (per_row - AIM_OVERHEAD) / raw
            verdict = "ok" if aim < AIM_FACTOR else "OVER"
            cells = [f"{per_row:.1f}", fmt_ratio(per_row / raw), fmt_ratio(aim), verdict]
            rows.append([fmt_count(m.rows), name, *cells, f"{m.build_s:.1f}s"])
    print_table(["rows", "measure", "B/row", "x raw", "aim", "", "build"], rows, first_left=2)
    print(
        "(stats(): slab columns to the high-water row + hash index; RSS growth: around the "
        "build;\n trimmed: the same after malloc_trim(0), without free heap glibc keeps)"
    )


# -- main ---------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000])
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--batches", type=int, nargs="+", default=[65_536, 1_048_576])
    p.add_argument("--repeat", type=int, default=5, help="timed calls per figure (median)")
    p.add_argument(
        "--dict-sample",
        type=int,
        default=65_536,
        help="keys the dict baseline looks up (it is slow)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke run: 200,000 rows and batch {PULL_BATCH:,} only",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.batches = [200_000], [PULL_BATCH]
    if PULL_BATCH not in args.batches:  # pull is compared with a lookup of its batch size
        args.batches.append(PULL_BATCH)
    args.batches.sort()
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print_header(args)
    sys.stdout.flush()
    report = Report()
    with tempfile.TemporaryDirectory(prefix="evdb-bench-") as tmp:
        db = evdb.open(tmp)
        try:
            warm_up(db, args.dim)
            for n_rows in args.rows:
                print(f"[{fmt_count(n_rows)} rows]", file=sys.stderr)
                bench_size(db, n_rows, args, report)
        finally:
            if TABLE in db.tables():
                db.drop_table(TABLE)
            db.close()
    print_report(report, args.dim)
    print(f"\n{wall_line()}")


if __name__ == "__main__":
    main()
