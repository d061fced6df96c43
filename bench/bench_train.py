"""Training step of an evdb table against torch's EmbeddingBag + Adagrad on a static table.

What is measured, for each table size (``--rows``), bag size (``--bags``) and key distribution
(``--dists``), with dim ``--dim``, float32 values, int64 keys, Adagrad (lr 0.01, initial
accumulator 0.1, eps 1e-10) on both sides:

* a batch is ``--examples`` examples x ``--features`` features, all features in one table
  (one big sparse feature table): B = examples * features bags of ``bag`` keys each, so
  ``examples * features * bag`` keys per step. Keys are existing keys of the table, drawn with
  replacement: ``zipf`` takes numpy's Zipf(a=``--zipf-a``) rank ``z``, maps it to row
  ``perm[(z - 1) % rows]`` (a fixed random permutation, so hot rows are scattered over the
  table, not packed at its start); ``uniform`` draws rows uniformly.
* ``evdb``: one training step: ``Table.pull(keys)``, ``Pulled.combine(offsets, "sum")``,
  ``Pulled.combine_backward(grad_out, offsets, "sum")``, ``Table.push(pulled, grads)`` (the
  fused Adagrad update on the rows, in place) and ``db.advance()``. Each phase is timed on its
  own as well, to show where the step's time goes.
* ``torch``: ``torch.nn.EmbeddingBag(rows, dim, mode="sum", sparse=True)`` over a static
  weight with the same start values, ``torch.optim.Adagrad`` with the same settings, and the
  row indices precomputed (no key -> row translation: the limit for a fixed vocabulary).
  One step: ``out = emb(idx, offsets)``, ``out.backward(grad_out)``, ``opt.step()``,
  ``opt.zero_grad()``.
* both sides see the same batches (a fresh one per step, pre-generated) and the same fixed
  random ``grad_out`` (B, dim): d loss / d out, as ``loss = (out * grad_out).sum()`` would give.

Every figure is the median of ``--repeat`` steps after ``--warmup`` untimed ones (numba's
cache load, page faults, torch's allocator), with ``time.perf_counter``; the evdb and torch
steps alternate, so a stall of the machine hits both sides alike. Rates are examples/s
(``examples / step time``). Ratios are taken within this one process and run, so they carry
across machines better than the raw rates.

After the timed runs, a parity check trains a 1,000-row evdb table and an EmbeddingBag with
the same start values on the same batches, and compares the combined outputs and the rows.

Memory: at 10M rows x 64, evdb keeps 2.56 GB of values and 2.56 GB of Adagrad accumulators,
torch as much again in its weight and its state: ~11 GB while both live. One size is built,
run and freed before the next. Run: ``.venv/bin/python bench/bench_train.py`` or ``--quick``.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field

import numba
import numpy as np
import torch
from _common import (
    cpu_line,
    fmt_count,
    fmt_gib,
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

TABLE = "bench"
PARITY_TABLE = "bench_parity"
FILL_CHUNK = 1 << 20  # rows per upsert while building the table
LR, INITIAL_ACC, EPS = 0.01, 0.1, 1e-10
VALUE_SCALE = 0.1  # start values uniform in [-0.05, 0.05)
PARITY_ROWS, PARITY_EXAMPLES, PARITY_STEPS, PARITY_TOL = 1000, 64, 6, 1e-4
EVDB_PHASES = ("pull", "combine", "backward", "push", "advance")
TORCH_PHASES = ("forward", "backward", "optim")

# torch.optim.Adagrad's sparse path warns once that sparse invariant checks are off.
warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")


@dataclass
class Result:
    """Median seconds per step (and per phase) for one (rows, bag, dist)."""

    rows: int
    bag: int
    dist: str
    keys: int  # keys per step
    unique: float  # median distinct keys per step
    evdb: float
    torch: float
    evdb_phases: dict[str, float] = field(default_factory=dict)
    torch_phases: dict[str, float] = field(default_factory=dict)


@dataclass
class Build:
    rows: int
    evdb_s: float
    torch_s: float
    rss: int  # after both tables exist (and torch's Adagrad state)


@dataclass
class Report:
    results: list[Result] = field(default_factory=list)
    builds: list[Build] = field(default_factory=list)


# -- helpers ------------------------------------------------------------------------------
def free_memory() -> None:
    gc.collect()
    malloc_trim()


def start_values(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    v = rng.random((n, dim), dtype=np.float32)
    v -= 0.5
    v *= VALUE_SCALE
    return v


def draw_rows(
    rng: np.random.Generator, dist: str, n: int, perm: np.ndarray, zipf_a: float
) -> np.ndarray:
    """n row indices (int64) of a table of perm.shape[0] rows, by the named distribution."""
    rows = perm.shape[0]
    if dist == "uniform":
        return rng.integers(0, rows, size=n, dtype=np.int64)
    z = rng.zipf(zipf_a, size=n)
    z -= 1
    z %= rows
    return perm[z]


def make_optimizer() -> evdb.optim.Adagrad:
    return evdb.optim.Adagrad(lr=LR, initial_accumulator=INITIAL_ACC, eps=EPS)


def make_torch(weight: torch.Tensor) -> tuple[torch.nn.EmbeddingBag, torch.optim.Adagrad]:
    """EmbeddingBag over weight (shared, not copied) and its Adagrad."""
    emb = torch.nn.EmbeddingBag.from_pretrained(weight, freeze=False, mode="sum", sparse=True)
    opt = torch.optim.Adagrad(
        emb.parameters(), lr=LR, initial_accumulator_value=INITIAL_ACC, eps=EPS
    )
    return emb, opt


def evdb_step(
    db: evdb.Database, t: evdb.Table, keys: np.ndarray, offsets: np.ndarray, grad: np.ndarray
) -> tuple[list[float], int]:
    """One evdb training step; perf_counter stamps around each phase, and distinct keys."""
    c0 = time.perf_counter()
    p = t.pull(keys)
    c1 = time.perf_counter()
    p.combine(offsets, combiner="sum")
    c2 = time.perf_counter()
    g = p.combine_backward(grad, offsets, combiner="sum")
    c3 = time.perf_counter()
    t.push(p, g)
    c4 = time.perf_counter()
    db.advance()
    c5 = time.perf_counter()
    return [c0, c1, c2, c3, c4, c5], int(p.keys.shape[0])


def torch_step(
    emb: torch.nn.EmbeddingBag,
    opt: torch.optim.Adagrad,
    idx: torch.Tensor,
    offsets: torch.Tensor,
    grad: torch.Tensor,
) -> list[float]:
    c0 = time.perf_counter()
    out = emb(idx, offsets)
    c1 = time.perf_counter()
    out.backward(grad)
    c2 = time.perf_counter()
    opt.step()
    opt.zero_grad()
    c3 = time.perf_counter()
    return [c0, c1, c2, c3]


def medians(stamps: list[list[float]], names: tuple[str, ...]) -> tuple[float, dict[str, float]]:
    """Median step time and median of each phase from perf_counter stamps."""
    step = statistics.median(s[-1] - s[0] for s in stamps)
    phases = {n: statistics.median(s[i + 1] - s[i] for s in stamps) for i, n in enumerate(names)}
    return step, phases


def fmt_ms(s: float) -> str:
    return f"{s * 1e3:.1f}" if s < 0.1 else f"{s * 1e3:.0f}"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- the measurements ---------------------------------------------------------------------
def build(
    db: evdb.Database, n_rows: int, dim: int, rng: np.random.Generator
) -> tuple[evdb.Table, np.ndarray, torch.Tensor, float, float]:
    """The evdb table (random keys, random start values) and torch's weight with the same
    values, row i of the weight being keys[i]. Built one after the other: the evdb slabs'
    growth copies would otherwise stack on top of torch's weight."""
    keys = random_keys(rng, n_rows)
    t0 = time.perf_counter()
    t = db.create_table(TABLE, dim=dim, initializer=evdb.init.Zeros(), optimizer=make_optimizer())
    for start in range(0, n_rows, FILL_CHUNK):
        stop = min(start + FILL_CHUNK, n_rows)
        t.upsert(keys[start:stop], start_values(rng, stop - start, dim))
    evdb_s = time.perf_counter() - t0
    if len(t) != n_rows:  # 2^-64 odds per pair, but a duplicate would break row i = keys[i]
        raise SystemExit(f"random keys collided: {len(t)} rows for {n_rows} keys; rerun --seed")
    t0 = time.perf_counter()
    weight = np.empty((n_rows, dim), dtype=np.float32)
    for start in range(0, n_rows, FILL_CHUNK):  # the same values, read back from evdb
        stop = min(start + FILL_CHUNK, n_rows)
        t.lookup(keys[start:stop], out=weight[start:stop])
    torch_s = time.perf_counter() - t0
    return t, keys, torch.from_numpy(weight), evdb_s, torch_s


