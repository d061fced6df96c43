"""Training examples/s of the README example's DeepFM with evdb tables, against the same model
with static ``torch.nn.EmbeddingBag(sparse=True)`` tables sized to the vocabulary.

The model is ``examples/movielens.py``'s DeepFM (user and item embeddings of dim 16, per-key
biases, FM interaction, MLP, BCE; dense part trained by Adam). Three runs over the same
pre-drawn batches (``--batch`` examples, users and items drawn Zipf(``--zipf-a``) over
``--users`` and ``--items`` ids, scattered over the int64 key space, labels from hidden
biases), each ``--warmup`` untimed steps then ``--steps`` timed ones:

* ``torch``: ``nn.EmbeddingBag(vocab, dim, mode="sum", sparse=True)`` tables, ids remapped to
  ``0..vocab-1`` before the clock starts (no hashing at all: the static limit), and
  ``torch.optim.Adagrad`` (lr 0.05, initial accumulator 0.1, eps 1e-10) on them, which
  coalesces the sparse gradients;
* ``evdb, all in DRAM``: evdb tables (``disk=False``, no capacity) with the same Adagrad
  rule fused into ``push``, keys given as raw int64 ids;
* ``evdb, DRAM 10%``: the same with ``dram_rows`` = 10% of each vocabulary and the RocksDB
  tier under it.

Admission is off (admit-all) and there is no TTL, so all three learn the same rows; the evdb
runs do what a static table cannot (hash raw ids, grow without a vocabulary, spill to disk).
Run from the repository root: ``.venv/bin/python bench/bench_torch.py [--quick]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _common import cpu_line, print_table, versions_line, wall_line
from torch import nn

import evdb

ROOT = Path(__file__).resolve().parents[1]


def load_example() -> Any:
    spec = importlib.util.spec_from_file_location(
        "movielens_example", ROOT / "examples" / "movielens.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class StaticDeepFM(nn.Module):
    """The example's DeepFM over static torch tables indexed 0..vocab-1."""

    def __init__(self, n_users: int, n_items: int, dim: int) -> None:
        super().__init__()

        def bag(n: int, d: int, std: float) -> nn.EmbeddingBag:
            e = nn.EmbeddingBag(n, d, mode="sum", sparse=True)
            nn.init.normal_(e.weight, 0.0, std) if std else nn.init.zeros_(e.weight)
            return e

        self.user, self.item = bag(n_users, dim, 0.01), bag(n_items, dim, 0.01)
        self.user_bias, self.item_bias = bag(n_users, 1, 0.0), bag(n_items, 1, 0.0)
        self.mlp = nn.Sequential(nn.Linear(2 * dim, 64), nn.ReLU(), nn.Linear(64, 1))
        self.global_bias = nn.Parameter(torch.zeros(1))

    def sparse_parameters(self) -> list[nn.Parameter]:
        return [m.weight for m in (self.user, self.item, self.user_bias, self.item_bias)]

    def dense_parameters(self) -> list[nn.Parameter]:
        return [*self.mlp.parameters(), self.global_bias]

    def forward(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        offsets = torch.arange(users.shape[0])
        u, i = self.user(users, offsets), self.item(items, offsets)
        fm = (u * i).sum(dim=1)
        deep = self.mlp(torch.cat([u, i], dim=1)).squeeze(1)
        bias = self.user_bias(users, offsets).squeeze(1) + self.item_bias(items, offsets).squeeze(1)
        return self.global_bias + bias + fm + deep


def draw(args: argparse.Namespace, rng: np.random.Generator) -> list[tuple[Any, ...]]:
    """Pre-drawn batches: raw int64 keys for evdb, 0-based indices for torch, labels."""
    user_keys = rng.integers(-(2**62), 2**62, args.users)
    item_keys = rng.integers(-(2**62), 2**62, args.items)
    user_bias, item_bias = rng.standard_normal(args.users), rng.standard_normal(args.items)
    batches = []
    for _ in range(args.warmup + args.steps):
        u = (np.minimum(rng.zipf(args.zipf_a, args.batch), args.users) - 1).astype(np.int64)
        i = (np.minimum(rng.zipf(args.zipf_a, args.batch), args.items) - 1).astype(np.int64)
        p = 1 / (1 + np.exp(-(user_bias[u] + item_bias[i])))
        y = torch.as_tensor(rng.random(args.batch) < p, dtype=torch.float32)
        batches.append((user_keys[u], item_keys[i], torch.from_numpy(u), torch.from_numpy(i), y))
    return batches


def run_torch(args: argparse.Namespace, batches: list[tuple[Any, ...]]) -> float:
    model = StaticDeepFM(args.users, args.items, args.dim)
    sparse = torch.optim.Adagrad(
        model.sparse_parameters(), lr=0.05, initial_accumulator_value=0.1, eps=1e-10
    )
    dense = torch.optim.Adam(model.dense_parameters(), lr=1e-3)
    loss_fn = nn.BCEWithLogitsLoss()
    t0 = 0.0
    for step, (_, _, u, i, y) in enumerate(batches):
        if step == args.warmup:
            t0 = time.perf_counter()
        loss = loss_fn(model(u, i), y)
        sparse.zero_grad()
        dense.zero_grad()
        loss.backward()
        sparse.step()
        dense.step()
    return args.steps * args.batch / (time.perf_counter() - t0)


def run_evdb(
    args: argparse.Namespace, batches: list[tuple[Any, ...]], example: Any, share: float | None
) -> tuple[float, float]:
    """examples/s, and the DRAM hit rate of the item table over the timed steps."""
    with tempfile.TemporaryDirectory() as tmp, evdb.open(Path(tmp) / "db") as db:
        for name, n in (("user", args.users), ("item", args.items)):
            opts: dict[str, Any] = {"optimizer": evdb.optim.Adagrad(lr=0.05)}
            if share is None:
                opts.update(disk=False)
            else:
                opts.update(dram_rows=max(64, int(share * n)))
            db.create_table(name, dim=args.dim, **opts)
            db.create_table(f"{name}_bias", dim=1, initializer=evdb.init.Zeros(), **opts)
        example.DIM = args.dim
        model = example.DeepFM(db)
        dense = torch.optim.Adam(model.parameters(), lr=1e-3)
        loss_fn = nn.BCEWithLogitsLoss()
        t0, before = 0.0, {}
        for step, (uk, ik, _, _, y) in enumerate(batches):
            if step == args.warmup:
                before = dict(db.table("item").stats()["tiers"]["dram"])
                t0 = time.perf_counter()
            loss = loss_fn(model(uk, ik), y)
            dense.zero_grad()
            loss.backward()
            dense.step()
            db.advance()
        rate = args.steps * args.batch / (time.perf_counter() - t0)
        after = db.table("item").stats()["tiers"]["dram"]
        hits, misses = after["hits"] - before["hits"], after["misses"] - before["misses"]
        return rate, hits / max(hits + misses, 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=1_000_000)
    parser.add_argument("--items", type=int, default=2_000_000)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--zipf-a", type=float, default=1.1)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="small sizes, a few seconds")
    args = parser.parse_args()
    if args.quick:
        args.users, args.items, args.warmup, args.steps = 20_000, 50_000, 5, 20
    print("evdb PyTorch training benchmark (bench/bench_torch.py)")
    print(cpu_line())
    print(f"threads     torch {torch.get_num_threads()}")
    print(versions_line(torch.__version__))
    print(
        f"model       examples/movielens.py DeepFM, dim {args.dim}; users {args.users:,}, items "
        f"{args.items:,} (Zipf a={args.zipf_a}); batch {args.batch:,}; {args.warmup} warm-up + "
        f"{args.steps} timed steps; sparse Adagrad lr 0.05, dense Adam"
    )
    example = load_example()
    batches = draw(args, np.random.default_rng(args.seed))
    torch.manual_seed(args.seed)
    static = run_torch(args, batches)
    dram, dram_hit = run_evdb(args, batches, example, None)
    spill, hit = run_evdb(args, batches, example, 0.1)
    rows = [
        ["torch EmbeddingBag(sparse=True), static", f"{static:,.0f}", "1.00x", "-"],
        ["evdb, all rows in DRAM", f"{dram:,.0f}", f"{dram / static:.2f}x", f"{dram_hit:.1%}"],
        [
            "evdb, DRAM holds 10% of the rows",
            f"{spill:,.0f}",
            f"{spill / static:.2f}x",
            f"{hit:.1%}",
        ],
    ]
    print()
    print_table(["run", "examples/s", "vs torch", "item DRAM hits"], rows, first_left=1)
    print(
        "(aim: evdb all in DRAM >= 1.0x the static torch tables; DRAM hits: share of each "
        "step's distinct\n item keys found in DRAM, the misses being keys seen for the first "
        "time (and, at 10%, rows on disk))"
    )
    print(wall_line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
