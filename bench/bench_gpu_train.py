"""A training step with the hot rows in HBM, against torch.nn.EmbeddingBag(sparse=True) on CUDA.

Setup (printed first): one CUDA device; a vocabulary of ``--vocab`` keys (2M) of dim
``--dim`` (64), batches of ``--batch`` bags (4096) of ``--bag`` keys (8) drawn Zipf(1.1), so
most of a batch's keys are hot; Adagrad on both sides. ``--hbm-rows`` (256k) of the rows fit
in the HBM tier, the rest live in an unbounded DRAM tier below it (no disk).

One step, on each side: forward of the bags, a squared loss against a fixed target, backward,
the optimizer step; keys and target are CUDA tensors.

* baseline: ``torch.nn.EmbeddingBag(vocab, dim, mode="sum", sparse=True)`` on CUDA with
  ``torch.optim.Adagrad`` (every row in device memory).
* evdb: ``evdb.torch.EmbeddingBag`` over a table with ``hbm_rows`` on device 0; its output
  is moved to the device for the loss (the binding pulls and pushes through host arrays:
  see the printed note).

Figures: the median step time of each over ``--steps`` steps after ``--warmup`` steps,
their ratio, and the HBM tier's share of the keys pulled. Without CUDA torch, cupy or a
device the script prints "no GPU: skipped" and exits 0.

Run: ``python bench/bench_gpu_train.py`` (about 1 GiB of device memory at the defaults).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np


def batches(args: argparse.Namespace, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(args.warmup + args.steps):
        keys = (rng.zipf(1.1, args.batch * args.bag) - 1) % args.vocab
        offsets = np.arange(0, args.batch * args.bag, args.bag)
        out.append((keys.astype(np.int64), offsets.astype(np.int64)))
    return out


def run(
    torch: Any, module: Any, opt: Any, data: list, args: argparse.Namespace, after: Any = None
) -> list[float]:
    """Step times (seconds) of module over data, the first ``warmup`` left out."""
    dev = torch.device("cuda:0")
    target = torch.ones((args.batch, args.dim), device=dev)
    times = []
    for keys, offsets in data:
        k, o = torch.from_numpy(keys).to(dev), torch.from_numpy(offsets).to(dev)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = module(k, o).to(dev)
        loss = ((out - target) ** 2).sum()
        if opt is not None:
            opt.zero_grad()
        loss.backward()
        if opt is not None:
            opt.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        if after is not None:
            after()  # not timed: the table's clock
    return times[args.warmup :]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vocab", type=int, default=2_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--bag", type=int, default=8)
    parser.add_argument("--hbm-rows", type=int, default=1 << 18)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("no GPU: skipped (no torch)")
        return 0
    from evdb.errors import ConfigError
    from evdb.tiers.hbm import require_device

    if not torch.cuda.is_available():
        print("no GPU: skipped (torch has no CUDA device)")
        return 0
    try:
        require_device(0)
    except ConfigError as exc:
        print(f"no GPU: skipped ({exc})")
        return 0
    import evdb
    from evdb.torch import EmbeddingBag

    print(
        f"{torch.cuda.get_device_name(0)}; torch {torch.__version__}; vocab {args.vocab:,} "
        f"dim {args.dim}; {args.batch} bags x {args.bag} keys, Zipf(1.1); hbm_rows "
        f"{args.hbm_rows:,}; Adagrad; median of {args.steps} steps after {args.warmup}"
    )
    data = batches(args, seed=1)
    ref = torch.nn.EmbeddingBag(args.vocab, args.dim, mode="sum", sparse=True).cuda()
    ref_opt = torch.optim.Adagrad(ref.parameters(), lr=0.05, initial_accumulator_value=0.1)
    base = statistics.median(run(torch, ref, ref_opt, data, args))
    del ref, ref_opt
    torch.cuda.empty_cache()
    with tempfile.TemporaryDirectory() as tmp, evdb.open(f"{tmp}/db") as db:
        rule = evdb.optim.Adagrad(lr=0.05, initial_accumulator=0.1)
        table = db.create_table(
            "t", dim=args.dim, optimizer=rule, hbm_rows=args.hbm_rows, device=0,
            dram_rows=None, disk=False,
        )  # fmt: skip
        emb = EmbeddingBag(table, mode="sum")
        ours = statistics.median(run(torch, emb, None, data, args, after=db.advance))
        hbm = table.stats()["tiers"]["hbm"]
    share = hbm["pull_hits"] / max(hbm["pull_hits"] + hbm["pull_misses"], 1)
    print(f"torch.nn.EmbeddingBag(sparse=True) on CUDA: {base * 1e3:8.2f} ms/step")
    print(
        f"evdb, hot rows in HBM (device 0):           {ours * 1e3:8.2f} ms/step = "
        f"{ours / base:5.2f}x torch's; HBM answered {share:.0%} of pulled keys"
    )
    print(
        "note: the binding crosses the tier boundary as host arrays (keys down, rows up, "
        "gradients down); a step with no host round trip needs a device-resident Table API"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
