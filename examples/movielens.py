"""Train a small DeepFM on MovieLens 100K with evdb tables, then checkpoint and export it.

``python examples/movielens.py [--out DIR]`` (the README's ``make run``), or on several
processes with sharded tables: ``torchrun --standalone --nproc_per_node 2
examples/movielens.py [--out DIR]`` (each rank trains on its part of every global batch, the
tables are ``evdb.distributed`` tables sharded over the ranks, the dense part is wrapped in
``DistributedDataParallel``; rank 0 prints, and exports the shards merged).

Data: the 100,000 ratings of MovieLens 100K (943 users, 1,682 items), fetched once from the
PyPI wheel ``recbole==1.2.1`` that ships them (``pip download``; see ``../shared/data``'s
README) and cached under ``~/.cache/evdb``. A rating of 4 or more is a positive; the last 20%
of the ratings by time are held out. Without network access the script falls back to a
synthetic click log with Zipf-distributed users and items and a fixed seed, and says so.

Model: DeepFM over two sparse features, ``user`` and ``item`` (raw ids as int64 keys, no
vocabulary), each an evdb table of dim 16 trained with fused Adagrad: a first-order bias per
key (a dim-1 table), the factorization-machine dot product of the two embeddings, and an MLP
over their concatenation; binary cross-entropy. The tables' DRAM tier holds 30% of the ids,
so rows spill to RocksDB and come back; admission needs an id seen twice; rows unused for
``--ttl-steps`` expire. Per epoch it prints the training loss, held-out AUC and examples/s,
then it checkpoints the database, exports a serving snapshot and checks that the snapshot
scores the held-out set exactly as the model does. It also publishes the tables every
``--publish-every`` steps into ``--publish-root`` (``Database.publish``: a full snapshot
first, then deltas of the rows trained since; under torchrun one root for every rank's shard,
merged), which ``evdb serve ROOT --follow`` serves as training goes, prints what the
publications cost, and (with the serve extra) checks that a follower of the root serves
exactly the trained rows. Last (with the serve extra installed, unless ``--no-serve``), it
starts ``evdb serve`` on the snapshot, asks it for held-out items' embeddings over HTTP,
checks them against the snapshot read directly, prints the curl line that asks the same, and
stops the server (``make serve`` keeps one running). ``--tensorboard DIR`` logs the loss,
the held-out AUC and, every ``LOG_EVERY`` steps, each table's figures (``evdb.torch_metrics
.StatsLogger``: rows per tier, the keys each tier answered and their share, admissions,
evictions, expirations, under ``/metrics``' names) to TensorBoard (``pip install
tensorboard``; without it the flag is a usage error saying so).
"""

from __future__ import annotations

import os

# Under torchrun the ranks on this machine share its cores: numba's pool sized for all of them
# in every rank oversubscribes them (2 ranks on 2 cores: 11.9K examples/s, 27.3K with one
# thread each). Its size is read once, when numba is first imported, so it is set here, before
# evdb imports numba; torchrun already sets OMP_NUM_THREADS=1 for torch.
if "LOCAL_WORLD_SIZE" in os.environ and "NUMBA_NUM_THREADS" not in os.environ:
    _share = (os.cpu_count() or 1) // int(os.environ["LOCAL_WORLD_SIZE"])
    os.environ["NUMBA_NUM_THREADS"] = str(max(1, _share))

import argparse
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import evdb
from evdb import distributed as evd
from evdb.config import Rounding, RowDtype
from evdb.torch import EmbeddingBagCollection
from evdb.torch_metrics import StatsLogger

DIM = 16
CACHE = Path.home() / ".cache" / "evdb" / "ml-100k.inter"
WHEEL = "recbole==1.2.1"
MEMBER = "recbole/dataset_example/ml-100k/ml-100k.inter"


# -- data -----------------------------------------------------------------------------------
def fetch_movielens() -> Path | None:
    """The ratings file, from the cache or the recbole wheel; None when it cannot be had."""
    if CACHE.exists():
        return CACHE
    with tempfile.TemporaryDirectory() as tmp:
        try:
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                 "--only-binary", ":all:", "-d", tmp, WHEEL],
                check=True, timeout=180, capture_output=True,
            )  # fmt: skip
            wheel = next(Path(tmp).glob("recbole-*.whl"))
            CACHE.parent.mkdir(parents=True, exist_ok=True)
            with zipfile.ZipFile(wheel) as z, z.open(MEMBER) as src, CACHE.open("wb") as dst:
                shutil.copyfileobj(src, dst)
        except (OSError, subprocess.SubprocessError, StopIteration, KeyError):
            return None
    return CACHE


