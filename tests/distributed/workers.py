"""What each rank runs in the sharded tests (spawned by ``harness.run_ranks``), and the
single-process reference they are compared against. Every function here is deterministic in
its arguments, so the parent can replay the same global batches in one process."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import torch

import evdb
from evdb import distributed as evd

DIM = 4
SPACE = 48  # ids drawn from [0, SPACE): "div" needs the id space
STEPS = 8


def table_options() -> dict[str, dict[str, Any]]:
    common = {"admission": evdb.admission.Counter(min_count=2), "ttl_steps": 3}
    return {
        "sgd": {"optimizer": evdb.optim.SGD(lr=0.1), **common},
        "adagrad": {"optimizer": evdb.optim.Adagrad(lr=0.1), **common},
        "adam": {"optimizer": evdb.optim.Adam(lr=0.05), **common},
    }


def global_batch(step: int, n: int = 60) -> np.ndarray:
    """The step's global batch: skewed ids (some repeat, some are seen once)."""
    rng = np.random.default_rng(1000 + step)
    return np.minimum(rng.zipf(1.3, n) - 1 + rng.integers(0, 6, n), SPACE - 1).astype(np.int64)


def grads_for(keys: np.ndarray, step: int) -> np.ndarray:
    """A gradient per position, a function of the key and the step only."""
    cols = np.arange(DIM)
    return (np.sin(keys[:, None] * 0.37 + step + cols) * 0.5).astype(np.float32)


def part(keys: np.ndarray, rank: int, world: int) -> np.ndarray:
    return np.array_split(keys, world)[rank]


def lookup_keys() -> tuple[np.ndarray, np.ndarray]:
    keys = np.arange(-2, SPACE + 2, dtype=np.int64) % SPACE  # every id, some twice
    return keys, np.array([0, 3, 10, 11, 30], dtype=np.int64)


def train_reference(root: Path, steps: int = STEPS) -> evdb.Database:
    """One process pulling and pushing each whole global batch."""
    db = evdb.open(root)
    tables = {n: db.create_table(n, dim=DIM, **o) for n, o in table_options().items()}
    for step in range(steps):
        keys = global_batch(step)
        for t in tables.values():
            p = t.pull(keys)
            t.push(p, grads_for(keys, step), per_position=True)
        db.advance()
    return db


def dump_records(db: Any, out: Path) -> None:
    """Every stored row of this rank's shard (or of a whole table), whole records, and the
    pending admission counts, through the table's public methods."""
    arrays = {}
    for name in db.tables():
        t = db.table(name)
        local = getattr(t, "local", t)
        chunks = list(local.records())
        keys = np.concatenate([k for k, _ in chunks] or [np.empty(0, np.int64)])
        arrays[f"{name}.keys"] = keys
        for f in ("values", "slots", "freq", "last_step"):
            cols = [getattr(r, f) for _, r in chunks]
            arrays[f"{name}.{f}"] = np.concatenate(cols) if cols else np.empty(0)
        arrays[f"{name}.freq"] = arrays[f"{name}.freq"].astype(np.int64)
        state = local.flush_state()  # the admission's pending counts, among its state
        pending = state.get("admission.keys", np.empty(0, np.int64)).astype(np.int64)
        counts = state.get("admission.counts", np.empty(0, np.int64)).astype(np.int64)
        order = np.argsort(pending)
        arrays[f"{name}.pending_keys"] = pending[order]
        arrays[f"{name}.pending_counts"] = counts[order]
    np.savez(out, **arrays)


