"""Training examples/s of the README example's DeepFM with evdb tables, against the same model
with static ``torch.nn.EmbeddingBag(sparse=True)`` tables sized to the vocabulary.

The model is ``examples/movielens.py``'s DeepFM (user and item embeddings of dim 16, per-key
biases, FM interaction, MLP, BCE; dense part trained by Adam). Three runs over the same
pre-drawn batches (``--batch`` examples, users and items drawn Zipf(``--zipf-a``) over
``--users`` and ``--items`` ids, scattered over the int64 key space, labels from hidden
biases). Each run takes ``--warmup`` untimed steps, then ``--rounds`` rounds of ``--steps``
timed steps; the three runs take turns within each round (the order rotating from round to
round), so a stall of this shared machine lands on all of them alike, and each evdb figure is
the median over the rounds of its ratio to the torch run of the same round:

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
import warnings
from contextlib import ExitStack
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
    for _ in range(args.warmup + args.rounds * args.steps):
        u = (np.minimum(rng.zipf(args.zipf_a, args.batch), args.users) - 1).astype(np.int64)
        i = (np.minimum(rng.zipf(args.zipf_a, args.batch), args.items) - 1).astype(np.int64)
        p = 1 / (1 + np.exp(-(user_bias[u] + item_bias[i])))
        y = torch.as_tensor(rng.random(args.batch) < p, dtype=torch.float32)
        batches.append((user_keys[u], item_keys[i], torch.from_numpy(u), torch.from_numpy(i), y))
    return batches


class TorchSide:
    """The static torch model and its optimizers, stepped over a range of the batches."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.model = StaticDeepFM(args.users, args.items, args.dim)
        self.sparse = torch.optim.Adagrad(
            self.model.sparse_parameters(), lr=0.05, initial_accumulator_value=0.1, eps=1e-10
        )
        self.dense = torch.optim.Adam(self.model.dense_parameters(), lr=1e-3)
        self.loss_fn = nn.BCEWithLogitsLoss()

    def steps(self, batches: list[tuple[Any, ...]]) -> None:
        for _, _, u, i, y in batches:
            loss = self.loss_fn(self.model(u, i), y)
            self.sparse.zero_grad()
            self.dense.zero_grad()
            loss.backward()
            self.sparse.step()
            self.dense.step()


class EvdbSide:
    """The example's DeepFM over evdb tables (all in DRAM, or DRAM for ``share`` of the rows
    with RocksDB under it), stepped over a range of the batches."""

    def __init__(
        self, args: argparse.Namespace, example: Any, share: float | None, stack: ExitStack
    ) -> None:
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        self.db = stack.enter_context(evdb.open(Path(tmp) / "db"))
        for name, n in (("user", args.users), ("item", args.items)):
            opts: dict[str, Any] = {"optimizer": evdb.optim.Adagrad(lr=0.05)}
            if share is None:
                opts.update(disk=False)
            else:
                opts.update(dram_rows=max(64, int(share * n)))
            self.db.create_table(name, dim=args.dim, **opts)
            self.db.create_table(f"{name}_bias", dim=1, initializer=evdb.init.Zeros(), **opts)
        example.DIM = args.dim
        self.model = example.DeepFM(self.db)
        self.dense = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.loss_fn = nn.BCEWithLogitsLoss()

    def steps(self, batches: list[tuple[Any, ...]]) -> None:
        for uk, ik, _, _, y in batches:
            loss = self.loss_fn(self.model(uk, ik), y)
            self.dense.zero_grad()
            loss.backward()
            self.dense.step()
            self.db.advance()

    def item_reads(self) -> tuple[int, int]:
        """(hits, misses) of the item table's DRAM tier so far."""
        dram = self.db.table("item").stats()["tiers"]["dram"]
        return int(dram["hits"]), int(dram["misses"])