def load(path: Path | None, seed: int) -> tuple[str, np.ndarray, np.ndarray, np.ndarray]:
    """(source, users, items, labels), sorted by time."""
    if path is not None:
        table = np.loadtxt(path, skiprows=1, dtype=np.float64)  # user item rating timestamp
        order = np.argsort(table[:, 3], kind="stable")
        t = table[order]
        return "MovieLens 100K", t[:, 0].astype(np.int64), t[:, 1].astype(np.int64), t[:, 2] >= 4
    rng = np.random.default_rng(seed)  # a synthetic click log: Zipf ids, hidden biases
    n, n_users, n_items = 100_000, 2_000, 4_000
    users = np.minimum(rng.zipf(1.3, n), n_users).astype(np.int64)
    items = np.minimum(rng.zipf(1.2, n), n_items).astype(np.int64)
    bias = rng.standard_normal(n_users + 1)[users] + rng.standard_normal(n_items + 1)[items]
    taste = rng.standard_normal(n_users + 1)[users] * rng.standard_normal(n_items + 1)[items]
    logit = 1.5 * bias + taste
    return "synthetic Zipf clicks", users, items, rng.random(n) < 1 / (1 + np.exp(-logit))


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve: the Mann-Whitney statistic over average ranks (ties count
    half), as sklearn's roc_auc_score computes it."""
    order = np.argsort(scores, kind="stable")
    ranks = np.empty(scores.shape[0], dtype=np.float64)
    ranks[order] = np.arange(1, scores.shape[0] + 1)
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    ranks = (sums / counts)[inverse]  # average rank within ties
    pos = labels.astype(bool)
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


# -- model ----------------------------------------------------------------------------------
class DeepFM(nn.Module):
    """First-order biases + FM interaction + MLP over the user and item embeddings."""

    def __init__(self, db: evdb.Database | evd.ShardedDatabase) -> None:
        super().__init__()
        self.embed = EmbeddingBagCollection(
            {"user": db.table("user"), "item": db.table("item")}, mode="sum"
        )
        self.bias = EmbeddingBagCollection(
            {"user": db.table("user_bias"), "item": db.table("item_bias")}, mode="sum"
        )
        self.mlp = nn.Sequential(nn.Linear(2 * DIM, 64), nn.ReLU(), nn.Linear(64, 1))
        self.global_bias = nn.Parameter(torch.zeros(1))

    def forward(self, users: np.ndarray, items: np.ndarray) -> torch.Tensor:
        offsets = torch.arange(users.shape[0])
        features = {
            "user": (torch.from_numpy(users), offsets),
            "item": (torch.from_numpy(items), offsets),
        }
        e = self.embed(features)
        b = self.bias(features)
        fm = (e["user"] * e["item"]).sum(dim=1)
        deep = self.mlp(torch.cat([e["user"], e["item"]], dim=1)).squeeze(1)
        return self.global_bias + b["user"].squeeze(1) + b["item"].squeeze(1) + fm + deep


def create_tables(
    db: evdb.Database | evd.ShardedDatabase,
    n_users: int,
    n_items: int,
    ttl_steps: int,
    *,
    dtype: RowDtype = "float32",
    rounding: Rounding = "stochastic",
    seed: int = 0,
    lr: float = 0.05,
) -> None:
    """The model's four tables; dtype, rounding, the embeddings' initializer seed and the
    learning rate are bench/bench_lowp_quality.py's knobs (the example keeps the defaults)."""
    common = dict(
        admission=evdb.admission.Counter(min_count=2),
        optimizer=evdb.optim.Adagrad(lr=lr),
        ttl_steps=ttl_steps,
        dtype=dtype,
        rounding=rounding,
    )
    for name, n in (("user", n_users), ("item", n_items)):
        dram = max(64, int(0.3 * n))  # 30% of the ids: the rest lives in RocksDB
        init = evdb.init.Normal(0.0, 0.01, seed)  # the tables' default initializer, seeded
        db.create_table(name, dim=DIM, dram_rows=dram, initializer=init, **common)
        db.create_table(
            f"{name}_bias", dim=1, dram_rows=dram, initializer=evdb.init.Zeros(), **common
        )


