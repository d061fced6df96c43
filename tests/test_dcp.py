"""evdb.torch_checkpoint: one DCP save and one DCP load of the model, its optimizer and the
tables resume training bit for bit, into the same live objects (DCP loads in place) and into
new ones; 2 gloo ranks over a sharded database do the same."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import evdb

torch = pytest.importorskip("torch")
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.state_dict import (  # noqa: E402
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful  # noqa: E402

from evdb import torch_checkpoint as etc  # noqa: E402
from evdb.errors import InvalidArgumentError  # noqa: E402
from evdb.torch import EmbeddingBagCollection  # noqa: E402
from tests.distributed import dcp_workers  # noqa: E402
from tests.distributed.harness import run_ranks  # noqa: E402

DIM, VOCAB, BATCH = 4, 30, 12
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def make_tables(db: evdb.Database) -> None:
    db.create_table(
        "user",
        DIM,
        optimizer=evdb.optim.Adagrad(lr=0.2),
        admission=evdb.admission.Counter(min_count=2),
        ttl_steps=3,
        dram_rows=8,  # spills to disk: the rows below and the DRAM tier's choice are state
    )
    db.create_table("item", DIM, optimizer=evdb.optim.Adam(lr=0.05))


class Model(torch.nn.Module):
    def __init__(self, db: evdb.Database) -> None:
        super().__init__()
        self.emb = EmbeddingBagCollection(
            {"user": db.table("user"), "item": db.table("item")}, mode="sum", concat=True
        )
        torch.manual_seed(0)
        self.head = torch.nn.Linear(2 * DIM, 1)

    def forward(self, feats: dict[str, Any]) -> torch.Tensor:
        return self.head(self.emb(feats)).squeeze(1)


class DenseOptim(Stateful):
    """The dense optimizer through DCP's own state_dict helpers (a fresh Adam has no state
    for dcp.load to fill in; set_optimizer_state_dict creates it)."""

    def __init__(self, model: torch.nn.Module, optim: torch.optim.Optimizer) -> None:
        self.model, self.optim = model, optim

    def state_dict(self) -> dict[str, Any]:
        return get_optimizer_state_dict(self.model, self.optim)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_optimizer_state_dict(self.model, self.optim, state_dict)


def batch(step: int) -> tuple[dict[str, Any], torch.Tensor]:
    rng = np.random.default_rng(step)
    feats = {}
    for name in ("user", "item"):
        lens = rng.integers(1, 3, BATCH)
        keys = torch.from_numpy(rng.integers(0, VOCAB, int(lens.sum())))
        feats[name] = (keys, torch.from_numpy(np.concatenate([[0], np.cumsum(lens)[:-1]])))
    return feats, torch.from_numpy(rng.standard_normal(BATCH).astype(np.float32))


def train(db, model, optim, steps: range) -> list[float]:
    losses = []
    for step in steps:
        if step == 5:  # a schedule's change of a table's lr, after the save
            model.emb.fused_optimizer.param_groups[0]["lr"] = 0.1
        feats, y = batch(step)
        loss = torch.nn.functional.mse_loss(model(feats), y)
        optim.zero_grad()
        loss.backward()
        optim.step()
        db.advance()
        losses.append(loss.item())
    return losses


def rows_of(table: Any) -> list[tuple[int, bytes]]:
    """Every stored row's whole record (values, slots, freq, last_step, version), by key."""
    out = []
    for keys, recs in table.records():
        out.extend(zip(keys.tolist(), (r.tobytes() for r in recs.pack()), strict=True))
    return sorted(out)


def state_of(db, model) -> dict[str, Any]:
    keys = np.arange(VOCAB)
    out: dict[str, Any] = {
        "step": db.step,
        "head": [p.detach().clone() for p in model.parameters()],
    }
    for name in db.tables():
        t = db.table(name)
        out[name] = (rows_of(t), t.lookup(keys).tobytes(), t.learning_rate, t.stats()["admission"])
    return out


def assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["step"] == b["step"]
    for x, y in zip(a["head"], b["head"], strict=True):
        assert torch.equal(x, y)
    for name in ("user", "item"):
        assert a[name] == b[name], name


@pytest.mark.parametrize("entry", ["database", "module"])
def test_dcp_save_then_load_in_place_resumes_bit_equal(tmp_path: Path, entry: str) -> None:
    db = evdb.open(tmp_path / "db")
    make_tables(db)
    model = Model(db)
    optim = torch.optim.Adam(model.parameters(), lr=0.01)
    train(db, model, optim, range(4))
    ckpt = tmp_path / "ckpt"
    tables = db if entry == "database" else model.emb  # the module finds its tables' database
    etc.save({"model": model, "optim": DenseOptim(model, optim), "tables": tables}, ckpt)
    assert (ckpt / ".metadata").is_file() and (ckpt / "evdb" / "MANIFEST.json").is_file()
    first = train(db, model, optim, range(4, 9))
    after_first = state_of(db, model)

    etc.load({"model": model, "optim": DenseOptim(model, optim), "tables": tables}, ckpt)
    assert db.step == 4
    second = train(db, model, optim, range(4, 9))
    assert first == second
    assert_same(after_first, state_of(db, model))
    db.close()


