"""Sharded training steps on loopback (gloo, 127.0.0.1): 1 rank against 2 ranks at the same
global batch, each rank's step split into local work and exchange, bytes on the wire against
the minimum of issue 13, TorchRec's row-wise sharded ``EmbeddingBagCollection`` where it runs
on the CPU, and a prediction for more machines.

The step: a global batch of ``--batch`` examples x ``--features`` features x 1 id (sum
pooling over bags of one id, so B x F bags), ids drawn from a truncated Zipf(``--zipf-a``)
over ``--ids`` ids, each feature's ranks scattered over the ids by its own affine bijection,
all features in **one shared table** (dim ``--dim``, Adagrad lr 0.01, initial accumulator
0.1, eps 1e-10, every row created before the clock starts, all in DRAM). Rank r takes the
examples ``[r B / N, (r + 1) B / N)`` of every global batch and a fixed random ``grad_out``:
``pull`` + ``combine`` + ``combine_backward`` + ``push`` + ``db.advance()``.

Each rank is a process started with multiprocessing spawn, in a gloo group on a free port of
127.0.0.1; every wait is bounded (a rank still running after ``--timeout`` seconds is killed
and reported). The bench times the sharded database's ``Exchange`` (the object every
collective of ``evdb.distributed`` goes through) by wrapping that one instance's methods in
the rank's process, and counts the tensor bytes those calls send to other ranks; the library
is not changed. ``exchange`` therefore includes the wait for the slower rank. Each rank runs
``--threads`` threads (1), so 1 rank computes on one core and 2 ranks on two: on a small
shared machine with loopback for a network this shows the sharding's overhead, not a speed-up.

Section 6 (``--section many-tables``, or after sections 1-5 by default) is the step of a
model with one table per feature, at ``--tables`` tables (8 and 26): 2 ranks, one id per
table per example, the ids of ``--ids`` split evenly over the tables, every row created
first. In the same ranks, in blocks that take turns (``--rounds``): each table pulled and
pushed by its own calls, the grouped exchange (``ShardedCollection``) with float32 and with
bfloat16 payloads, and the grouped step with a dense MLP on the pooled features, as a plain
loop and through ``TrainPipeline``. It counts the collectives of a step by wrapping
``torch.distributed``'s functions in each rank (the pipeline's thread included), prints
steps/s against the per-table calls, the bytes sent against the minimum for the same steps'
keys, and TorchRec's table-wise sharded ``EmbeddingBagCollection`` where it imports.

Run from the repository root: ``.venv/bin/python bench/bench_distributed.py [--quick]
[--section many-tables]``.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import logging
import math
import multiprocessing as mp
import os
import socket
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import numpy as np

BENCH = Path(__file__).resolve().parent
PG_TIMEOUT_S = 60  # the process group's timeout: a dead peer fails a collective within it
PHASES = ("pull", "combine+backward", "push", "advance")
FILL_CHUNK = 65_536
# The torch.distributed calls TorchRec's sharded modules make; wrapped to count their bytes.
TORCH_COLLECTIVES = (
    "all_to_all_single",
    "reduce_scatter_tensor",
    "_reduce_scatter_base",
    "all_gather_into_tensor",
    "_all_gather_base",
    "all_reduce",
    "all_gather",
)


TORCHREC_HINT = (
    "torch 2.13 needs torchrec==1.8.0 with fbgemm-gpu-cpu==1.8.0, not a project dependency: "
    "fbgemm-gpu-cpu 1.9.0 is built against a newer torch and fails to load its .so files "
    "(undefined symbol torch::autograd::_wrap_outputs)"
)


# -- data (every rank draws the same global batches) --------------------------------------
def zipf_cdf(ids: int, a: float) -> np.ndarray:
    """The CDF of a Zipf(a) law truncated to ranks 1..ids."""
    p = np.arange(1, ids + 1, dtype=np.float64) ** -a
    c = np.cumsum(p)
    c /= c[-1]
    return c


def global_batch(args: argparse.Namespace, cdf: np.ndarray, step: int) -> np.ndarray:
    """(batch, features) int64 ids in [0, ids): the step's global batch."""
    rng = np.random.default_rng((args.seed, step))
    ranks = np.searchsorted(cdf, rng.random((args.batch, args.features)), side="right")
    ranks = np.minimum(ranks, args.ids - 1).astype(np.int64)
    f = np.arange(args.features, dtype=np.int64)
    # rank -> id is a bijection of [0, ids) per feature when mult is coprime with ids (a
    # number ending in 1 is, for ids a power of ten; otherwise the feature falls back to 1)
    mult = (10 * (f * 7919 + 104_729)) % args.ids + 1
    mult = np.where(np.gcd(mult, args.ids) == 1, mult, 1)
    ids: np.ndarray = (ranks * mult + f * 1_000_003) % args.ids
    return ids


def rank_slice(batch: np.ndarray, rank: int, world: int) -> np.ndarray:
    n = batch.shape[0]
    return batch[rank * n // world : (rank + 1) * n // world]


# -- spawning ranks ------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _entry(name: str, rank: int, world: int, port: int, out: str, args: dict[str, Any]) -> None:
    threads = str(args["threads"])
    for var in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = threads
    sys.path.insert(0, str(BENCH))
    import torch
    import torch.distributed as dist

    torch.set_num_threads(int(threads))
    warnings.filterwarnings("ignore")  # TorchRec's and torch's deprecation notices
    logging.disable(logging.WARNING)
    report = Path(out) / f"rank-{rank}.json"
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=PG_TIMEOUT_S),
        )
        fn = {
            "evdb": evdb_rank,
            "torchrec": torchrec_rank,
            "evdb-tables": tables_rank,
            "torchrec-tables": torchrec_tables_rank,
        }[name]
        result = fn(rank, world, Path(out), argparse.Namespace(**args))
        report.write_text(json.dumps({"ok": True, "result": result}))
    except BaseException as e:
        report.write_text(
            json.dumps(
                {"ok": False, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}
            )
        )
        raise SystemExit(1) from None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(name: str, world: int, args: argparse.Namespace) -> tuple[list[Any] | None, str]:
    """Run ``name``'s rank function on ``world`` spawned ranks, waiting at most
    ``args.timeout`` s; a rank still running then is killed. Returns (each rank's result,
    "") or (None, why it failed)."""
    with tempfile.TemporaryDirectory(prefix="evdb-bench-dist-") as tmp:
        out = Path(tmp)
        ctx = mp.get_context("spawn")
        port = free_port()
        procs = [
            ctx.Process(target=_entry, args=(name, r, world, port, str(out), vars(args)))
            for r in range(world)
        ]
        for p in procs:
            p.start()
        deadline = time.monotonic() + args.timeout
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        hung = [r for r, p in enumerate(procs) if p.is_alive()]
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(10)
        if hung:
            return None, f"ranks {hung} still running after {args.timeout} s: killed (a hang)"
        results = []
        for r, p in enumerate(procs):
            path = out / f"rank-{r}.json"
            if not path.exists():
                return None, f"rank {r} died without a report (exit code {p.exitcode})"
            report = json.loads(path.read_text())
            if not report["ok"]:
                if args.verbose:
                    print(report["trace"], file=sys.stderr)
                return None, f"rank {r}: {report['error']}"
            results.append(report["result"])
        return results, ""