def train_epoch(
    trained: nn.Module,
    db: evdb.Database | evd.ShardedDatabase,
    dense: torch.optim.Optimizer,
    data: tuple[np.ndarray, np.ndarray, np.ndarray],
    order: np.ndarray,
    batch_size: int,
    *,
    rank: int = 0,
    world: int = 1,
    after_step: Callable[[int, float], None] | None = None,
) -> list[float]:
    """One pass over the examples ``order`` picks from ``data`` (users, items, labels), in
    global batches of ``batch_size`` (this rank trains on its part); the tables learn through
    their fused optimizer, the dense parameters through ``dense``. ``after_step(step, loss)``
    runs after each ``db.advance()``. Returns each step's loss."""
    users, items, labels = data
    loss_fn = nn.BCEWithLogitsLoss(reduction="sum")
    losses = []
    for s in range(0, order.shape[0], batch_size):
        batch = order[s : s + batch_size]
        b = np.array_split(batch, world)[rank]  # this rank's part of the global batch
        logits = trained(users[b], items[b])
        # the global batch's mean: each rank's share of the sum, over the global size, so
        # the rows' gradients, summed at their owners, are one process's; the dense ones,
        # which DDP averages, are scaled back up by the world size
        loss = loss_fn(logits, torch.as_tensor(labels[b], dtype=torch.float32))
        loss = loss / batch.shape[0]
        dense.zero_grad()
        loss.backward()  # pushes the embedding gradients into the tables (fused Adagrad)
        if world > 1:
            for group in dense.param_groups:
                for p in group["params"]:
                    p.grad.mul_(world)
        dense.step()
        step = db.advance()
        losses.append(float(loss.detach()) * world)
        if after_step is not None:
            after_step(step, losses[-1])
    return losses


def score(model: DeepFM, users: np.ndarray, items: np.ndarray, batch: int) -> np.ndarray:
    model.eval()
    with torch.no_grad():
        out = [
            model(users[s : s + batch], items[s : s + batch]).numpy()
            for s in range(0, users.shape[0], batch)
        ]
    model.train()
    return np.concatenate(out)


# -- main -----------------------------------------------------------------------------------
LOG_EVERY = 20  # steps between two TensorBoard logs of the tables' figures


