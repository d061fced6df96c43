"""Train examples/movielens.py's DeepFM on sharded tables, one table per feature, with one
grouped exchange a step.

``torchrun --standalone --nproc_per_node 2 examples/movielens_sharded.py --out DIR
[--payload bfloat16] [--pipeline]`` (or ``python examples/movielens_sharded.py`` on one
process). Four tables, one per feature: ``user`` and ``item`` (dim 16) and their first-order
biases ``user_bias`` and ``item_bias`` (dim 1), all Adagrad, with admission and a TTL, sharded
over the ranks by hashed buckets. Each step pulls and pushes the four of them in one grouped
exchange (``evdb.distributed.ShardedCollection``): 5 collectives a step, where per-table
calls make 20.

Without ``--pipeline`` the tables sit in one ``evdb.torch.EmbeddingBagCollection``, which
groups its sharded tables by itself. With ``--pipeline`` the loop drives the collection
directly through ``evdb.distributed.TrainPipeline``: batch i+1's keys go to their owners (which
start reading those rows from disk) while batch i computes; the rows and the model are the
same as without it. ``--payload bfloat16`` sends rows and gradients between ranks as
bfloat16 (half the bytes; the rows read are rounded, the stored rows stay float32).

The dense part (FM interaction, MLP, global bias) is wrapped in ``DistributedDataParallel``.
Per epoch rank 0 prints the training loss, the held-out AUC and examples/s. Data as in
``movielens.py`` (MovieLens 100K, or a synthetic Zipf click log with ``--synthetic`` or
without network access).
"""

from __future__ import annotations

import os

if "LOCAL_WORLD_SIZE" in os.environ and "NUMBA_NUM_THREADS" not in os.environ:
    _share = (os.cpu_count() or 1) // int(os.environ["LOCAL_WORLD_SIZE"])  # see movielens.py
    os.environ["NUMBA_NUM_THREADS"] = str(max(1, _share))

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import movielens  # the data, the AUC: shared with the README's example

import evdb
from evdb import distributed as evd
from evdb.torch import EmbeddingBagCollection

DIM = movielens.DIM
FEATURES = ("user", "item", "user_bias", "item_bias")  # one table each


