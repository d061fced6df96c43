"""Training while the tables grow: step times through the torch binding, against a static table.

The workload of the speed issue's growing-table row: every step 4,096 examples x 26 features x
one id each, ids drawn Zipf(``--zipf-a``) over ``--ids`` (1M), sum pooling, Adagrad (lr 0.05),
a trivial loss (the sum of the pooled outputs), so the evdb table grows from empty to about
940k rows over ``--steps`` (90) steps. The 26 features share one evdb table and its id space,
as they share the static table, and ``EmbeddingBagCollection`` pulls and pushes it once a
step.

* ``torch``: ``nn.EmbeddingBag(ids, dim, mode="sum", sparse=True)`` sized to the id space up
  front, with the ids as indices (no hashing: the static limit), and ``torch.optim.Adagrad``.
* ``evdb``: ``evdb.torch.EmbeddingBagCollection(stack=True)`` over an evdb table with no rows
  at the start (``disk=False``), the same Adagrad rule fused into the push; its output is the
  (26, B, dim) pooled tensor, as torch's is one (26 x B, dim) tensor viewed.

It prints the median and the slowest step of each, the whole run's examples/s and their
ratios; the aim is no step over 3x the median while the table grows. A third run prices the
torch module against evdb's own API (pull, combine, combine_backward, push: what the module
does under autograd): two fresh tables take the same steps side by side, one through the
module and one through the API, which of the two goes first alternating step by step; both
compute the model's loss and its gradient each step (the API side had them precomputed
until git 8d14b26, which priced the module's `.sum()` and its backward, 2.1 ms of a 16 ms
step, as binding overhead). Run one after the other, whichever went first paid 5-10 ms a
step more on this VM, which writes fresh pages slowly (the growing table's) and reused ones
fast. Run from the repository root:
``.venv/bin/python bench/bench_growth.py``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable

import numpy as np
import torch
from _common import cpu_line, discard, print_table, versions_line, wall_line
from torch import nn

import evdb
from evdb.torch import EmbeddingBagCollection


def batches(args: argparse.Namespace) -> list[np.ndarray]:
    """(steps) arrays of (features, batch) int64 ids in [0, ids)."""
    rng = np.random.default_rng(0)
    shape = (args.features, args.batch)
    return [(rng.zipf(args.zipf_a, shape) - 1) % args.ids for _ in range(args.steps)]


def run_torch(args: argparse.Namespace, data: list[np.ndarray]) -> np.ndarray:
    bag = nn.EmbeddingBag(args.ids, args.dim, mode="sum", sparse=True)
    opt = torch.optim.Adagrad(bag.parameters(), lr=0.05, initial_accumulator_value=0.1, eps=1e-10)
    offsets = torch.arange(args.features * args.batch, dtype=torch.int64)
    times = []
    for ids in data:
        x = torch.from_numpy(ids.reshape(-1))
        t0 = time.perf_counter()
        out = bag(x, offsets).view(args.features, args.batch, args.dim)
        opt.zero_grad()
        out.sum().backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return np.array(times)


def new_table(args: argparse.Namespace) -> tuple[evdb.Database, evdb.Table]:
    db = evdb.open(tempfile.mkdtemp(prefix="evdb-growth-"))
    table = db.create_table(
        "ids",
        dim=args.dim,
        optimizer=evdb.optim.Adagrad(lr=0.05),
        initializer=evdb.init.Uniform(-0.05, 0.05, seed=0),
        disk=False,
    )
    return db, table


def raw_step(args: argparse.Namespace) -> tuple[evdb.Database, Callable[[np.ndarray], float]]:
    """The step on evdb's own API: one pull of the 26 features' ids, their bags summed, the
    model's loss (their sum) and its gradient (ones) turned into per-key gradients, one push;
    returns its time. The loss and a fresh gradient array are made each step, as the module's
    step makes them (``.sum()`` forward; its backward's expanded ones made contiguous)."""
    db, table = new_table(args)
    offsets = np.arange(args.features * args.batch, dtype=np.int64)

    def step(ids: np.ndarray) -> float:
        keys = ids.reshape(-1).astype(np.int64)
        t0 = time.perf_counter()
        p = table.pull(keys)
        pooled = p.combine(offsets, combiner="sum")
        pooled.sum()  # the loss
        grad = np.ones_like(pooled)  # d loss / d pooled
        table.push(p, p.combine_backward(grad, offsets, combiner="sum"))
        db.advance()
        return time.perf_counter() - t0

    return db, step


def module_step(
    args: argparse.Namespace,
) -> tuple[evdb.Database, evdb.Table, Callable[[np.ndarray], float]]:
    """The step through evdb.torch.EmbeddingBagCollection; returns its time."""
    db, table = new_table(args)
    names = [f"f{i}" for i in range(args.features)]
    # stack=True: the (26, B, dim) pooled output as one tensor (no stack of 26 views)
    ebc = EmbeddingBagCollection({n: table for n in names}, mode="sum", stack=True)
    offsets = torch.arange(args.batch, dtype=torch.int64)

    def step(ids: np.ndarray) -> float:
        keys = ids.astype(np.int64)  # the features share the id space, as the static table does
        features = {n: (torch.from_numpy(keys[i]), offsets) for i, n in enumerate(names)}
        t0 = time.perf_counter()
        ebc(features).sum().backward()
        db.advance()
        return time.perf_counter() - t0

    return db, table, step


def run_evdb(args: argparse.Namespace, data: list[np.ndarray]) -> tuple[np.ndarray, int]:
    db, table, step = module_step(args)
    times = np.array([step(ids) for ids in data])
    rows = len(table)
    discard(db)
    return times, rows


def run_side_by_side(
    args: argparse.Namespace, data: list[np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """The module's and the API's step times, on two tables trained side by side."""
    db_module, _, module = module_step(args)
    db_raw, raw = raw_step(args)
    t_module, t_raw = [], []
    for i, ids in enumerate(data):
        if i % 2:
            t_raw.append(raw(ids))
            t_module.append(module(ids))
        else:
            t_module.append(module(ids))
            t_raw.append(raw(ids))
    discard(db_module)
    discard(db_raw)
    return np.array(t_module), np.array(t_raw)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=90)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--features", type=int, default=26)
    parser.add_argument("--ids", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--zipf-a", type=float, default=1.1)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print("bench_growth: training while the table grows, against a static table")
    print(cpu_line())
    print(versions_line(torch.__version__))
    print(
        f"setup       {args.steps} steps of {args.batch:,} examples x {args.features} features x "
        f"1 id, Zipf({args.zipf_a}) over {args.ids:,} ids, dim {args.dim}, sum pooling, "
        f"Adagrad lr 0.05, {args.threads} threads; the evdb table starts empty"
    )
    data = batches(args)
    t_torch = run_torch(args, data)
    t_evdb, rows = run_evdb(args, data)
    t_module, t_raw = run_side_by_side(args, data)
    examples = args.batch * args.steps
    out = []
    for name, t in (
        ("torch (static, sized up front)", t_torch),
        ("evdb (grows from empty)", t_evdb),
        ("evdb.torch, side by side:", t_module),
        ("evdb's own API, same steps", t_raw),
    ):
        med = float(np.median(t))
        out.append(
            [
                name,
                f"{med * 1e3:.1f}",
                f"{t.max() * 1e3:.1f}",
                f"{t.max() / med:.1f}x",
                f"{int(np.argmax(t))}",
                f"{examples / t.sum() / 1e3:,.1f}K",
            ]
        )
    print()
    print_table(
        ["run", "median step ms", "max step ms", "max / median", "slowest step", "examples/s"],
        out,
    )
    print(
        f"evdb / torch: {np.median(t_torch) / np.median(t_evdb):.2f}x at the median step, "
        f"{t_torch.sum() / t_evdb.sum():.2f}x over all steps; evdb rows at the end: {rows:,}"
    )
    print(
        f"evdb.torch / evdb's own API: {t_raw.sum() / t_module.sum():.2f}x over all steps, "
        "side by side (the module's overhead: tensors, autograd, per-feature Python)"
    )
    worst = np.argsort(t_evdb)[::-1][:5]
    print(
        "evdb's slowest steps (step: ms): "
        + ", ".join(f"{i}: {t_evdb[i] * 1e3:.0f}" for i in worst)
    )
    print(wall_line())


if __name__ == "__main__":
    main()