def train(rank: int, world: int, out: Path, placement: str, checkpoint: bool) -> dict[str, Any]:
    """Each rank pulls and pushes its part of every global batch; then the global reads."""
    db = evd.open(out / "root")
    kw = {"num_ids": SPACE} if placement == "div" else {}
    tables = {
        n: db.create_table(n, dim=DIM, placement=placement, **kw, **o)
        for n, o in table_options().items()
    }
    for step in range(STEPS):
        if checkpoint and step == STEPS - 3:  # the base of an incremental one, taken below
            db.checkpoint(out / "ckpt-base")
        keys = part(global_batch(step), rank, world)
        for t in tables.values():
            p = t.pull(keys)
            t.push(p, grads_for(keys, step), per_position=True)
        db.advance()
    keys, offsets = lookup_keys()
    mine = part(keys, rank, world)
    result: dict[str, Any] = {"step": db.step}
    for name, t in tables.items():
        found = np.zeros(mine.shape[0], dtype=bool)
        np.save(out / f"lookup-{name}-{rank}.npy", t.lookup(mine, found=found))
        np.save(out / f"found-{name}-{rank}.npy", found)
        np.save(out / f"contains-{name}-{rank}.npy", t.contains(mine))
        np.save(out / f"bags-{name}-{rank}.npy", t.lookup(keys, offsets, combiner="sqrtn"))
        stats = t.stats()
        result[name] = {
            "len": len(t),
            "rows": stats["rows"],
            "not_admitted": stats["admission"]["not_admitted"],
            "pending": stats["admission"]["pending"],
            "dropped_gradients": stats["dropped_gradients"],
            "shards": [s["rows"] for s in stats["shards"]],
            "imbalance": stats["imbalance"],
        }
    dump_records(db, out / f"shard-{rank}.npz")
    if checkpoint:
        db.checkpoint(out / "ckpt")
        db.checkpoint(out / "ckpt-inc", base=out / "ckpt-base")
    db.close()
    return result


def resume(rank: int, world: int, out: Path, src: str, wrong: str | None) -> dict[str, Any]:
    """Resume from a (resharded) checkpoint on this many ranks and dump the shards; first
    check that a checkpoint for another world size (``wrong``) is refused with the reshard
    command, and that opening the checkpoint itself for writing is refused (it would be
    consumed)."""
    refused = None
    if wrong is not None:
        try:
            evd.open(out / "never", restore=wrong)
        except evdb.ShardLayoutError as e:
            refused = str(e)
        else:
            raise AssertionError("a checkpoint for another world size was opened")
    try:
        evd.open(src)
    except evdb.InvalidArgumentError as e:
        in_place = str(e)
    else:
        raise AssertionError("a sharded checkpoint was opened for writing in place")
    db = evd.open(out / "root", restore=src)
    dump_records(db, out / f"shard-{rank}.npz")
    lens = {n: len(db.table(n)) for n in db.tables()}
    db.close()
    return {"refused": refused, "in_place": in_place, "len": lens}


def killed(rank: int, world: int, out: Path) -> dict[str, Any]:
    """Rank 1 dies (SIGKILL) after one step; rank 0 must raise, not hang."""
    db = evd.open(out / "root")
    t = db.create_table("t", dim=DIM)
    t.push(t.pull(np.arange(5) + rank), np.ones((5, DIM), np.float32))
    db.advance()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        t.pull(np.arange(3))
    except evdb.CollectiveError as e:
        return {"error": str(e)}
    raise AssertionError("the pull went through with a dead rank")