def _summary_writer(parser: argparse.ArgumentParser, logdir: Path) -> Any:
    """A TensorBoard SummaryWriter on logdir; tensorboard is optional: without it, a usage
    error that says how to get it (nothing else needs it)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        parser.error(
            "--tensorboard needs the tensorboard package, which is not installed: "
            "pip install tensorboard (or run without --tensorboard)"
        )
    return SummaryWriter(str(logdir))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="where the database, checkpoint and export go")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--ttl-steps", type=int, default=400, help="rows unused this long expire")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--synthetic", action="store_true", help="skip MovieLens")
    parser.add_argument("--no-serve", action="store_true", help="skip the REST check")
    parser.add_argument(
        "--publish-root",
        type=Path,
        help="publish the tables here during training (default: OUT/publish)",
    )
    parser.add_argument(
        "--publish-every", type=int, default=100, help="steps between publications (0: none)"
    )
    parser.add_argument(
        "--tensorboard",
        type=Path,
        metavar="DIR",
        help="log the loss and each table's figures (rows per tier, hit rates, admissions, "
        "evictions, expirations: /metrics' names) to TensorBoard event files in DIR",
    )
    args = parser.parse_args(argv)
    writer = None if args.tensorboard is None else _summary_writer(parser, args.tensorboard)
    torch.manual_seed(args.seed)
    rank, world = _rank_and_world()
    if world > 1 and args.out is None:
        parser.error("--out is needed under torchrun: a directory every rank can reach")
    out = args.out or Path(tempfile.mkdtemp(prefix="evdb-movielens-"))
    if rank == 0:  # first: the others wait, then find the cache filled
        for name in ("db", "checkpoint", "serving", "publish"):
            shutil.rmtree(out / name, ignore_errors=True)
        ratings = None if args.synthetic else fetch_movielens()
    _barrier(world)
    if rank != 0:
        ratings = None if args.synthetic else fetch_movielens()
    source, users, items, labels = load(ratings, args.seed)
    split = int(0.8 * users.shape[0])
    if rank == 0:
        print(
            f"{source}: {users.shape[0]:,} examples, {np.unique(users).shape[0]:,} users, "
            f"{np.unique(items).shape[0]:,} items, {labels.mean():.1%} positive; "
            f"train on the first {split:,} by time, test on the rest"
        )
    rng = np.random.default_rng(args.seed)
    # every rank scores the whole held-out set: lookups are collective, so all make the same calls
    db = evd.open(out / "db") if world > 1 else evdb.open(out / "db")
    create_tables(db, np.unique(users).shape[0], np.unique(items).shape[0], args.ttl_steps)
    model = DeepFM(db)
    dense_params = list(model.parameters())
    trained: nn.Module = model
    if world > 1:  # the dense part: gradients averaged over the ranks
        trained = nn.parallel.DistributedDataParallel(model)
    dense = torch.optim.Adam(dense_params, lr=1e-3)
    test_u, test_i, test_y = users[split:], items[split:], labels[split:]
    publish_root = args.publish_root or out / "publish"  # sharded: one root, the shards merged
    published: list[dict[str, Any]] = []
    # sharded tables' stats are collective: every rank logs, rank 0 writes
    metrics = StatsLogger(writer if rank == 0 else None, [db.table(n) for n in db.tables()])

    def after_step(step: int, loss: float) -> None:
        if args.publish_every and step % args.publish_every == 0:
            published.append(db.publish(publish_root))  # a server following it sees this
        if writer is not None and step % LOG_EVERY == 0:
            metrics.log(step)
            if rank == 0:
                writer.add_scalar("train/loss", loss, step)

    for epoch in range(1, args.epochs + 1):
        t0 = time.perf_counter()
        losses = train_epoch(
            trained, db, dense, (users, items, labels), rng.permutation(split), args.batch,
            rank=rank, world=world, after_step=after_step,
        )  # fmt: skip
        rate = split / (time.perf_counter() - t0)
        held_out = auc(test_y, score(model, test_u, test_i, 4096))
        if writer is not None and rank == 0:
            writer.add_scalar("eval/auc", held_out, int(db.step))
        tiers = db.table("item").stats()["tiers"]
        item_rows = len(db.table("item"))
        if rank == 0:
            print(
                f"epoch {epoch}: train loss {np.mean(losses):.4f}, held-out AUC "
                f"{held_out:.4f}, {rate:,.0f} examples/s; item rows {item_rows:,} "
                f"(DRAM {tiers['dram']['rows']:,}, disk {tiers['rocksdb']['rows']:,}, "
                f"promoted {tiers['dram']['promotions']:,}, written back "
                f"{tiers['dram']['written_back']:,})" + (f" on {world} ranks" if world > 1 else "")
            )
    if writer is not None:
        writer.close()
        if rank == 0:
            print(f"TensorBoard: tensorboard --logdir {args.tensorboard}")
    if published:
        published.append(db.publish(publish_root))  # the final state (collective when sharded)
        ids = {"user": np.unique(test_u), "item": np.unique(test_i)}
        trained = {n: db.table(n).lookup(ids[n.removesuffix("_bias")]) for n in db.tables()}
        if rank == 0:
            deltas = [p for p in published if p["kind"] == "delta"]
            rows = sum(p["rows"] for p in deltas)
            per = sum(p["seconds"] for p in deltas) / max(rows, 1) * 1e5
            print(
                f"published: {len(published)} publications to {publish_root} (last seq "
                f"{published[-1]['seq']}; {len(published) - len(deltas)} full, {len(deltas)} "
                f"deltas of {rows / max(len(deltas), 1):,.0f} changed rows on average, "
                f"{sum(p['bytes'] for p in deltas) / max(len(deltas), 1) / 1e3:,.0f} kB and "
                f"{per:.2f} s per 10^5 changed rows)"
            )
            same_rows = follows_exactly(publish_root, ids, trained)
            if same_rows is not None:
                print(f"a follower of {publish_root} serves the trained rows exactly: {same_rows}")
                if not same_rows:
                    return 1
    stats = db.table("user").stats()
    if rank == 0:
        print(
            f"admission: {stats['admission']['not_admitted']:,} user-id pulls not admitted "
            f"yet; TTL: {stats['expired_on_pull']:,} expired user rows restarted"
        )

    scores = score(model, test_u, test_i, 4096)
    manifest = db.checkpoint(out / "checkpoint")
    if world > 1:
        db.close()
        if rank != 0:
            return 0
        shards = manifest["checkpoint"]["shards"]
        print(f"checkpoint: {out / 'checkpoint'} (step {manifest['step']}, {len(shards)} shards)")
        exported = evdb.export(out / "checkpoint", out / "serving")  # the shards merged
    else:
        exported = evdb.export(db, out / "serving", format="serving")
        db.close()
        print(
            f"checkpoint: {out / 'checkpoint'} (step {manifest['step']}, "
            f"{sum(f['size'] for f in manifest['files'].values()):,} bytes, checksummed)"
        )
    with evdb.open(out / "serving", read_only=True) as served:  # what inference would read
        serving_model = DeepFM(served)
        serving_model.load_state_dict(model.state_dict())
        same = np.array_equal(score(serving_model, test_u, test_i, 4096), scores)
    rows = sum(t["rows"] for t in exported["tables"].values())
    print(
        f"serving export: {out / 'serving'} ({rows:,} rows, values only); its scores of the "
        f"held-out set equal the model's: {same}"
    )
    if not same:
        return 1
    if args.no_serve:
        return 0
    return serve_once(out / "serving", [int(k) for k in np.unique(test_i)[:3]])


def follows_exactly(
    root: Path, ids: dict[str, np.ndarray], trained: dict[str, np.ndarray]
) -> bool | None:
    """Whether a server following root (``evdb.api.follow``, as ``evdb serve ROOT --follow``
    runs it) reads every table's rows of ids bit for bit as the trainer did (``trained``, the
    trainer's lookups); None without the serve extra."""
    try:
        from evdb.api.follow import Follower
        from evdb.api.snapshots import SnapshotHolder
    except ImportError:
        return None
    holder = SnapshotHolder()
    follower = Follower(root, holder)
    try:
        if not follower.poll():
            return False
        view = holder.current
        assert view is not None
        for name, want in trained.items():
            keys = ids[name.removesuffix("_bias")]
            if not np.array_equal(view.lookup(name, view.tables[name], keys), want):
                return False
        return True
    finally:
        follower.close()
        holder.close()