# -- evdb's ranks ------------------------------------------------------------------------
class ExchangeMeter:
    """Wraps one ``Exchange`` instance's methods: time spent in them and tensor bytes they
    send to other ranks, per phase of the step."""

    def __init__(self, x: Any) -> None:
        self.x = x
        self.phase = ""
        self.seconds: dict[str, float] = {}
        self.header_s = 0.0
        self.payload_s = 0.0
        self.payload_bytes = 0
        self.header_bytes = 0
        self.calls = self.header_calls = self.payload_calls = 0
        for name in ("begin", "all_to_all", "all_sum", "gather_objects", "barrier"):
            setattr(x, name, self._wrap(name, getattr(x, name)))

    def reset(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.header_s = self.payload_s = 0.0
        self.payload_bytes = self.header_bytes = 0
        self.calls = self.header_calls = self.payload_calls = 0

    def _wrap(self, name: str, fn: Any) -> Any:
        def timed(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                dt = time.perf_counter() - t0
                self.calls += 1
                self.seconds[self.phase] = self.seconds.get(self.phase, 0.0) + dt
                others = self.x.size - 1
                if name == "begin":  # all_gather of (5 + size) int64 to every other rank
                    self.header_s += dt
                    self.header_calls += 1
                    self.header_bytes += (5 + self.x.size) * 8 * others
                elif name == "all_to_all":
                    data, send = a[0], np.asarray(a[1])
                    row = data.dtype.itemsize * int(np.prod(data.shape[1:], dtype=np.int64))
                    off = int(send.sum() - send[self.x.rank])
                    self.payload_s += dt
                    self.payload_calls += 1
                    self.payload_bytes += off * row
                elif name == "all_sum":
                    self.header_bytes += int(np.asarray(a[0]).size) * 8 * others

        return timed


def evdb_rank(rank: int, world: int, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    import evdb
    from evdb import distributed as evd

    cdf = zipf_cdf(args.ids, args.zipf_a)
    n_steps = args.warmup + args.steps
    keys = [rank_slice(global_batch(args, cdf, s), rank, world).reshape(-1) for s in range(n_steps)]
    n = keys[0].shape[0]
    offsets = np.arange(n, dtype=np.int64)  # one id per bag
    grad_out = np.random.default_rng((args.seed, 99, rank)).standard_normal(
        (n, args.dim), dtype=np.float32
    )
    db = evd.open(out / "db")
    t = db.create_table(
        "emb",
        dim=args.dim,
        optimizer=evdb.optim.Adagrad(lr=0.01, initial_accumulator=0.1, eps=1e-10),
        disk=False,
    )
    # every row exists before the clock starts (as in TorchRec's preallocated table)
    rng = np.random.default_rng((args.seed, 7, rank))
    mine = np.arange(rank * args.ids // world, (rank + 1) * args.ids // world, dtype=np.int64)
    for chunk in np.array_split(mine, max(1, math.ceil(args.ids / world / FILL_CHUNK))):
        values = rng.standard_normal((chunk.shape[0], args.dim), dtype=np.float32) * 0.01
        t.upsert(chunk, values)
    meter = ExchangeMeter(db._x)
    steps: list[dict[str, Any]] = []
    for s in range(n_steps):
        meter.reset()
        k = keys[s]
        clock = [time.perf_counter()]
        meter.phase = "pull"
        p = t.pull(k)
        clock.append(time.perf_counter())
        meter.phase = "combine+backward"
        p.combine(offsets, combiner="sum")
        g = p.combine_backward(grad_out, offsets, combiner="sum")
        clock.append(time.perf_counter())
        meter.phase = "push"
        t.push(p, g)
        clock.append(time.perf_counter())
        meter.phase = "advance"
        db.advance()
        clock.append(time.perf_counter())
        if s < args.warmup:
            continue
        owners = t.placement.owners(p.keys, world)
        steps.append(
            {
                "step_s": clock[-1] - clock[0],
                "phase_s": [b - a for a, b in itertools.pairwise(clock)],
                "exch_phase_s": [meter.seconds.get(ph, 0.0) for ph in PHASES],
                "header_s": meter.header_s,
                "payload_s": meter.payload_s,
                "payload_bytes": meter.payload_bytes,
                "header_bytes": meter.header_bytes,
                "calls": meter.calls,
                "header_calls": meter.header_calls,
                "payload_calls": meter.payload_calls,
                "keys": int(k.shape[0]),
                "distinct": int(p.keys.shape[0]),
                "distinct_off": int((owners != rank).sum()),
            }
        )
    rows = len(t)
    db.close()
    return {"steps": steps, "rows": rows}


# -- TorchRec's ranks ---------------------------------------------------------------------
class CollectiveCounter:
    """Wraps ``torch.distributed``'s collectives (in this process only) to count the tensor
    bytes they send to other ranks. TorchRec issues them asynchronously, so no time is
    taken here."""

    def __init__(self, world: int, rank: int) -> None:
        import torch.distributed as dist

        self.bytes = 0
        self.calls = 0
        self.by_name: dict[str, int] = {}
        self.world, self.rank = world, rank
        for name in TORCH_COLLECTIVES:
            if hasattr(dist, name):
                setattr(dist, name, self._wrap(name, getattr(dist, name)))

    def _wrap(self, name: str, fn: Any) -> Any:
        def counted(*a: Any, **kw: Any) -> Any:
            sent = self._sent(name, a, kw)
            self.calls += 1
            self.bytes += sent
            self.by_name[name] = self.by_name.get(name, 0) + sent
            return fn(*a, **kw)

        return counted

    def _sent(self, name: str, a: tuple[Any, ...], kw: dict[str, Any]) -> int:
        import torch

        def nbytes(t: Any) -> int:
            return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0

        others = self.world - 1
        if name == "all_to_all_single":
            inp = kw.get("input", a[1] if len(a) > 1 else None)
            splits = kw.get("input_split_sizes", a[3] if len(a) > 3 else None)
            total = nbytes(inp)
            if not splits or inp is None or inp.shape[0] == 0:
                return total * others // max(self.world, 1)
            row = total // inp.shape[0]
            return int((sum(splits) - splits[self.rank]) * row)
        if name in ("reduce_scatter_tensor", "_reduce_scatter_base"):
            inp = kw.get("input", a[1] if len(a) > 1 else None)
            return nbytes(inp) * others // self.world
        if name in ("all_gather_into_tensor", "_all_gather_base"):
            inp = kw.get("input_tensor", a[1] if len(a) > 1 else None)
            return nbytes(inp) * others
        if name == "all_gather":
            return nbytes(kw.get("tensor", a[1] if len(a) > 1 else None)) * others
        if name == "all_reduce":  # a ring all-reduce sends 2 (N - 1) / N of the tensor
            return nbytes(kw.get("tensor", a[0] if a else None)) * 2 * others // self.world
        return 0


def torchrec_rank(rank: int, world: int, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan, row_wise
    from torchrec.distributed.types import ShardingEnv, ShardingPlan
    from torchrec.modules.embedding_configs import PoolingType

    cdf = zipf_cdf(args.ids, args.zipf_a)
    n_steps = args.warmup + args.steps
    names = [f"f{i}" for i in range(args.features)]
    cpu = torch.device("cpu")
    ebc = EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(
                name="emb",
                embedding_dim=args.dim,
                num_embeddings=args.ids,
                feature_names=names,
                pooling=PoolingType.SUM,
            )
        ],
        device=torch.device("meta"),
    )
    plan = ShardingPlan(
        {
            "": construct_module_sharding_plan(
                ebc,
                per_param_sharding={"emb": row_wise(compute_kernel="fused")},
                local_size=world,
                world_size=world,
                device_type="cpu",
            )
        }
    )
    sharder = EmbeddingBagCollectionSharder(
        fused_params={
            "optimizer": EmbOptimType.EXACT_ADAGRAD,
            "learning_rate": 0.01,
            "eps": 1e-10,  # fbgemm's accumulators start at 0 (no initial value to set)
        }
    )
    model = DistributedModelParallel(
        ebc,
        env=ShardingEnv.from_process_group(dist.group.WORLD),
        device=cpu,
        plan=plan,
        sharders=[sharder],
        init_data_parallel=False,
    )
    batches = []
    for s in range(n_steps):
        local = rank_slice(global_batch(args, cdf, s), rank, world)  # (b, F)
        b = local.shape[0]
        batches.append(
            KeyedJaggedTensor.from_lengths_sync(
                keys=names,
                values=torch.from_numpy(np.ascontiguousarray(local.T).reshape(-1)),
                lengths=torch.ones(b * args.features, dtype=torch.int32),
            )
        )
    b = batches[0].stride()
    grad_out = torch.from_numpy(
        np.random.default_rng((args.seed, 99, rank)).standard_normal(
            (b, args.features * args.dim), dtype=np.float32
        )
    )
    weight = model.state_dict()["embedding_bags.emb.weight"].local_shards()[0].tensor
    before = weight.detach().clone()
    counter = CollectiveCounter(world, rank)
    steps = []
    for s in range(n_steps):
        counter.bytes = counter.calls = 0
        counter.by_name = {}
        t0 = time.perf_counter()
        pooled = model(batches[s]).values()  # (b, F * dim)
        pooled.backward(grad_out)  # the fused Adagrad update runs in the backward
        dt = time.perf_counter() - t0
        if s >= args.warmup:
            steps.append(
                {"step_s": dt, "bytes": counter.bytes, "calls": counter.calls, **counter.by_name}
            )
    changed = int((weight != before).any(dim=1).sum())  # rows the fused optimizer updated
    return {"steps": steps, "rows_changed": changed}


# -- 6. many tables: one grouped exchange against one exchange per table -------------------
TABLE_MODES = ("per-table", "grouped", "grouped bf16", "grouped + dense", "pipelined + dense")


def _fill_tables(tables: list[Any], ids: int, dim: int, rank: int, world: int, seed: int) -> None:
    """Every table's rows exist before the clock starts; each rank upserts the keys it owns."""
    rng = np.random.default_rng((seed, 7, rank))
    for t in tables:
        every = np.arange(ids, dtype=np.int64)
        mine = every[t.placement.owners(every, world) == rank]
        for chunk in np.array_split(mine, max(1, math.ceil(mine.shape[0] / FILL_CHUNK))):
            t.upsert(chunk, rng.standard_normal((chunk.shape[0], dim), dtype=np.float32) * 0.01)


def tables_rank(rank: int, world: int, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """``args.n_tables`` tables, one feature each (one id per example): the embedding step
    per table, grouped (float32, bfloat16), and grouped with a dense MLP, plain and
    pipelined; the modes take turns in blocks, ``args.rounds`` times."""
    import torch

    import evdb
    from evdb import distributed as evd

    n_tables, ids = args.n_tables, max(1, args.ids // args.n_tables)
    cdf = zipf_cdf(ids, args.zipf_a)
    db = evd.open(out / "db")
    tables = [
        db.create_table(
            f"t{i}",
            dim=args.dim,
            optimizer=evdb.optim.Adagrad(lr=0.01, initial_accumulator=0.1, eps=1e-10),
            disk=False,
        )
        for i in range(n_tables)
    ]
    _fill_tables(tables, ids, args.dim, rank, world, args.seed)
    colls = {
        "float32": evd.ShardedCollection(tables),
        "bfloat16": evd.ShardedCollection(tables, payload_dtype="bfloat16"),
    }
    pipe = evd.TrainPipeline(colls["float32"])
    sub = argparse.Namespace(**{**vars(args), "ids": ids, "features": n_tables})
    n_steps = args.warmup + args.steps

    def batch(s: int) -> dict[str, np.ndarray]:
        local = rank_slice(global_batch(sub, cdf, s), rank, world)  # (b, T)
        return {t.name: np.ascontiguousarray(local[:, i]) for i, t in enumerate(tables)}

    b = batch(0)["t0"].shape[0]
    offsets = np.arange(b, dtype=np.int64)
    grad_out = np.random.default_rng((args.seed, 99, rank)).standard_normal(
        (b, args.dim), dtype=np.float32
    )
    torch.manual_seed(args.seed)
    mlp = torch.nn.Sequential(
        torch.nn.Linear(n_tables * args.dim, args.dense_hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(args.dense_hidden, args.dense_hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(args.dense_hidden, 1),
    )
    dense_opt = torch.optim.SGD(mlp.parameters(), lr=0.01)
    labels = torch.from_numpy(np.random.default_rng((args.seed, 5, rank)).random((b, 1)) < 0.5)

    def dense_grads(p: Any) -> dict[str, np.ndarray]:
        pooled = [torch.from_numpy(p[t.name].combine(offsets, combiner="sum")) for t in tables]
        x = torch.cat(pooled, dim=1).requires_grad_(True)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(mlp(x), labels.float())
        dense_opt.zero_grad()
        loss.backward()
        dense_opt.step()
        g = x.grad.numpy()  # type: ignore[union-attr]
        return {
            t.name: p[t.name].combine_backward(
                g[:, i * args.dim : (i + 1) * args.dim], offsets, combiner="sum"
            )
            for i, t in enumerate(tables)
        }

    def embedding_grads(p: Any) -> dict[str, np.ndarray]:
        out = {}
        for t in tables:
            p[t.name].combine(offsets, combiner="sum")
            out[t.name] = p[t.name].combine_backward(grad_out, offsets, combiner="sum")
        return out

    counter = CollectiveCounter(world, rank)
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in TABLE_MODES}
    step_no = 0  # every block draws new global batches: no mode sees another's
    for _ in range(args.rounds):
        for mode in TABLE_MODES:
            steps = range(step_no, step_no + n_steps)
            step_no += n_steps
            coll = colls["bfloat16" if mode == "grouped bf16" else "float32"]
            if mode == "pipelined + dense":
                pairs: Any = pipe.run(steps, keys_of=batch)
            elif mode == "per-table":
                pairs = ((s, None) for s in steps)
            else:
                pairs = ((s, coll.pull(batch(s))) for s in steps)  # each after the last push
            marks = [(time.perf_counter(), counter.calls, counter.bytes)]
            for s, p in pairs:
                if mode == "per-table":
                    keys = batch(s)
                    parts = [t.pull(keys[t.name]) for t in tables]
                    grads = embedding_grads({t.name: q for t, q in zip(tables, parts, strict=True)})
                    for t, q in zip(tables, parts, strict=True):
                        t.push(q, grads[t.name])
                else:
                    grads = dense_grads(p) if "dense" in mode else embedding_grads(p)
                    coll.push(p, grads)
                db.advance()
                marks.append((time.perf_counter(), counter.calls, counter.bytes))
            for i in range(args.warmup, n_steps):
                (t0, c0, b0), (t1, c1, b1) = marks[i], marks[i + 1]
                results[mode].append(
                    {"step_s": t1 - t0, "calls": c1 - c0, "bytes": b1 - b0, "s": steps[i]}
                )
    for mode in ("grouped", "grouped bf16"):  # the distinct keys sent off-rank, per step
        for r in results[mode]:
            keys = batch(r["s"])
            r["off"] = sum(
                int((t.placement.owners(np.unique(keys[t.name]), world) != rank).sum())
                for t in tables
            )
    pipe.close()
    db.close()
    return {"modes": results}


def torchrec_tables_rank(
    rank: int, world: int, out: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """TorchRec's ``EmbeddingBagCollection`` of ``args.n_tables`` tables, table-wise sharded
    (table i on rank i mod N, fused EXACT_ADAGRAD), the embedding step of ``tables_rank``."""
    import torch
    import torch.distributed as dist
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan, table_wise
    from torchrec.distributed.types import ShardingEnv, ShardingPlan
    from torchrec.modules.embedding_configs import PoolingType

    n_tables, ids = args.n_tables, max(1, args.ids // args.n_tables)
    cdf = zipf_cdf(ids, args.zipf_a)
    sub = argparse.Namespace(**{**vars(args), "ids": ids, "features": n_tables})
    names = [f"f{i}" for i in range(n_tables)]
    ebc = EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(
                name=f"t{i}",
                embedding_dim=args.dim,
                num_embeddings=ids,
                feature_names=[names[i]],
                pooling=PoolingType.SUM,
            )
            for i in range(n_tables)
        ],
        device=torch.device("meta"),
    )
    plan = ShardingPlan(
        {
            "": construct_module_sharding_plan(
                ebc,
                per_param_sharding={
                    f"t{i}": table_wise(rank=i % world, compute_kernel="fused")
                    for i in range(n_tables)
                },
                local_size=world,
                world_size=world,
                device_type="cpu",
            )
        }
    )
    sharder = EmbeddingBagCollectionSharder(
        fused_params={"optimizer": EmbOptimType.EXACT_ADAGRAD, "learning_rate": 0.01, "eps": 1e-10}
    )
    model = DistributedModelParallel(
        ebc,
        env=ShardingEnv.from_process_group(dist.group.WORLD),
        device=torch.device("cpu"),
        plan=plan,
        sharders=[sharder],
        init_data_parallel=False,
    )
    n_steps = args.warmup + args.steps
    batches = []
    for s in range(n_steps):
        local = rank_slice(global_batch(sub, cdf, s), rank, world)  # (b, T)
        batches.append(
            KeyedJaggedTensor.from_lengths_sync(
                keys=names,
                values=torch.from_numpy(np.ascontiguousarray(local.T).reshape(-1)),
                lengths=torch.ones(local.shape[0] * n_tables, dtype=torch.int32),
            )
        )
    grad_out = torch.from_numpy(
        np.random.default_rng((args.seed, 99, rank)).standard_normal(
            (batches[0].stride(), n_tables * args.dim), dtype=np.float32
        )
    )
    counter = CollectiveCounter(world, rank)
    steps = []
    for s in range(n_steps):
        c0, b0, t0 = counter.calls, counter.bytes, time.perf_counter()
        model(batches[s]).values().backward(grad_out)
        if s >= args.warmup:
            steps.append(
                {
                    "step_s": time.perf_counter() - t0,
                    "calls": counter.calls - c0,
                    "bytes": counter.bytes - b0,
                }
            )
    return {"steps": steps}


def many_tables_section(args: argparse.Namespace, trv: str | None, tr_why: str) -> bool:
    """Section 6: print it; False if a run failed."""
    from _common import print_table

    world = args.ranks
    print()
    print(
        f"6. many tables, {world} ranks: one grouped exchange against one exchange per table "
        f"(global batch {args.batch:,} examples x 1 id per table, Zipf(a={args.zipf_a}) over "
        f"{args.ids:,} ids split evenly over the tables, dim {args.dim}, Adagrad, every row "
        f"created first; modes take turns in blocks of {args.warmup} warm-up + {args.steps} "
        f"timed steps, {args.rounds} rounds; dense: an MLP {args.dense_hidden}-"
        f"{args.dense_hidden}-1 on the pooled features, BCE, SGD)"
    )
    rows, byte_rows = [], []
    for n_tables in args.tables:
        sub = argparse.Namespace(**{**vars(args), "n_tables": n_tables})
        t0 = time.perf_counter()
        results, why = run_ranks("evdb-tables", world, sub)
        if results is None:
            print(f"evdb with {n_tables} tables FAILED: {why}")
            return False
        print(f"(evdb, {n_tables} tables: {time.perf_counter() - t0:.0f} s)", file=sys.stderr)
        modes: dict[str, dict[str, float]] = {}
        for mode in TABLE_MODES:
            per = [r["modes"][mode] for r in results]
            n = len(per[0])
            modes[mode] = {
                "step": med([max(p[i]["step_s"] for p in per) for i in range(n)]),
                "calls": float(np.mean([c["calls"] for c in per[0]])),
                "bytes": med([sum(p[i]["bytes"] for p in per) for i in range(n)]),
            }
            if "off" in per[0][0]:  # bytes against the minimum of the same step
                size = 2 if "bf16" in mode else 4
                off = [sum(p[i]["off"] for p in per) for i in range(n)]
                sent = [sum(p[i]["bytes"] for p in per) for i in range(n)]
                modes[mode]["off"] = med(off)
                modes[mode]["minimum"] = med([k * (16 + 2 * size * args.dim) for k in off])
                ratio = [
                    b / (k * (16 + 2 * size * args.dim)) for b, k in zip(sent, off, strict=True)
                ]
                modes[mode]["ratio"] = med(ratio)
        tr_step, tr_calls, tr_bytes = None, None, None
        if trv is not None:
            tr_res, tr_fail = run_ranks("torchrec-tables", world, sub)
            if tr_res is None:
                print(f"TorchRec with {n_tables} tables failed: {tr_fail}")
            else:
                n = len(tr_res[0]["steps"])
                tr_step = med([max(r["steps"][i]["step_s"] for r in tr_res) for i in range(n)])
                tr_calls = float(np.mean([s["calls"] for s in tr_res[0]["steps"]]))
                tr_bytes = med([sum(r["steps"][i]["bytes"] for r in tr_res) for i in range(n)])
        base = modes["per-table"]["step"]
        for mode in TABLE_MODES:
            v = modes[mode]
            vs = (
                f"{modes['grouped + dense']['step'] / v['step']:.2f}x (vs plain + dense)"
                if mode == "pipelined + dense"
                else ("-" if "dense" in mode else f"{base / v['step']:.2f}x")
            )
            rows.append(
                [
                    f"{n_tables}",
                    mode,
                    f"{v['calls']:.1f}",
                    f"{v['step'] * 1e3:.1f}",
                    f"{1 / v['step']:.1f}",
                    vs,
                ]
            )
        if tr_step is not None:
            g = modes["grouped"]["step"]
            rows.append(
                [
                    f"{n_tables}",
                    "TorchRec table-wise EBC",
                    f"{tr_calls:.1f}",
                    f"{tr_step * 1e3:.1f}",
                    f"{1 / tr_step:.1f}",
                    f"evdb grouped {tr_step / g:.2f}x its steps/s",
                ]
            )
        for mode in ("grouped", "grouped bf16"):
            v = modes[mode]
            byte_rows.append(
                [
                    f"{n_tables}",
                    mode,
                    f"{v['off']:,.0f}",
                    f"{v['minimum']:,.0f}",
                    f"{v['bytes']:,.0f}",
                    f"{v['ratio']:.3f}x",
                ]
            )
        if tr_bytes is not None:
            byte_rows.append(
                [f"{n_tables}", "TorchRec table-wise EBC", "-", "-", f"{tr_bytes:,.0f}", "-"]
            )
    print_table(
        ["tables", "mode", "collectives/step", "step ms", "steps/s", "vs per-table"],
        rows,
        first_left=2,
    )
    print(
        "(collectives counted by wrapping torch.distributed's functions in each rank, the "
        "pipeline's background thread included, per step of rank 0; step: the slowest rank's, "
        "median over the timed steps; pipelined + dense against grouped + dense: the same "
        "step with batch i+1's keys exchanged during batch i's dense compute)"
    )
    print()
    print(f"bytes per step sent to other ranks, all {world} ranks summed, against the minimum")
    print_table(
        ["tables", "mode", "off-rank keys", "minimum", "measured", "vs minimum"],
        byte_rows,
        first_left=2,
    )
    print(
        "(minimum: each distinct key a rank routes off-rank, summed over tables and ranks, x "
        "(16 bytes key + count, a row back and a gradient out at 4 bytes a value, 2 for "
        "bfloat16); measured adds the headers, the admitted flag and the per-table counts; "
        "medians over the steps; vs minimum: the median of each step's own ratio)"
    )
    if trv is None:
        print(f"TorchRec: not run: {tr_why}")
    return True


# -- the parent -----------------------------------------------------------------------------
def med(xs: list[float]) -> float:
    return float(np.median(xs)) if xs else float("nan")


def torchrec_versions() -> tuple[str | None, str]:
    """(versions, "") when torchrec and fbgemm_gpu import here, else (None, the error)."""
    try:
        import fbgemm_gpu
        import torchrec  # noqa: F401
        from torchrec.distributed.model_parallel import DistributedModelParallel  # noqa: F401
    except Exception as e:  # ImportError, or OSError from fbgemm_gpu's .so files
        msg = f"{type(e).__name__}: {e}"
        cause = e.__cause__
        if cause is not None:
            msg += f" (from {type(cause).__name__}: {str(cause)[:300]})"
        return None, msg + f" ({TORCHREC_HINT})"
    from importlib.metadata import version

    return f"torchrec {version('torchrec')}, fbgemm_gpu {fbgemm_gpu.__version__}", ""


def summarize(results: list[Any]) -> dict[str, Any]:
    """Per-step figures combined over the ranks: the step is the slowest rank's; exchange
    and local are per rank, then their medians; bytes summed over the ranks."""
    n = len(results[0]["steps"])
    ranks = [r["steps"] for r in results]
    step = [max(r[i]["step_s"] for r in ranks) for i in range(n)]
    per_rank = []
    for r in ranks:
        exch = [sum(s["exch_phase_s"]) for s in r]
        per_rank.append(
            {
                "step": med([s["step_s"] for s in r]),
                "exch": med(exch),
                "local": med([s["step_s"] - e for s, e in zip(r, exch, strict=True)]),
                "header": med([s["header_s"] for s in r]),
                "payload": med([s["payload_s"] for s in r]),
                "phase": [med([s["phase_s"][j] for s in r]) for j in range(len(PHASES))],
                "phase_exch": [med([s["exch_phase_s"][j] for s in r]) for j in range(len(PHASES))],
                "distinct": med([s["distinct"] for s in r]),
                "distinct_off": med([s["distinct_off"] for s in r]),
                "calls": med([s["calls"] for s in r]),
                "header_calls": med([s["header_calls"] for s in r]),
                "payload_calls": med([s["payload_calls"] for s in r]),
            }
        )
    payload = [sum(r[i]["payload_bytes"] for r in ranks) for i in range(n)]
    header = [sum(r[i]["header_bytes"] for r in ranks) for i in range(n)]
    off = [sum(r[i]["distinct_off"] for r in ranks) for i in range(n)]
    return {
        "step": med(step),
        "per_rank": per_rank,
        "payload_bytes": med(payload),
        "header_bytes": med(header),
        "distinct_off": med(off),
        "rows": results[0]["rows"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=4096, help="global examples per step")
    parser.add_argument("--features", type=int, default=26)
    parser.add_argument("--ids", type=int, default=1_000_000, help="ids (rows) in the table")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--zipf-a", type=float, default=1.1)
    parser.add_argument("--steps", type=int, default=100, help="timed steps")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--ranks", type=int, default=2, help="the sharded run's ranks")
    parser.add_argument("--predict-ranks", type=int, default=8, help="machines to predict for")
    parser.add_argument("--gbits", type=float, default=25.0, help="network Gbit/s per machine")
    parser.add_argument(
        "--latency-us", type=float, default=50.0, help="per collective round, predicted"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="threads per rank (more than 1 on a shared 2-core machine makes OpenMP spin)",
    )
    parser.add_argument("--no-torchrec", action="store_true", help="skip the TorchRec runs")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per run of ranks")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--section",
        choices=("all", "one-table", "many-tables"),
        default="all",
        help="sections 1-5 (one shared table), 6 (many tables), or both",
    )
    parser.add_argument(
        "--tables", default="8,26", help="section 6: numbers of tables, comma-separated"
    )
    parser.add_argument("--table-steps", type=int, default=30, help="section 6: timed steps")
    parser.add_argument("--table-warmup", type=int, default=5, help="section 6: warm-up steps")
    parser.add_argument("--rounds", type=int, default=2, help="section 6: turns of the modes")
    parser.add_argument("--dense-hidden", type=int, default=256, help="section 6: MLP width")
    parser.add_argument("--quick", action="store_true", help="small sizes, a few seconds")
    parser.add_argument("--verbose", action="store_true", help="print failing ranks' tracebacks")
    args = parser.parse_args()
    if args.quick:
        args.ids, args.batch, args.steps, args.warmup = 100_000, 512, 5, 2
        args.table_steps, args.table_warmup, args.rounds = 5, 2, 1
    args.tables = [int(n) for n in str(args.tables).split(",") if n]
    args.cores = len(os.sched_getaffinity(0))

    import torch
    from _common import cpu_line, print_table, versions_line, wall_line

    world = args.ranks
    print("evdb sharded training benchmark (bench/bench_distributed.py)")
    print(cpu_line())
    print(
        f"threads     {args.threads} per rank (numba, OpenMP, torch), so 1 rank computes on "
        f"{args.threads} core(s) and {world} ranks on {world * args.threads}"
    )
    print(versions_line(torch.__version__))
    if args.section != "many-tables":  # section 6 prints its own step
        print(
            f"step        global batch {args.batch:,} examples x {args.features} features x 1 "
            f"id = {args.batch * args.features:,} bags (sum pooling), split by example over the "
            f"ranks; ids Zipf(a={args.zipf_a}) over {args.ids:,}; one shared table, dim "
            f"{args.dim} float32, Adagrad (lr 0.01, init acc 0.1, eps 1e-10), every row created "
            "first, all in DRAM; "
            f"{args.warmup} warm-up + {args.steps} timed steps"
        )
    print(
        f"transport   gloo on 127.0.0.1 (loopback), spawned ranks, process group timeout "
        f"{PG_TIMEOUT_S} s, each run bounded by {args.timeout:.0f} s; evdb placement 'hash'"
    )
    trv, tr_why = (None, "--no-torchrec") if args.no_torchrec else torchrec_versions()
    print(f"torchrec    {trv if trv else 'not run: ' + tr_why}")
    sys.stdout.flush()

    six = argparse.Namespace(
        **{**vars(args), "steps": args.table_steps, "warmup": args.table_warmup}
    )
    if args.section == "many-tables":
        ok = many_tables_section(six, trv, tr_why)
        print(wall_line())
        return 0 if ok else 1

    runs: dict[int, dict[str, Any]] = {}
    for w in (1, world):
        t0 = time.perf_counter()
        results, why = run_ranks("evdb", w, args)
        if results is None:
            print(f"\nevdb on {w} rank(s) FAILED: {why}")
            return 1
        runs[w] = summarize(results)
        print(f"(evdb, {w} rank(s): {time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    base, shard = runs[1], runs[world]
    ex = args.batch

    # 1. step time, local work and exchange, per rank
    print()
    print(f"1. evdb step, {world} ranks against 1 rank (ms per step, medians over the steps)")
    rows = []
    for w, run in runs.items():
        for r, pr in enumerate(run["per_rank"]):
            rows.append(
                [
                    f"{w} rank{'s' if w > 1 else ''}, rank {r}",
                    f"{pr['step'] * 1e3:.1f}",
                    f"{pr['local'] * 1e3:.1f}",
                    f"{pr['exch'] * 1e3:.1f}",
                    f"{pr['header'] * 1e3:.1f}",
                    f"{pr['payload'] * 1e3:.1f}",
                    f"{pr['exch'] / pr['step']:.0%}",
                    f"{pr['header_calls']:.0f}+{pr['payload_calls']:.0f}",
                    f"{pr['distinct']:,.0f}",
                    f"{pr['distinct_off']:,.0f}",
                ]
            )
    print_table(
        [
            "run",
            "step",
            "local",
            "exchange",
            "headers",
            "payloads",
            "exch %",
            "calls h+p",
            "distinct",
            "off-rank",
        ],
        rows,
        first_left=1,
    )
    b_step, s_step = base["step"], shard["step"]
    b_local = base["per_rank"][0]["local"]
    s_local = max(pr["local"] for pr in shard["per_rank"])
    s_exch = max(pr["exch"] for pr in shard["per_rank"])
    print(
        f"global step (slowest rank): 1 rank {b_step * 1e3:.1f} ms = {ex / b_step:,.0f} "
        f"examples/s; {world} ranks {s_step * 1e3:.1f} ms = {ex / s_step:,.0f} examples/s: "
        f"{b_step / s_step:.2f}x the 1-rank rate; table rows after the run: "
        f"{base['rows']:,} and {shard['rows']:,}"
    )
    print(
        f"local work per rank: {s_local / b_local:.2f}x the 1-rank step's local work "
        f"(ideal 1/{world} = {1 / world:.2f}x: each rank has 1/{world} of the examples and its "
        f"own core); exchange {s_exch / b_local:.2f}x the 1-rank local work"
    )
    print(
        f"(this machine has {args.cores} cores shared by the ranks, and loopback for a network: "
        "the run shows the sharding's overhead, not a speed-up. local = step - exchange; "
        "exchange = time inside the Exchange's collectives, including waiting for the slower "
        "rank; headers: the all_gather that opens each collective operation, payloads: the "
        "all_to_all_single calls; calls h+p: header and payload collectives per step)"
    )

    print()
    print("2. evdb step split by phase, ms (local / exchange), medians, rank 0")
    prow = []
    for w, run in runs.items():
        pr = run["per_rank"][0]
        prow.append(
            [f"{w} rank{'s' if w > 1 else ''}"]
            + [
                f"{(t - e) * 1e3:.1f} / {e * 1e3:.1f}"
                for t, e in zip(pr["phase"], pr["phase_exch"], strict=True)
            ]
        )
    print_table(["run", *PHASES], prow, first_left=1)

    # 3. bytes on the wire
    d = args.dim
    off = shard["distinct_off"]
    predicted = off * (16 + 4 * d + 4 * d)
    payload, header = shard["payload_bytes"], shard["header_bytes"]
    print()
    print(f"3. bytes on the wire per step, {world} ranks (sent to other ranks, all ranks summed)")
    print_table(
        ["what", "bytes", "vs predicted"],
        [
            [
                f"predicted minimum: {off:,.0f} distinct keys off-rank x (16 + 4 dim) out and "
                "back + 4 dim gradients",
                f"{predicted:,.0f}",
                "1.00x",
            ],
            [
                "measured payloads (all_to_all_single: keys+counts, rows+admitted, gradients)",
                f"{payload:,.0f}",
                f"{payload / predicted:.4f}x" if predicted else "-",
            ],
            [
                "measured headers (the all_gather of each operation)",
                f"{header:,.0f}",
                f"{header / predicted:.4f}x" if predicted else "-",
            ],
            [
                "measured total",
                f"{payload + header:,.0f}",
                f"{(payload + header) / predicted:.4f}x" if predicted else "-",
            ],
        ],
        first_left=1,
    )
    print(
        f"(payloads over the minimum: the admitted flag travels back as one more float32 column, "
        f"4 bytes a key: {(16 + 8 * d + 4) / (16 + 8 * d):.4f}x expected)"
    )

    # 4. TorchRec
    print()
    print("4. TorchRec row-wise sharded EmbeddingBagCollection, the same step (gloo, CPU)")
    tr: dict[int, Any] = {}
    if trv is None:
        print(f"not run: {tr_why}")
    else:
        for w in (1, world):
            results, why = run_ranks("torchrec", w, args)
            if results is None:
                print(f"TorchRec on {w} rank(s) failed: {why}")
                break
            n = len(results[0]["steps"])
            tr[w] = {
                "step": med([max(r["steps"][i]["step_s"] for r in results) for i in range(n)]),
                "bytes": med([sum(r["steps"][i]["bytes"] for r in results) for i in range(n)]),
                "calls": med([r["steps"][i]["calls"] for r in results for i in range(n)]),
                "by_name": {
                    c: med([sum(r["steps"][i].get(c, 0) for r in results) for i in range(n)])
                    for c in TORCH_COLLECTIVES
                    if any(c in st for r in results for st in r["steps"])
                },
                "rows_changed": sum(r["rows_changed"] for r in results),
            }
        if tr:
            trows = []
            for w, v in tr.items():
                trows.append(
                    [
                        f"TorchRec, {w} rank{'s' if w > 1 else ''}",
                        f"{v['step'] * 1e3:.1f}",
                        f"{ex / v['step']:,.0f}",
                        f"{tr[1]['step'] / v['step']:.2f}x",
                        f"{v['step'] / runs[w]['step']:.2f}x",
                        f"{v['bytes']:,.0f}" if w > 1 else "-",
                        f"{v['bytes'] / (payload + header):.2f}x" if w > 1 else "-",
                        f"{v['calls']:.0f}",
                    ]
                )
            print_table(
                [
                    "run",
                    "step ms",
                    "examples/s",
                    "vs 1 rank",
                    "evdb/TorchRec",
                    "bytes",
                    "vs evdb",
                    "calls",
                ],
                trows,
                first_left=1,
            )
            print(
                "(TorchRec: forward (input all_to_all of the KJT, per-rank lookup, pooled "
                "outputs reduce-scattered) + backward with fused EXACT_ADAGRAD (accumulators "
                "from 0: fbgemm has no initial value); evdb/TorchRec: "
                "evdb's examples/s over TorchRec's at the same ranks (above 1x: evdb faster); "
                "bytes: tensors its torch.distributed calls send to other ranks, all ranks "
                "summed (vs evdb: over evdb's "
                f"{payload + header:,.0f}); calls: those made synchronously, per rank)"
            )
            for w, v in tr.items():
                parts = ", ".join(f"{c} {b:,.0f}" for c, b in v["by_name"].items() if b)
                print(
                    f"TorchRec, {w} rank{'s' if w > 1 else ''}: rows the fused optimizer changed "
                    f"{v['rows_changed']:,}; bytes by call: {parts or 'none'}"
                )

    # 5. prediction
    n8 = args.predict_ranks
    cdf = zipf_cdf(args.ids, args.zipf_a)
    from evdb.distributed.placement import Placement

    placement = Placement("hash")
    off8 = []
    for s in range(min(args.steps, 4)):
        batch = global_batch(args, cdf, 10_000 + s)
        for r in range(n8):
            uniq = np.unique(rank_slice(batch, r, n8))
            off8.append(int((placement.owners(uniq, n8) != r).sum()))
    off8_max = float(np.percentile(off8, 90))
    per_key = (payload + header) / max(off, 1)  # measured bytes per off-rank key
    out_bytes = off8_max * per_key  # what the busiest rank sends (and, alike, receives)
    bw = args.gbits * 1e9 / 8
    h_calls = shard["per_rank"][0]["header_calls"]
    p_calls = shard["per_rank"][0]["payload_calls"]
    hops = h_calls * (n8 - 1) + p_calls  # gloo's all_gather is a ring: N - 1 hops
    lat = hops * args.latency_us * 1e-6
    local8 = b_local / n8 * (s_local * world / b_local)
    exch8 = out_bytes / bw + lat
    step8 = local8 + exch8
    print()
    print(f"5. prediction for {n8} machines, one rank each, the same global batch")
    print(
        f"distinct keys a rank routes off-rank: {np.median(off8):,.0f} (90th percentile "
        f"{off8_max:,.0f}; drawn here with the {n8}-way hash placement)\n"
        f"bytes per off-rank key measured at {world} ranks: {per_key:.1f} "
        f"(minimum {16 + 8 * d}); a rank sends {out_bytes / 1e6:.2f} MB and receives about "
        f"as much per step\n"
        f"exchange: {out_bytes / 1e6:.2f} MB / {args.gbits:g} Gbit/s = "
        f"{out_bytes / bw * 1e3:.2f} ms, + latency: ({h_calls:.0f} header all_gathers x "
        f"{n8 - 1} ring hops + {p_calls:.0f} all_to_all_single) x {args.latency_us:g} us = "
        f"{lat * 1e3:.2f} ms -> {exch8 * 1e3:.2f} ms\n"
        f"local work: the 1-rank local work / {n8} x the {world}-rank overhead measured here "
        f"({s_local * world / b_local:.2f}x) = {local8 * 1e3:.2f} ms\n"
        f"step {step8 * 1e3:.2f} ms (no overlap of exchange and work) = {1 / step8:,.0f} "
        f"steps/s = {ex / step8:,.0f} examples/s: {b_step / step8:.2f}x the 1-rank rate "
        f"measured here; exchange {exch8 / step8:.0%} of the step"
    )
    if world in tr and world > 1:
        # row-wise: each rank reduce-scatters the pooled outputs of the whole global batch
        # (and all-gathers their gradients): (N - 1) / N of them leave the rank at any N
        tr8 = tr[world]["bytes"] / world * ((n8 - 1) / n8) / ((world - 1) / world)
        print(
            f"TorchRec row-wise at {n8}: a rank sends {tr8 / 1e6:.2f} MB per step (its measured "
            f"bytes scaled by (N - 1) / N: pooled outputs and their gradients, not distinct "
            f"rows) = {tr8 / bw * 1e3:.2f} ms at {args.gbits:g} Gbit/s; "
            f"{tr8 / max(out_bytes, 1):.1f}x evdb's"
        )
    if args.section == "all" and not many_tables_section(six, trv, tr_why):
        print(wall_line())
        return 1
    print(wall_line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