def bench_config(
    db: evdb.Database,
    t: evdb.Table,
    keys: np.ndarray,
    emb: torch.nn.EmbeddingBag,
    opt: torch.optim.Adagrad,
    perm: np.ndarray,
    bag: int,
    dist: str,
    args: argparse.Namespace,
    rng: np.random.Generator,
) -> Result:
    n_bags = args.examples * args.features
    n_keys = n_bags * bag
    steps = args.warmup + args.repeat
    batch_rows = [draw_rows(rng, dist, n_keys, perm, args.zipf_a) for _ in range(steps)]
    batch_keys = [keys[r] for r in batch_rows]
    offsets = np.arange(n_bags, dtype=np.int64) * bag
    grad = rng.standard_normal((n_bags, args.dim), dtype=np.float32)

    # The two sides alternate step by step, so a stall of the machine (page faults of fresh
    # memory, a noisy neighbour) lands on both rather than on whichever ran at that moment.
    offsets_t, grad_t = torch.from_numpy(offsets), torch.from_numpy(grad)
    evdb_stamps, torch_stamps, uniques = [], [], []
    for i in range(steps):
        s, u = evdb_step(db, t, batch_keys[i], offsets, grad)
        s_t = torch_step(emb, opt, torch.from_numpy(batch_rows[i]), offsets_t, grad_t)
        if i >= args.warmup:
            evdb_stamps.append(s)
            torch_stamps.append(s_t)
            uniques.append(u)
    evdb_s, evdb_phases = medians(evdb_stamps, EVDB_PHASES)
    torch_s, torch_phases = medians(torch_stamps, TORCH_PHASES)
    return Result(
        keys.shape[0],
        bag,
        dist,
        n_keys,
        statistics.median(uniques),
        evdb_s,
        torch_s,
        evdb_phases,
        torch_phases,
    )