def _rank_and_world() -> tuple[int, int]:
    """(0, 1) on one process; under torchrun, join the job (gloo on 127.0.0.1 via
    --standalone) and return this rank and the world size."""
    import os

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1
    import torch.distributed as dist

    dist.init_process_group("gloo")
    return dist.get_rank(), world


def _barrier(world: int) -> None:
    if world > 1:
        import torch.distributed as dist

        dist.barrier()


# -- serving --------------------------------------------------------------------------------
def serve_once(snapshot: Path, keys: list[int]) -> int:
    """Start ``evdb serve`` on the snapshot, look ``keys`` up in ``item`` over HTTP, compare
    with the snapshot opened directly, print the curl line, stop the server."""
    try:
        import evdb.api  # the serve extra
    except ImportError:
        print("REST: skipped (pip install 'evdb[serve]' to serve the snapshot)")
        return 0
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "evdb", "serve", str(snapshot), "--port", str(port)]
    server = subprocess.Popen([*cmd, "--log-level", "warning"])
    url = f"http://127.0.0.1:{port}/v1/tables/item/lookup"
    body = json.dumps({"keys": keys})
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                request = urllib.request.Request(
                    url, body.encode(), {"content-type": "application/json"}
                )
                with urllib.request.urlopen(request, timeout=5) as response:
                    answer = json.loads(response.read())
                break
            except (urllib.error.URLError, ConnectionError):
                if server.poll() is not None or time.monotonic() > deadline:
                    print("REST: evdb serve did not answer")
                    return 1
                time.sleep(0.2)
    finally:
        server.terminate()
        server.wait(timeout=30)
    with evdb.open(snapshot, read_only=True) as served:
        want = served.table("item").lookup(keys)
    same = np.array_equal(np.array(answer["embeddings"], dtype=np.float32), want)
    print(
        f"REST: evdb serve answered {len(keys)} item lookups over HTTP (found "
        f"{answer['found']}), equal to the snapshot read directly: {same}\n"
        f"  serve it:  evdb serve {snapshot} --port 8000     (or: make serve)\n"
        f"  query it:  curl -s -X POST localhost:8000/v1/tables/item/lookup "
        f"-H 'content-type: application/json' -d '{body}'"
    )
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