def misuse(rank: int, world: int, out: Path) -> dict[str, Any]:
    """Mismatched calls and one rank's bad input raise on every rank at once."""
    db = evd.open(out / "root")
    t = db.create_table("t", dim=DIM)
    seen = {}
    try:  # rank 0 looks up while rank 1 asks contains
        if rank == 0:
            t.lookup([1, 2])
        else:
            t.contains([1, 2])
    except evdb.CollectiveError as e:
        seen["mismatch"] = str(e)
    try:  # rank 1's keys are bad; rank 0's are fine
        t.pull(np.array([1.5]) if rank == 1 else np.array([1, 2]))
    except evdb.CollectiveError as e:
        seen["other_refused"] = str(e)
    except evdb.InvalidTypeError as e:
        seen["own_error"] = str(e)
    seen["len_after"] = len(t)  # the collectives still pair up after both failures
    # a rank with no keys still takes part, with an empty batch
    mine = np.array([1, 2, 2], dtype=np.int64) if rank == 0 else np.empty(0, dtype=np.int64)
    p = t.pull(mine)
    t.push(p, np.ones((p.keys.shape[0], DIM), np.float32))
    seen["empty_batch"] = [len(t), t.lookup(np.array([2]))[0].tolist(), p.rows.shape[0]]
    try:  # every rank pushes the same batch again: refused before any gradient travels
        t.push(p, np.ones((p.keys.shape[0], DIM), np.float32))
    except evdb.InvalidArgumentError as e:
        seen["double_push"] = str(e)
    seen["row_after_double_push"] = t.lookup(np.array([2]))[0].tolist()
    try:
        db.create_table("u", dim=DIM + rank)
    except evdb.ShardLayoutError as e:
        seen["config"] = str(e)
    if rank == 0:  # rank 1 forgets to advance: the next collective says so
        db.advance()
    try:
        len(t)
    except evdb.CollectiveError as e:
        seen["step"] = str(e)
    if rank == 1:
        db.advance()
    db.close()
    return seen