class Dense(nn.Module):
    """DeepFM's dense part over the pooled features: biases + FM dot product + MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(2 * DIM, 64), nn.ReLU(), nn.Linear(64, 1))
        self.global_bias = nn.Parameter(torch.zeros(1))

    def forward(self, e: dict[str, torch.Tensor]) -> torch.Tensor:
        fm = (e["user"] * e["item"]).sum(dim=1)
        deep = self.mlp(torch.cat([e["user"], e["item"]], dim=1)).squeeze(1)
        biases = e["user_bias"].squeeze(1) + e["item_bias"].squeeze(1)
        out: torch.Tensor = self.global_bias + biases + fm + deep
        return out


def keys_of(users: np.ndarray, items: np.ndarray) -> dict[str, np.ndarray]:
    """A batch's keys per table: the bias tables share their feature's ids."""
    return {"user": users, "item": items, "user_bias": users, "item_bias": items}


def features(users: np.ndarray, items: np.ndarray) -> dict[str, tuple[torch.Tensor, ...]]:
    offsets = torch.arange(users.shape[0])
    return {n: (torch.from_numpy(k), offsets) for n, k in keys_of(users, items).items()}


def create_tables(db: Any, n_users: int, n_items: int) -> dict[str, Any]:
    common = dict(
        admission=evdb.admission.Counter(min_count=2),
        optimizer=evdb.optim.Adagrad(lr=0.05),
        ttl_steps=400,
    )
    tables = {}
    for name, n in (("user", n_users), ("item", n_items)):
        dram = max(64, int(0.3 * n))  # 30% of the ids in DRAM: the rest spills to RocksDB
        tables[name] = db.create_table(name, dim=DIM, dram_rows=dram, **common)
        tables[f"{name}_bias"] = db.create_table(
            f"{name}_bias", dim=1, dram_rows=dram, initializer=evdb.init.Zeros(), **common
        )
    return tables


def join() -> tuple[int, int]:
    """(rank, world size): under torchrun, join the job (gloo); (0, 1) on one process."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
        return dist.get_rank(), world
    return 0, 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="a directory every rank can reach")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--payload", choices=("float32", "bfloat16", "float16"), default="float32")
    parser.add_argument("--pipeline", action="store_true", help="keys of batch i+1 in flight")
    parser.add_argument("--synthetic", action="store_true", help="skip MovieLens")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    rank, world = join()
    if world > 1 and args.out is None:
        parser.error("--out is needed under torchrun: a directory every rank can reach")
    if world == 1:  # a sharded database needs a process group: a group of one
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    out = args.out or Path(tempfile.mkdtemp(prefix="evdb-movielens-sharded-"))
    ratings = None if args.synthetic or rank != 0 else movielens.fetch_movielens()
    dist.barrier()  # rank 0 filled the cache first
    if rank != 0 and not args.synthetic:
        ratings = movielens.fetch_movielens()
    source, users, items, labels = movielens.load(ratings, args.seed)
    split = int(0.8 * users.shape[0])
    db = evd.open(out / "db")
    tables = create_tables(db, np.unique(users).shape[0], np.unique(items).shape[0])
    coll = evd.ShardedCollection([tables[f] for f in FEATURES], payload_dtype=args.payload)
    ebc = EmbeddingBagCollection(tables, mode="sum", payload_dtype=args.payload)
    model = Dense()
    trained: nn.Module = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    dense = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.BCEWithLogitsLoss(reduction="sum")
    pipe = evd.TrainPipeline(coll) if args.pipeline else None
    rng = np.random.default_rng(args.seed)
    if rank == 0:
        print(
            f"{source}: {users.shape[0]:,} examples; {world} rank(s), tables {list(FEATURES)} "
            f"in one grouped exchange ({args.payload} payloads"
            + (", pipelined)" if pipe is not None else ")")
        )
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(split)
        parts = [order[s : s + args.batch] for s in range(0, split, args.batch)]
        mine = [np.array_split(b, world)[rank] for b in parts]  # this rank's part of each batch
        losses, t0 = [], time.perf_counter()
        steps: Any
        if pipe is not None:
            steps = pipe.run(mine, keys_of=lambda b: keys_of(users[b], items[b]))
        else:
            steps = ((b, None) for b in mine)
        for (b, pulled), whole in zip(steps, parts, strict=True):
            offsets = np.arange(b.shape[0])
            if pulled is None:  # the module pulls in forward and pushes in backward
                pooled = ebc(features(users[b], items[b]))
            else:  # the rows are here already: combine them, push their gradients after
                pooled = {
                    n: torch.from_numpy(pulled[n].combine(offsets, combiner="sum")).requires_grad_(
                        True
                    )
                    for n in FEATURES
                }
            logits = trained(pooled)
            # each rank's share of the global batch's mean loss: the rows' gradients, summed
            # at their owners, are one process's; DDP's averaged dense ones are scaled back up
            loss = loss_fn(logits, torch.as_tensor(labels[b], dtype=torch.float32))
            loss = loss / whole.shape[0]
            dense.zero_grad()
            loss.backward()
            if pulled is not None:
                coll.push(
                    pulled,
                    {
                        n: pulled[n].combine_backward(
                            pooled[n].grad.numpy(),  # type: ignore[union-attr]
                            offsets,
                            combiner="sum",
                        )
                        for n in FEATURES
                    },
                )
            if world > 1:
                for p in model.parameters():
                    p.grad.mul_(world)  # type: ignore[union-attr]
            dense.step()
            db.advance()
            losses.append(float(loss.detach()) * world)
        rate = split / (time.perf_counter() - t0)
        held_out = evaluate(ebc, model, users[split:], items[split:], labels[split:])
        if rank == 0:
            print(
                f"epoch {epoch}: train loss {np.mean(losses):.4f}, held-out AUC {held_out:.4f}, "
                f"{rate:,.0f} examples/s"
            )
    if pipe is not None:
        pipe.close()
    db.close()
    return 0


def evaluate(
    ebc: EmbeddingBagCollection,
    model: Dense,
    users: np.ndarray,
    items: np.ndarray,
    labels: np.ndarray,
) -> float:
    """Held-out AUC; every rank scores the whole set (lookups are collective)."""
    ebc.eval()
    with torch.no_grad():
        scores = np.concatenate(
            [
                model(ebc(features(users[s : s + 4096], items[s : s + 4096]))).numpy()
                for s in range(0, users.shape[0], 4096)
            ]
        )
    ebc.train()
    return movielens.auc(labels, scores)


if __name__ == "__main__":
    raise SystemExit(main())
