"""What each rank runs in tests/test_dcp.py's sharded test (spawned by ``harness.run_ranks``):
train, save with DCP, train on, load with DCP in place, train the same steps again."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

import evdb
from evdb import distributed as evd
from evdb import torch_checkpoint as etc
from evdb.errors import ShardLayoutError
from evdb.torch import EmbeddingBagCollection

DIM, VOCAB, BATCH = 4, 40, 8


def _batch(step: int, rank: int) -> tuple[dict[str, Any], torch.Tensor]:
    rng = np.random.default_rng(100 * step + rank)  # each rank its own part of the batch
    feats = {}
    for name in ("user", "item"):
        lens = rng.integers(1, 3, BATCH)
        keys = torch.from_numpy(rng.integers(0, VOCAB, int(lens.sum())))
        feats[name] = (keys, torch.from_numpy(np.concatenate([[0], np.cumsum(lens)[:-1]])))
    return feats, torch.from_numpy(rng.standard_normal(BATCH).astype(np.float32))


def _rows(table: Any) -> list[list[Any]]:
    out = []
    for keys, recs in table.local.records():
        out.extend([k, r.tobytes().hex()] for k, r in zip(keys.tolist(), recs.pack(), strict=True))
    return sorted(out)


def save_train_load_train(rank: int, world: int, out: Path) -> Any:
    warnings.filterwarnings("ignore")
    db = evd.open(out / "db")
    db.create_table(
        "user",
        DIM,
        optimizer=evdb.optim.Adagrad(lr=0.2),
        admission=evdb.admission.Counter(min_count=2),
        dram_rows=8,
    )
    db.create_table("item", DIM, optimizer=evdb.optim.Adam(lr=0.05))
    emb = EmbeddingBagCollection(
        {"user": db.table("user"), "item": db.table("item")}, mode="sum", concat=True
    )
    torch.manual_seed(0)
    head = torch.nn.Linear(2 * DIM, 1)
    model = torch.nn.ModuleDict({"emb": emb, "head": head})
    optim = torch.optim.SGD(head.parameters(), lr=0.05)

    def train(steps: range) -> list[float]:
        losses = []
        for step in steps:
            feats, y = _batch(step, rank)
            loss = torch.nn.functional.mse_loss(head(emb(feats)).squeeze(1), y)
            optim.zero_grad()
            loss.backward()
            for p in head.parameters():  # what DDP does: the mean of the ranks' gradients
                assert p.grad is not None
                torch.distributed.all_reduce(p.grad)
                p.grad /= world
            optim.step()
            db.advance()
            global_loss = loss.detach().clone()
            torch.distributed.all_reduce(global_loss)
            losses.append(global_loss.item())
        return losses

    train(range(3))
    ckpt = out / "ckpt"
    etc.save({"model": model, "optim": optim, "tables": emb}, ckpt)
    first = train(range(3, 7))
    rows_first = {n: _rows(db.table(n)) for n in db.tables()}
    etc.load({"model": model, "optim": optim, "tables": db}, ckpt)
    assert db.step == 3
    second = train(range(3, 7))
    rows_second = {n: _rows(db.table(n)) for n in db.tables()}
    db.create_table("extra", 2)  # the checkpoint's tables are no longer this database's
    try:
        db.restore_in_place(ckpt / "evdb")
        refused = ""
    except ShardLayoutError as e:
        refused = str(e)
    db.close()
    return [first, second, rows_first, rows_second, refused]
