"""Checkpoints: full and incremental copies that open to the same state, checksums that catch
damage, read-only serving of a checkpoint, and atomicity under SIGKILL."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import evdb

DIM = 4


def train(db: evdb.Database, steps: int, seed: int, key_range: int = 400) -> None:
    t = db.table("t")
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        p = t.pull(rng.integers(0, key_range, 64))
        t.push(p, rng.standard_normal((p.keys.shape[0], DIM)).astype(np.float32))
        db.advance()


def new_db(path: Path) -> evdb.Database:
    db = evdb.open(path)
    db.create_table(
        "t",
        dim=DIM,
        dram_rows=30,
        admission=evdb.admission.Counter(min_count=2),
        optimizer=evdb.optim.Adagrad(lr=0.1),
    )
    db.create_table("u", dim=2, disk=False).upsert([1, 2], [[1.0, 1.0], [2.0, 2.0]])
    return db


def state(db: evdb.Database) -> dict:
    out: dict = {"step": db.step, "tables": db.tables()}
    for name in db.tables():
        t = db.table(name)
        keys = np.sort(np.concatenate([k for k, _ in t.items()] or [np.empty(0, np.int64)]))
        found, recs = t.read_records(keys)
        assert found.all()
        out[name] = (
            len(t),
            keys.tolist(),
            recs.values.tobytes(),
            recs.slots.tobytes(),
            recs.freq.tolist(),
            recs.last_step.tolist(),
        )
        pending = t.summary().admission.to_arrays()
        out[name + ".pending"] = (
            sorted(zip(pending["keys"].tolist(), pending["counts"].tolist(), strict=True))
            if "keys" in pending
            else None
        )
    return out


def test_a_full_checkpoint_opens_to_the_state_it_was_taken_at(tmp_path: Path) -> None:
    with new_db(tmp_path / "db") as db:
        train(db, 20, seed=0)
        manifest = db.checkpoint(tmp_path / "ckpt")
        want = state(db)
        train(db, 10, seed=1)  # later training does not reach the checkpoint
        assert state(db) != want
    assert manifest["kind"] == "full" and manifest["step"] == 20
    assert evdb.checkpoint.verify(tmp_path / "ckpt")["kind"] == "full"
    with evdb.open(tmp_path / "ckpt", read_only=True) as served:
        assert state(served) == want
        with pytest.raises(evdb.ReadOnlyError, match="read-only"):
            served.table("t").upsert([1], [[0.0] * DIM])
    evdb.checkpoint.verify(tmp_path / "ckpt")  # serving it changed no file
    with evdb.open(tmp_path / "work", restore=tmp_path / "ckpt") as resumed:
        assert state(resumed) == want
        train(resumed, 3, seed=2)
    evdb.checkpoint.verify(tmp_path / "ckpt")  # resuming from it left it intact


def test_incremental_checkpoints_store_only_changes_and_open_like_full_ones(
    tmp_path: Path,
) -> None:
    with new_db(tmp_path / "db") as db:
        train(db, 30, seed=0)
        db.checkpoint(tmp_path / "base")
        train(db, 5, seed=3, key_range=40)  # touches a few rows
        t = db.table("t")
        t.delete(np.arange(0, 400, 7))
        t.upsert([10_000], [[9.0] * DIM])
        db.drop_table("u")
        db.create_table("u", dim=2, disk=False).upsert([5], [[5.0, 5.0]])  # a new incarnation
        inc = db.checkpoint(tmp_path / "inc1", base=tmp_path / "base")
        db.checkpoint(tmp_path / "full1")
        want1 = state(db)
        train(db, 3, seed=4, key_range=60)
        inc2 = db.checkpoint(tmp_path / "inc2", base=tmp_path / "inc1")
        want2 = state(db)
    assert inc["kind"] == "incremental"
    assert 0 < inc["changed_rows"]["t"] < inc["tables"]["t"]["rows"]
    assert inc2["changed_rows"]["t"] < inc2["tables"]["t"]["rows"]
    for name, want in (("full1", want1), ("inc1", want1), ("inc2", want2)):
        with evdb.open(tmp_path / f"open-{name}", restore=tmp_path / name) as db:
            assert state(db) == want, name
    assert evdb.checkpoint.verify(tmp_path / "inc2")["kind"] == "incremental"  # bases intact


def test_a_damaged_checkpoint_fails_loudly_naming_the_file(tmp_path: Path) -> None:
    with new_db(tmp_path / "db") as db:
        train(db, 10, seed=0)
        db.checkpoint(tmp_path / "ckpt")
    for damage in ("flip", "truncate", "remove"):
        copy = tmp_path / damage
        shutil.copytree(tmp_path / "ckpt", copy)
        victim = max(copy.rglob("*.sst"), key=lambda p: p.stat().st_size)
        data = bytearray(victim.read_bytes())
        if damage == "flip":
            data[len(data) // 2] ^= 0xFF
            victim.write_bytes(bytes(data))
        elif damage == "truncate":
            victim.write_bytes(bytes(data[:-10]))
        else:
            victim.unlink()
        with pytest.raises(evdb.CorruptDataError, match=victim.name):
            evdb.open(tmp_path / f"work-{damage}", restore=copy)
        with pytest.raises(evdb.CorruptDataError, match=victim.name):
            evdb.open(copy, read_only=True)


def test_bad_checkpoint_arguments_change_nothing(tmp_path: Path) -> None:
    with new_db(tmp_path / "db") as db:
        (tmp_path / "taken").mkdir()
        with pytest.raises(evdb.InvalidArgumentError, match=r"dest: .* already exists"):
            db.checkpoint(tmp_path / "taken")
        with pytest.raises(evdb.InvalidArgumentError, match=r"base: .* is not a checkpoint"):
            db.checkpoint(tmp_path / "x", base=tmp_path / "db")
        assert not (tmp_path / "x").exists()


CHILD = """
import sys
from pathlib import Path
import numpy as np
import evdb
root = Path(sys.argv[1])
db = evdb.open(root / "db")
t = db.create_table("t", dim=16, dram_rows=1000)
t.upsert(np.arange(100_000), np.ones((100_000, 16)))
db.checkpoint(root / "c0")
print("ready", flush=True)
for i in range(1, 1000):
    t.upsert(np.arange(i, 100_000, 97), np.full((len(range(i, 100_000, 97)), 16), float(i)))
    db.checkpoint(root / f"c{i}")
"""


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.13, 0.31])
def test_a_checkpoint_killed_midway_leaves_no_half_copy(tmp_path: Path, delay: float) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        time.sleep(delay)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    done = sorted(p for p in tmp_path.glob("c*") if p.is_dir())
    assert done, "c0 was complete before the kill"
    for ckpt in done:  # every checkpoint that exists is complete and opens
        evdb.checkpoint.verify(ckpt)
        with evdb.open(ckpt, read_only=True) as db:
            assert len(db.table("t")) == 100_000