def measure(
    args: argparse.Namespace, batches: list[tuple[Any, ...]], sides: dict[str, Any]
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Every side runs the warm-up steps, then ``--rounds`` rounds of ``--steps`` steps over
    the same batches, the sides taking turns within each round (the order rotating from round
    to round), so a stall of the machine lands on all of them alike. Returns each side's
    examples/s per round and the item table's DRAM hit rate over the timed steps (evdb)."""
    for side in sides.values():
        side.steps(batches[: args.warmup])
    before = {n: s.item_reads() for n, s in sides.items() if isinstance(s, EvdbSide)}
    rates: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for r in range(args.rounds):
        lo = args.warmup + r * args.steps
        chunk = batches[lo : lo + args.steps]
        for k in range(len(names)):
            name = names[(r + k) % len(names)]
            t0 = time.perf_counter()
            sides[name].steps(chunk)
            rates[name].append(len(chunk) * args.batch / (time.perf_counter() - t0))
    hit_rate = {}
    for name, (h0, m0) in before.items():
        h1, m1 = sides[name].item_reads()
        hit_rate[name] = (h1 - h0) / max(h1 - h0 + m1 - m0, 1)
    return rates, hit_rate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=1_000_000)
    parser.add_argument("--items", type=int, default=2_000_000)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--zipf-a", type=float, default=1.1)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--steps", type=int, default=24, help="timed steps per run per round")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="small sizes, a few seconds")
    args = parser.parse_args()
    if args.quick:
        args.users, args.items, args.warmup, args.steps, args.rounds = 20_000, 50_000, 5, 10, 3
    print("evdb PyTorch training benchmark (bench/bench_torch.py)")
    print(cpu_line())
    print(f"threads     torch {torch.get_num_threads()}")
    print(versions_line(torch.__version__))
    print(
        f"model       examples/movielens.py DeepFM, dim {args.dim}; users {args.users:,}, items "
        f"{args.items:,} (Zipf a={args.zipf_a}); batch {args.batch:,}; {args.warmup} warm-up + "
        f"{args.rounds} rounds x {args.steps} timed steps per run, runs alternating; sparse "
        "Adagrad lr 0.05, dense Adam"
    )
    # torch's sparse Adagrad builds its COO tensors without checks and warns about it once
    warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")
    example = load_example()
    batches = draw(args, np.random.default_rng(args.seed))
    torch.manual_seed(args.seed)
    with ExitStack() as stack:
        sides: dict[str, Any] = {
            "torch": TorchSide(args),
            "dram": EvdbSide(args, example, None, stack),
            "spill": EvdbSide(args, example, 0.1, stack),
        }
        rates, hit_rate = measure(args, batches, sides)
    ratios = {
        name: [a / b for a, b in zip(rates[name], rates["torch"], strict=True)]
        for name in ("dram", "spill")
    }

    def row(label: str, name: str) -> list[str]:
        if name == "torch":
            return [label, f"{np.median(rates[name]):,.0f}", "1.00x", "-", "-"]
        r = ratios[name]
        return [
            label,
            f"{np.median(rates[name]):,.0f}",
            f"{np.median(r):.2f}x",
            f"{min(r):.2f}-{max(r):.2f}x",
            f"{hit_rate[name]:.1%}",
        ]

    print()
    print_table(
        ["run", "examples/s", "vs torch", "rounds", "item DRAM hits"],
        [
            row("torch EmbeddingBag(sparse=True), static", "torch"),
            row("evdb, all rows in DRAM", "dram"),
            row("evdb, DRAM holds 10% of the rows", "spill"),
        ],
        first_left=1,
    )
    print(
        "(aim: evdb all in DRAM >= 1.0x the static torch tables. examples/s: median over the "
        "rounds;\n vs torch: median of the rounds' ratios to the torch run of the same round, "
        "rounds: their range;\n DRAM hits: share of each step's distinct item keys found in "
        "DRAM, the misses being keys\n seen for the first time (and, at 10%, rows on disk))"
    )
    print(wall_line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