def bench_size(db: evdb.Database, n_rows: int, args: argparse.Namespace, report: Report) -> None:
    rng = np.random.default_rng(args.seed + n_rows)
    t, keys, weight, evdb_s, torch_s = build(db, n_rows, args.dim, rng)
    emb, opt = make_torch(weight)  # Adagrad's state (rows x dim) is allocated here
    report.builds.append(Build(n_rows, evdb_s, torch_s, rss()))
    log(
        f"  built {fmt_count(n_rows)} rows: evdb {evdb_s:.1f}s, torch weight {torch_s:.1f}s, "
        f"RSS {fmt_gib(rss())}"
    )
    perm = rng.permutation(n_rows)
    for bag in args.bags:
        for dist in args.dists:
            t0 = time.perf_counter()
            r = bench_config(db, t, keys, emb, opt, perm, bag, dist, args, rng)
            report.results.append(r)
            log(
                f"  bag {bag}, {dist}: evdb {r.evdb * 1e3:.0f} ms, torch {r.torch * 1e3:.0f} ms "
                f"per step ({time.perf_counter() - t0:.0f}s, RSS {fmt_gib(rss())})"
            )
            free_memory()
    del t, keys, weight, emb, opt, perm
    db.drop_table(TABLE)  # the slabs go now, and close() has nothing big to flush
    free_memory()


