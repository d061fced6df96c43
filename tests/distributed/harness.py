"""Run a function on N ranks of a gloo process group on 127.0.0.1, bounded in time.

Each rank is a spawned process that calls ``fn(rank, world, out, *args)`` after
``init_process_group``; it reports success or its traceback in ``out/rank-<r>.json``. The
parent waits at most ``timeout`` seconds, kills what is left, and raises if any rank failed
or hung: a multi-process test fails, never hangs.
"""

from __future__ import annotations

import datetime
import importlib
import json
import multiprocessing as mp
import os
import socket
import traceback
from pathlib import Path
from typing import Any

PG_TIMEOUT_S = 30  # the process group's timeout: a dead peer fails a collective within it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _entry(module: str, name: str, rank: int, world: int, port: int, out: str, args: Any) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch.distributed as dist

    report = Path(out) / f"rank-{rank}.json"
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=PG_TIMEOUT_S),
        )
        fn = getattr(importlib.import_module(module), name)
        result = fn(rank, world, Path(out), *args)
        report.write_text(json.dumps({"ok": True, "result": result}))
    except BaseException:
        report.write_text(json.dumps({"ok": False, "error": traceback.format_exc()}))
        raise SystemExit(1) from None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(
    fn: Any,
    world: int,
    out: Path,
    *args: Any,
    timeout: float = 180,
    expect_fail: set[int] = frozenset(),
) -> list[Any]:
    """Run fn on world ranks; returns each rank's result (what fn returned, JSON-able).
    Ranks in ``expect_fail`` may die or fail; their entry is None."""
    out.mkdir(parents=True, exist_ok=True)
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [
        ctx.Process(
            target=_entry, args=(fn.__module__, fn.__name__, r, world, port, str(out), args)
        )
        for r in range(world)
    ]
    for p in procs:
        p.start()
    deadline = datetime.datetime.now() + datetime.timedelta(seconds=timeout)
    for p in procs:
        p.join(max(0.0, (deadline - datetime.datetime.now()).total_seconds()))
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(10)
    assert not hung, f"ranks {hung} still running after {timeout} s (a hang)"
    results = []
    for r in range(world):
        path = out / f"rank-{r}.json"
        report = json.loads(path.read_text()) if path.exists() else None
        if r in expect_fail:
            results.append(None if report is None else report.get("result"))
            continue
        assert report is not None, f"rank {r} died without a report (exit {procs[r].exitcode})"
        assert report["ok"], f"rank {r} failed:\n{report['error']}"
        results.append(report["result"])
    return results
