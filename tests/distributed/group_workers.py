"""What each rank runs in the grouped-exchange tests (``ShardedCollection``), and the one-process
reference. Tables of different dims and optimizers in one collection; every function is
deterministic in its arguments, so the parent can replay the same global batches."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import torch

import evdb
from evdb import distributed as evd
from tests.distributed.workers import SPACE, dump_records, global_batch, part

STEPS = 6
# name -> (dim, optimizer): a collection of unlike tables
TABLES = {
    "sgd": (4, evdb.optim.SGD(lr=0.1)),
    "adagrad": (8, evdb.optim.Adagrad(lr=0.1)),
    "adam": (3, evdb.optim.Adam(lr=0.05)),
}
MODES = ("grouped", "per_table", "bfloat16", "float16")


def options(name: str) -> dict[str, Any]:
    dim, optimizer = TABLES[name]
    return {
        "dim": dim,
        "optimizer": optimizer,
        "admission": evdb.admission.Counter(min_count=2),
        "ttl_steps": 3,
    }


def batch_of(name: str, step: int) -> np.ndarray:
    """The global batch of one table at one step (each table its own)."""
    return global_batch(step + 100 * list(TABLES).index(name))


def grads_for(keys: np.ndarray, step: int, dim: int, exact: bool) -> np.ndarray:
    """A gradient per position, a function of the key and the step only. ``exact``: multiples
    of 1/4 in [-1, 1], so every partial sum of a step's gradients (at most 60 positions) is
    a float32 and a bfloat16 exactly, and summation order cannot matter: N ranks then equal
    one process bit for bit."""
    g = np.sin(keys[:, None] * 0.37 + step + np.arange(dim)) * 0.9
    if exact:
        g = np.round(g * 4) / 4
    return g.astype(np.float32)


def train_reference(root: Path, exact: bool) -> tuple[evdb.Database, dict[str, np.ndarray]]:
    """One process pulling and pushing each whole global batch; returns the database and the
    rows pulled at the last step (per position)."""
    db = evdb.open(root)
    tables = {n: db.create_table(n, **options(n)) for n in TABLES}
    last = {}
    for step in range(STEPS):
        for name, t in tables.items():
            keys = batch_of(name, step)
            p = t.pull(keys)
            last[name] = p.rows[p.inverse].copy()
            t.push(p, grads_for(keys, step, t.dim, exact), per_position=True)
        db.advance()
    return db, last


def train(rank: int, world: int, out: Path, exact: bool) -> dict[str, Any]:
    """Every mode in its own root, each rank with its part of every table's global batch:
    the grouped exchange (float32, bfloat16, float16 payloads) and the per-table calls."""
    result: dict[str, Any] = {}
    for mode in MODES:
        db = evd.open(out / f"root-{mode}")
        tables = {n: db.create_table(n, **options(n)) for n in TABLES}
        payload = mode if mode in ("bfloat16", "float16") else "float32"
        coll = evd.ShardedCollection(list(tables.values()), payload_dtype=payload)
        for step in range(STEPS):
            keys = {n: part(batch_of(n, step), rank, world) for n in TABLES}
            grads = {n: grads_for(keys[n], step, t.dim, exact) for n, t in tables.items()}
            if mode == "per_table":
                for n, t in tables.items():
                    sp = t.pull(keys[n])
                    if step == STEPS - 1:
                        np.save(out / f"pulled-{mode}-{n}-{rank}.npy", sp.rows[sp.inverse])
                    t.push(sp, grads[n], per_position=True)
            else:
                p = coll.pull(keys)
                if step == STEPS - 1:
                    for n in TABLES:
                        rows = p[n].rows[p[n].inverse]
                        np.save(out / f"pulled-{mode}-{n}-{rank}.npy", rows)
                coll.push(p, grads, per_position=True)
            db.advance()
        dump_records(db, out / f"{mode}-shard-{rank}.npz")
        result[mode] = {n: len(t) for n, t in tables.items()}
        db.close()
    return result


def misuse(rank: int, world: int, out: Path) -> dict[str, Any]:
    """A rank that refuses its input, mismatched calls and a double push: every rank raises,
    nothing changes, and the collectives still pair up afterwards."""
    db = evd.open(out / "root")
    a = db.create_table("a", dim=4)
    b = db.create_table("b", dim=2, placement="div", num_ids=SPACE)
    coll = evd.ShardedCollection([a, b])
    seen: dict[str, Any] = {}

    def attempt(what: str, fn: Any) -> None:
        try:
            fn()
        except evdb.CollectiveError as e:
            seen[what] = ["CollectiveError", str(e)]
        except evdb.EvdbError as e:
            seen[what] = [type(e).__name__, str(e)]
        else:
            seen[what] = None

    good = {"a": np.array([1, 2, 3]), "b": np.array([4, 5])}
    bad = {
        "float_key": {"a": np.array([1.5]), "b": np.array([4])},
        "unknown_table": {"a": np.array([1]), "c": np.array([4])},
        "outside_div": {"a": np.array([1]), "b": np.array([SPACE + 7])},
    }
    for what, batch in bad.items():  # rank 1's batch is bad; rank 0's fine
        attempt(what, lambda batch=batch: coll.pull(batch if rank == 1 else good))
    seen["len_after_refusals"] = [len(a), len(b)]
    p = coll.pull(good)  # the collectives still pair up
    grads = {"a": np.ones((3, 4), np.float32), "b": np.ones((2, 2), np.float32)}
    attempt(  # rank 0 leaves a table's gradients out
        "missing_grads", lambda: coll.push(p, {"a": grads["a"]} if rank == 0 else grads)
    )
    coll.push(p, grads)
    row = a.lookup(np.array([1]))[0].tolist()
    attempt("double_push", lambda: coll.push(p, grads))  # refused everywhere, unchanged
    seen["row_changed_by_double_push"] = a.lookup(np.array([1]))[0].tolist() != row
    again = coll.pull(good)  # a part of a grouped pull pushed through its table: refused
    attempt("part_through_table", lambda: a.push(again["a"], grads["a"]))
    coll.push(again, grads)
    # rank 0 pulls the collection while rank 1 pulls one table
    attempt("mismatch", lambda: coll.pull(good) if rank == 0 else a.pull(good["a"]))
    # a rank with other tables (another collection) is caught by the header
    other = evd.ShardedCollection([b, a] if rank == 1 else [a, b])
    attempt("other_collection", lambda: other.pull(good))
    for what, args, kw in (
        ("twice", ([a, a],), {}),
        ("empty", ([],), {}),
        ("payload", ([a, b],), {"payload_dtype": "int8"}),
        ("not_sharded", ([a, a.local],), {}),
    ):  # refused at construction, before any collective
        attempt(f"config_{what}", lambda args=args, kw=kw: evd.ShardedCollection(*args, **kw))
    seen["len_end"] = [len(a), len(b)]
    db.close()
    return seen


def killed(rank: int, world: int, out: Path) -> dict[str, Any]:
    """Rank 1 dies (SIGKILL) after one grouped step; the others raise, never hang."""
    db = evd.open(out / "root")
    tables = [db.create_table("a", dim=4), db.create_table("b", dim=2)]
    coll = evd.ShardedCollection(tables)
    batch = {"a": np.arange(5) + rank, "b": np.arange(3)}
    p = coll.pull(batch)
    coll.push(p, {"a": np.ones((5, 4), np.float32), "b": np.ones((3, 2), np.float32)})
    db.advance()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        coll.pull(batch)
    except evdb.CollectiveError as e:
        return {"error": str(e)}
    raise AssertionError("the grouped pull went through with a dead rank")


def torch_features(step: int, rank: int, world: int) -> dict[str, tuple[torch.Tensor, ...]]:
    """Three features over two tables ("adagrad" is shared by two), 8 bags of 3 ids each,
    the bags split over the ranks."""
    out = {}
    for f, name in enumerate(("sgd", "adagrad", "adagrad_2")):
        bags = global_batch(200 + 10 * step + f, 24).reshape(8, 3)
        mine = part(np.arange(8), rank, world)
        out[name] = (
            torch.from_numpy(bags[mine].ravel()),
            torch.arange(mine.shape[0], dtype=torch.int64) * 3,
        )
    return out


def torch_collection(rank: int, world: int, out: Path, payload: str) -> dict[str, Any]:
    """``EmbeddingBagCollection`` over sharded tables: grouped and per-table forward and
    backward leave the same tables, bit for bit; the grouped one makes 5 collectives a step."""
    from evdb.torch import EmbeddingBagCollection

    counts: dict[str, int] = {}
    for grouped in (True, False):
        db = evd.open(out / f"root-{grouped}")
        tables = {n: db.create_table(n, **options(n)) for n in ("sgd", "adagrad")}
        feats = {"sgd": tables["sgd"], "adagrad": tables["adagrad"], "adagrad_2": tables["adagrad"]}
        ebc = EmbeddingBagCollection(
            feats, mode="sum", grouped=grouped, payload_dtype=payload if grouped else "float32"
        )
        calls = _count_collectives()
        for step in range(4):
            outs = ebc(torch_features(step, rank, world))
            loss = sum((o * (i + 1)).sum() for i, o in enumerate(outs.values()))
            loss.backward()
            db.advance()
        counts[str(grouped)] = calls() // 4
        dump_records(db, out / f"torch-{grouped}-shard-{rank}.npz")
        db.close()
    return counts


def _count_collectives() -> Any:
    """Count the torch.distributed collectives this process makes from now on (the library's
    calls go through the module's attributes)."""
    import torch.distributed as dist

    n = [0]
    for name in ("all_gather", "all_to_all_single", "all_reduce", "all_gather_object"):
        fn = getattr(dist, name)
        if getattr(fn, "_counted", False):
            fn = fn._inner

        def wrapped(*a: Any, _fn: Any = fn, **kw: Any) -> Any:
            n[0] += 1
            return _fn(*a, **kw)

        wrapped._counted = True  # type: ignore[attr-defined]
        wrapped._inner = fn  # type: ignore[attr-defined]
        setattr(dist, name, wrapped)
    start = n[0]
    return lambda: n[0] - start


def pipelined(rank: int, world: int, out: Path) -> dict[str, Any]:
    """The same training, once as the plain loop and once through ``TrainPipeline``; one
    table spills to disk (6 rows in DRAM), so the owners' prefetch has rows to read."""
    used = {}
    for piped in (False, True):
        db = evd.open(out / f"root-{piped}")
        tables = {n: db.create_table(n, **options(n)) for n in TABLES}
        tables["spill"] = db.create_table(
            "spill", dim=4, dram_rows=6, optimizer=evdb.optim.Adagrad(lr=0.1)
        )
        coll = evd.ShardedCollection(list(tables.values()))
        batches = [
            {n: part(batch_of(n if n in TABLES else "sgd", s), rank, world) for n in tables}
            for s in range(STEPS)
        ]
        pulls = []
        pipe = evd.TrainPipeline(coll) if piped else None
        pairs = (
            pipe.run(batches, keys_of=lambda b: b)
            if pipe is not None
            else ((b, coll.pull(b)) for b in batches)  # lazily: each pull after the last push
        )
        for s, (keys, p) in enumerate(pairs):
            pulls.append({n: p[n].rows[p[n].inverse].copy() for n in tables})
            grads = {n: grads_for(keys[n], s, t.dim, False) for n, t in tables.items()}
            coll.push(p, grads, per_position=True)
            db.advance()
        if pipe is not None:
            pipe.close()
        np.savez(
            out / f"pulls-{piped}-{rank}.npz",
            **{f"{s}.{n}": rows for s, p in enumerate(pulls) for n, rows in p.items()},
        )
        used[str(piped)] = int(tables["spill"].local.stats()["tiers"]["rocksdb"]["read_ahead_used"])
        dump_records(db, out / f"piped-{piped}-shard-{rank}.npz")
        db.close()
    return used


def example(rank: int, world: int, out: Path) -> dict[str, Any]:
    """examples/movielens_sharded.py on synthetic data, one epoch, through the module and
    through the pipeline (bfloat16 payloads both times): rank 0's printed lines."""
    import contextlib
    import io
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    import movielens_sharded

    lines = {}
    for how in ("module", "pipeline"):
        argv = ["--out", str(out / how), "--synthetic", "--epochs", "1", "--batch", "1024"]
        argv += ["--payload", "bfloat16"] + (["--pipeline"] if how == "pipeline" else [])
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            rc = movielens_sharded.main(argv)
        assert rc == 0, how
        lines[how] = printed.getvalue().splitlines()
    return lines