def check_parity(db: evdb.Database, args: argparse.Namespace) -> tuple[float, float, float]:
    """Train a small evdb table and an EmbeddingBag from the same start values on the same
    batches (Zipf keys, so keys repeat within and across bags; the bag sizes in turn).
    Returns the max abs difference of the combined outputs over all steps, of the rows at the
    end, and how far the rows moved (so a parity of untouched rows cannot pass)."""
    rng = np.random.default_rng(args.seed)
    keys = random_keys(rng, PARITY_ROWS)
    values = start_values(rng, PARITY_ROWS, args.dim)
    t = db.create_table(
        PARITY_TABLE, dim=args.dim, initializer=evdb.init.Zeros(), optimizer=make_optimizer()
    )
    t.upsert(keys, values)
    emb, opt = make_torch(torch.from_numpy(values.copy()))
    perm = rng.permutation(PARITY_ROWS)
    out_diff = 0.0
    for i in range(PARITY_STEPS):
        bag = args.bags[i % len(args.bags)]
        n_bags = PARITY_EXAMPLES * args.features
        rows = draw_rows(rng, "zipf", n_bags * bag, perm, args.zipf_a)
        offsets = np.arange(n_bags, dtype=np.int64) * bag
        grad = rng.standard_normal((n_bags, args.dim), dtype=np.float32)
        p = t.pull(keys[rows])
        out = p.combine(offsets, combiner="sum")
        t.push(p, p.combine_backward(grad, offsets, combiner="sum"))
        db.advance()
        out_t = emb(torch.from_numpy(rows), torch.from_numpy(offsets))
        out_t.backward(torch.from_numpy(grad))
        opt.step()
        opt.zero_grad()
        out_diff = max(out_diff, float(np.abs(out - out_t.detach().numpy()).max()))
    final = t.lookup(keys)
    row_diff = float(np.abs(final - emb.weight.detach().numpy()).max())
    moved = float(np.abs(final - values).max())
    db.drop_table(PARITY_TABLE)
    return out_diff, row_diff, moved


def warm_up(db: evdb.Database, args: argparse.Namespace) -> None:
    """Run every path once on a tiny table, so one-off costs (numba's cache load, its thread
    pool, torch's first sparse ops) fall outside the timings."""
    rng = np.random.default_rng(1)
    keys = random_keys(rng, 4096)
    t = db.create_table(
        TABLE, dim=args.dim, initializer=evdb.init.Zeros(), optimizer=make_optimizer()
    )
    t.upsert(keys, start_values(rng, keys.shape[0], args.dim))
    emb, opt = make_torch(torch.from_numpy(t.lookup(keys)))
    perm = np.arange(keys.shape[0])
    for bag in args.bags:
        n_bags = 4096  # above the kernels' parallel threshold for every bag size
        rows = draw_rows(rng, "uniform", n_bags * bag, perm, args.zipf_a)
        offsets = np.arange(n_bags, dtype=np.int64) * bag
        grad = rng.standard_normal((n_bags, args.dim), dtype=np.float32)
        evdb_step(db, t, keys[rows], offsets, grad)
        torch_step(
            emb, opt, torch.from_numpy(rows), torch.from_numpy(offsets), torch.from_numpy(grad)
        )
    del t
    db.drop_table(TABLE)


# -- output -------------------------------------------------------------------------------
def print_header(args: argparse.Namespace) -> None:
    n_bags = args.examples * args.features
    dists = []
    for d in args.dists:
        if d == "zipf":
            dists.append(
                f"zipf (numpy zipf a={args.zipf_a}, rank z -> row perm[(z-1) % rows], "
                "perm a fixed random permutation)"
            )
        else:
            dists.append("uniform (rows uniform at random)")
    lines = [
        "evdb training-step benchmark (bench/bench_train.py)",
        cpu_line(),
        f"threads     numba {numba.get_num_threads()}, torch {torch.get_num_threads()} "
        f"(interop {torch.get_num_interop_threads()})",
        versions_line(torch.__version__),
        f"data        values float32, dim {args.dim}; keys int64, random; rows "
        f"{', '.join(fmt_count(r) for r in args.rows)}; start values uniform "
        f"[{-VALUE_SCALE / 2}, {VALUE_SCALE / 2})",
        f"batch       {fmt_count(args.examples)} examples x {args.features} features, one table: "
        f"B = {fmt_count(n_bags)} bags of {' or '.join(str(b) for b in args.bags)} key(s) "
        f"({' or '.join(fmt_count(n_bags * b) for b in args.bags)} keys/step), combiner sum",
        "keys        existing keys, with replacement, fresh batch per step; " + "; ".join(dists),
        f"optimizer   Adagrad lr {LR}, initial accumulator {INITIAL_ACC}, eps {EPS} (both sides)",
        "evdb        pull + combine + combine_backward + push (fused Adagrad) + db.advance()",
        "torch       EmbeddingBag(mode=sum, sparse=True) + optim.Adagrad, static weight, "
        "precomputed row indices: forward, backward(grad_out), opt.step(), zero_grad()",
        f"timing      median of {args.repeat} steps after {args.warmup} warm-up steps, evdb and "
        "torch steps alternating; time.perf_counter; grad_out a fixed random (B, dim) matrix",
        "units       examples/s (M = 1e6, K = 1e3), ms per step; ratio evdb / torch in "
        "examples/s (above 1x: evdb faster)",
    ]
    print("\n".join(lines))