def prefetching(rank: int, world: int, out: Path) -> dict[str, Any]:
    """A spilling sharded table trained twice, once told each next batch ahead: the same
    pulls and lookups both times, and the owners took rows from their read aheads."""
    got = {}
    for ahead in (False, True):
        db = evd.open(out / f"root-{ahead}")
        t = db.create_table("t", dim=DIM, dram_rows=6, optimizer=evdb.optim.Adagrad(lr=0.1))
        pulls = []
        for step in range(STEPS):
            keys = part(global_batch(step), rank, world)
            p = t.pull(keys)
            if ahead:
                t.prefetch(part(global_batch(step + 1), rank, world))
            t.push(p, grads_for(keys, step), per_position=True)
            db.advance()
            pulls.append(p.rows.copy())
        looked = t.lookup(part(lookup_keys()[0], rank, world))
        used = t.local.stats()["tiers"]["rocksdb"]["read_ahead_used"]
        db.close()
        got[ahead] = (pulls, looked, used)
    for a, b in zip(got[False][0], got[True][0], strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(got[False][1], got[True][1])
    return {"used": int(got[True][2]), "used_without": int(got[False][2])}


class _Model(torch.nn.Module):
    def __init__(self, table: Any) -> None:
        super().__init__()
        from evdb.torch import EmbeddingBag

        self.bag = EmbeddingBag(table, mode="sum")

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.bag(ids, offsets).sum()
        return out


def torch_steps(table: Any, db: Any, rank: int, world: int) -> None:
    """The torch binding over a (sharded) table: 8 bags of 5 ids a step, the bags split over
    the ranks, and a sum loss, so the rows' gradients add up across ranks."""
    model = _Model(table)
    for step in range(4):
        bags = global_batch(100 + step, 40).reshape(8, 5)
        mine = part(np.arange(8), rank, world)
        ids = torch.from_numpy(bags[mine].ravel())
        offsets = torch.arange(mine.shape[0], dtype=torch.int64) * 5
        model(ids, offsets).backward()
        db.advance()


def torch_binding(rank: int, world: int, out: Path) -> dict[str, Any]:
    db = evd.open(out / "root")
    t = db.create_table("t", dim=DIM, optimizer=evdb.optim.Adagrad(lr=0.1))
    torch_steps(t, db, rank, world)
    dump_records(db, out / f"shard-{rank}.npz")
    db.close()
    return {}


def publishing(rank: int, world: int, out: Path) -> list[dict[str, Any]]:
    """Sharded training that publishes after every step (upserts, deletes, a compaction and
    TTL expiry among the changes); rank 0 saves the trainer's global lookup at each seq."""
    db = evd.open(out / "root")
    tables = {
        "a": db.create_table(
            "a", dim=DIM, admission=evdb.admission.Counter(min_count=2), ttl_steps=2,
            optimizer=evdb.optim.Adagrad(lr=0.1),
        ),
        "b": db.create_table("b", dim=DIM, placement="mod"),
    }  # fmt: skip
    keys = np.arange(SPACE, dtype=np.int64)
    results = []
    for step in range(7):
        batch = part(global_batch(step, 30), rank, world)
        for t in tables.values():
            p = t.pull(batch)
            t.push(p, grads_for(batch, step), per_position=True)
        if step == 2:  # direct writes reach the server too
            mine = np.array([3, 40], dtype=np.int64) if rank == 0 else np.empty(0, np.int64)
            tables["b"].upsert(mine, np.full((mine.shape[0], DIM), 7.0, np.float32))
            tables["b"].delete(np.array([1, 2]) if rank == 1 else np.empty(0, np.int64))
        if step == 4:
            tables["a"].compact()
        db.advance()
        results.append(db.publish(out / "pub", full=True if step == 5 else None))
        for name, t in tables.items():
            found = np.zeros(keys.shape[0], dtype=bool)
            view = t.lookup(keys, found=found)
            if rank == 0:
                seq = results[-1]["seq"]
                np.save(out / f"view-{seq}-{name}.npy", view)
                np.save(out / f"found-{seq}-{name}.npy", found)
    db.close()
    return results


def read_protocol(rank: int, world: int, out: Path) -> dict[str, Any]:
    """The read half of a sharded table (count, records, neighbours, strings, lookup's out=
    and step=) against one process's table holding the same rows."""
    rng = np.random.default_rng(7)
    keys = rng.permutation(400).astype(np.int64)
    values = rng.standard_normal((400, DIM)).astype(np.float32)
    db = evd.open(out / "root")
    one = evdb.open(out / f"one-{rank}")
    got: dict[str, Any] = {}
    for d in (db, one):
        t = d.create_table("t", dim=DIM, ttl_steps=3, dram_rows=50)
        for i, half in enumerate((keys[:200], keys[200:])):  # written at steps 0 and 2
            mine = part(half, rank, world) if d is db else half
            t.upsert(mine, values[mine])
            if i == 0:
                d.advance(2)
    sharded, plain = db.table("t"), one.table("t")
    assert sharded.step == plain.step == 2 and sharded.keeps_strings is False
    for step in (None, 4, 5):
        assert sharded.count(step=step) == plain.count(step=step), step
    ask = np.concatenate([keys[:30], [999]])
    buf = np.empty((2, DIM), np.float32)
    sharded.lookup(ask, offsets=[0, 11], out=buf, step=4)
    np.testing.assert_array_equal(buf, plain.lookup(ask, offsets=[0, 11], step=4))
    here = {int(k) for c, _ in sharded.records(live_only=True, step=4) for k in c}
    every = set().union(*db.exchange.gather_objects(here, "test"))
    assert every == {int(k) for c, _ in plain.records(live_only=True, step=4) for k in c}
    for query, metric in ((int(keys[5]), "cosine"), (values[9], "l2"), (values[1], "dot")):
        for step in (None, 4):
            a = sharded.neighbors(query, k=7, metric=metric, step=step)
            b = plain.neighbors(query, k=7, metric=metric, step=step)
            np.testing.assert_array_equal(a[0], b[0])
            np.testing.assert_allclose(a[1], b[1], rtol=1e-6)
    try:  # sharded tables keep no strings (keep_strings is refused at creation)
        sharded.strings([1])
    except evdb.InvalidArgumentError as e:
        assert "does not keep its strings" in str(e)
    else:
        raise AssertionError("strings() of a table without strings did not raise")
    got["rows"] = sharded.count()
    one.close()
    db.close()
    return got