def test_dcp_load_into_new_objects_resumes_bit_equal(tmp_path: Path) -> None:
    db = evdb.open(tmp_path / "db")
    make_tables(db)
    model = Model(db)
    optim = torch.optim.Adam(model.parameters(), lr=0.01)
    train(db, model, optim, range(3))
    ckpt = tmp_path / "ckpt"
    etc.save({"model": model, "optim": DenseOptim(model, optim), "tables": db}, ckpt)
    first = train(db, model, optim, range(3, 8))
    after_first = state_of(db, model)
    db.close()

    db2 = evdb.open(tmp_path / "db2")  # a new process's start: the script creates the tables
    make_tables(db2)
    db2.create_table("stray", 2)  # not in the checkpoint: dropped by the load
    model2 = Model(db2)
    torch.nn.init.zeros_(model2.head.weight)  # the load must replace it
    optim2 = torch.optim.Adam(model2.parameters(), lr=0.01)
    user = db2.table("user")
    etc.load({"model": model2, "optim": DenseOptim(model2, optim2), "tables": db2}, ckpt)
    assert db2.table("user") is user and db2.tables() == ["item", "user"]
    assert first == train(db2, model2, optim2, range(3, 8))
    assert_same(after_first, state_of(db2, model2))
    db2.close()


def test_direct_dcp_calls_with_the_wrapper_and_refusals(tmp_path: Path) -> None:
    db = evdb.open(tmp_path / "db")
    make_tables(db)
    db.table("item").upsert([1, 2], np.ones((2, DIM), np.float32))
    ckpt = tmp_path / "ckpt"
    dcp.save({"tables": etc.DcpTables(db, ckpt)}, checkpoint_id=ckpt)
    db.table("item").upsert([3], np.ones((1, DIM), np.float32))
    _ = db.advance(2)
    dcp.load({"tables": etc.DcpTables(db, ckpt, loading=True)}, checkpoint_id=ckpt)
    assert (db.step, len(db.table("item"))) == (0, 2)
    with pytest.raises(InvalidArgumentError, match="already"):  # the same id twice
        dcp.save({"tables": etc.DcpTables(db, ckpt)}, checkpoint_id=ckpt)
    _ = db.advance(3)
    mixed = etc.DcpTables(db, ckpt, loading=True)
    with pytest.raises(InvalidArgumentError, match="at step 0, the DCP state at 5"):
        mixed.load_state_dict({"evdb": "evdb", "step": 5})  # another save's DCP files
    assert db.step == 3  # refused before anything changed
    with pytest.raises(InvalidArgumentError, match="no evdb entry"):
        etc.save({"model": torch.nn.Linear(1, 1)}, tmp_path / "other")
    with pytest.raises(InvalidArgumentError, match="tables must be an evdb Database"):
        etc.DcpTables(object(), ckpt)
    with pytest.raises(InvalidArgumentError, match="tables of 0 databases"):
        etc.DcpTables(torch.nn.Linear(1, 1), ckpt)
    db.close()


def test_restore_in_place_refuses_itself_and_a_non_checkpoint(tmp_path: Path) -> None:
    db = evdb.open(tmp_path / "db")
    make_tables(db)
    with pytest.raises(InvalidArgumentError, match="not an evdb checkpoint"):
        db.restore_in_place(tmp_path)
    assert db.tables() == ["item", "user"]  # unchanged, still open
    db.table("item").upsert([1], np.ones((1, DIM), np.float32))
    db.close()


def test_two_gloo_ranks_save_and_load_a_sharded_job_bit_equal(tmp_path: Path) -> None:
    results = run_ranks(dcp_workers.save_train_load_train, 2, tmp_path, timeout=240)
    for rank, (first, second, rows_first, rows_second, refused) in enumerate(results):
        assert first == second, rank
        assert rows_first == rows_second, rank
        assert "restore in place needs the same tables and placements" in refused, rank
    assert results[0][0] == results[1][0]  # every rank sees the same global loss


def test_a_failed_restore_comes_back_to_the_state_it_began_with(
    tmp_path: Path, monkeypatch
) -> None:
    from evdb import checkpoint_restore

    db = evdb.open(tmp_path / "db")
    make_tables(db)
    item = db.table("item")
    item.upsert([1], np.ones((1, DIM), np.float32))
    db.checkpoint(tmp_path / "ckpt")
    item.upsert([2], np.full((1, DIM), 2.0, np.float32))  # not flushed: the restore flushes it

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise OSError("disk gone")

    monkeypatch.setattr(checkpoint_restore, "materialize", broken)
    with pytest.raises(OSError, match="disk gone"):
        db.restore_in_place(tmp_path / "ckpt")
    assert db.table("item") is item and sorted(k for k, _ in rows_of(item)) == [1, 2]
    item.upsert([3], np.ones((1, DIM), np.float32))  # the same object writes on
    monkeypatch.undo()
    damaged = tmp_path / "ckpt" / "MANIFEST.json"
    damaged.write_text(damaged.read_text().replace('"step"', '"stpe"'))
    with pytest.raises(evdb.CorruptDataError):  # verified before anything changes
        db.restore_in_place(tmp_path / "ckpt")
    assert sorted(k for k, _ in rows_of(item)) == [1, 2, 3]
    db.close()