def print_report(report: Report, args: argparse.Namespace) -> None:
    ex = args.examples
    print("\ntraining step: examples/s and evdb / torch")
    header = "rows bag dist keys/step unique evdb torch evdb/torch evdb_ms torch_ms".split()
    rows = []
    for r in report.results:
        rows.append(
            [
                fmt_count(r.rows),
                str(r.bag),
                r.dist,
                fmt_count(r.keys),
                fmt_count(r.unique),
                fmt_rate(ex / r.evdb, digits=2),
                fmt_rate(ex / r.torch, digits=2),
                fmt_ratio(r.torch / r.evdb),
                fmt_ms(r.evdb),
                fmt_ms(r.torch),
            ]
        )
    print_table(header, rows, first_left=3)
    print("(unique: median distinct keys per step, the rows pull and push touch)")

    print("\nevdb step by phase (ms, median of each phase; share of the step)")
    header = ["rows", "bag", "dist", *EVDB_PHASES, "step", "largest"]
    rows = []
    for r in report.results:
        top = max(EVDB_PHASES, key=lambda n: r.evdb_phases[n])
        rows.append(
            [
                fmt_count(r.rows),
                str(r.bag),
                r.dist,
                *(fmt_ms(r.evdb_phases[n]) for n in EVDB_PHASES),
                fmt_ms(r.evdb),
                f"{top} {r.evdb_phases[top] / r.evdb:.0%}",
            ]
        )
    print_table(header, rows, first_left=3)

    print("\ntorch step by phase (ms, median of each phase)")
    header = ["rows", "bag", "dist", *TORCH_PHASES, "step"]
    rows = []
    for r in report.results:
        rows.append(
            [
                fmt_count(r.rows),
                str(r.bag),
                r.dist,
                *(fmt_ms(r.torch_phases[n]) for n in TORCH_PHASES),
                fmt_ms(r.torch),
            ]
        )
    print_table(header, rows, first_left=3)
    print("(optim: opt.step() + opt.zero_grad())")

    print("\nbuild (evdb: create + upsert in 1M chunks; torch: its weight read back from evdb)")
    rows = [
        [fmt_count(b.rows), f"{b.evdb_s:.1f}s", f"{b.torch_s:.1f}s", fmt_gib(b.rss)]
        for b in report.builds
    ]
    print_table(["rows", "evdb", "torch", "RSS both"], rows)


# -- main ---------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000])
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--examples", type=int, default=4096, help="examples per batch")
    p.add_argument("--features", type=int, default=26, help="features per example")
    p.add_argument("--bags", type=int, nargs="+", default=[1, 20], help="keys per bag")
    p.add_argument("--dists", nargs="+", choices=["zipf", "uniform"], default=["zipf", "uniform"])
    p.add_argument("--zipf-a", type=float, default=1.05, help="numpy zipf exponent (> 1)")
    p.add_argument("--repeat", type=int, default=10, help="timed steps per figure (median)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--quick", action="store_true", help="smoke run: 200,000 rows, 512 examples, 3 repeats"
    )
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.examples, args.repeat = [200_000], 512, 3
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print_header(args)
    sys.stdout.flush()
    report = Report()
    with tempfile.TemporaryDirectory(prefix="evdb-bench-") as tmp:
        db = evdb.open(tmp)
        try:
            warm_up(db, args)
            for n_rows in args.rows:
                log(f"[{fmt_count(n_rows)} rows]")
                bench_size(db, n_rows, args, report)
            out_diff, row_diff, moved = check_parity(db, args)
        finally:
            for name in (TABLE, PARITY_TABLE):
                if name in db.tables():
                    db.drop_table(name)
            db.close()
    print_report(report, args)

    ok = max(out_diff, row_diff) <= PARITY_TOL and moved > 10 * PARITY_TOL
    what = (
        f"max abs diff {row_diff:.2e} on rows, {out_diff:.2e} on combined outputs, over "
        f"{PARITY_STEPS} steps on {PARITY_ROWS:,} rows; rows moved up to {moved:.3f}"
    )
    if ok:
        print(f"\nparity ok ({what})")
    else:
        print(f"\n!!! PARITY FAILED: evdb and torch disagree beyond {PARITY_TOL} ({what}) !!!")
    print(wall_line())
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
