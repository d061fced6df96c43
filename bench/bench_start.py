"""Start-up on a fresh machine: ``import evdb``, the first lookup ``evdb serve`` answers and the
example's first training step, each from an empty kernel cache, against the aims of issue 30.

evdb's numba kernels compile on first use and are cached on disk; a fresh machine (a new
container, CI job or serving pod) has an empty cache. Each figure here is the wall-clock time
of a new process whose ``NUMBA_CACHE_DIR`` is a new empty directory, from its start to the
event, and the same process again with that cache filled by the first (the baseline, run in
the same session): the ratio is what compiling on a fresh machine costs.

- ``import evdb``: ``python -c "import evdb"``. Aim: under 3 s.
- first training step: ``examples/movielens.py --synthetic --epochs 1`` (DeepFM, batches of
  512, Adagrad tables spilling to RocksDB) until its first dense optimizer step returns,
  which is after the step's pull, forward, backward and push (a global torch optimizer-step
  hook prints the time). Aim: within 60 s. The cold run goes on to write the example's
  serving snapshot, which the serve figure uses.
- ``evdb serve`` of that snapshot: from starting the server to the first answer of a
  ``POST /v1/tables/item/lookup`` of 100 keys (polled every 0.1 s). Aim: within 30 s.

``--warmup`` also times ``evdb warmup`` from an empty cache with 1 worker process and with one
per core (that is the whole compile of every kernel, twice: minutes).

    .venv/bin/python bench/bench_start.py [--warmup]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "movielens.py"
AIMS = {"import evdb": 3.0, "evdb serve, first lookup": 30.0, "first training step": 60.0}

# Runs the example, printing the seconds since `t0` (argv[1], the parent's time.time() at
# spawn) when the first optimizer step returns; argv[2:] are the example's arguments.
FIRST_STEP = """
import runpy, sys, time
from torch.optim.optimizer import register_optimizer_step_post_hook
t0 = float(sys.argv[1])
def first(*_):
    print(f"FIRST_STEP {time.time() - t0:.3f}", flush=True)
    handle.remove()
handle = register_optimizer_step_post_hook(first)
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def env_with(cache: Path) -> dict[str, str]:
    return {**os.environ, "NUMBA_CACHE_DIR": str(cache), "PYTHONUNBUFFERED": "1"}


def time_import(cache: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import evdb"], env=env_with(cache), check=True)
    return time.perf_counter() - t0


def time_first_step(cache: Path, out: Path, *, finish: bool) -> float:
    """Seconds to the example's first training step; with finish, let it run to the end (it
    writes out/serving), else stop it there."""
    args = [str(EXAMPLE), "--synthetic", "--epochs", "1", "--no-serve", "--out", str(out)]
    args += ["--publish-every", "0"]
    t0 = time.time()
    child = subprocess.Popen(
        [sys.executable, "-c", FIRST_STEP, repr(t0), *args],
        env=env_with(cache),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    seconds = None
    for line in child.stdout:
        if line.startswith("FIRST_STEP "):
            seconds = float(line.split()[1])
            if not finish:
                child.kill()
                break
    child.wait()
    if seconds is None or (finish and child.returncode != 0):
        raise SystemExit(f"the example failed (exit {child.returncode})")
    return seconds


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def time_first_lookup(cache: Path, snapshot: Path) -> float:
    port = free_port()
    body = json.dumps({"keys": list(range(100))}).encode()
    url = f"http://127.0.0.1:{port}/v1/tables/item/lookup"
    cmd = [sys.executable, "-m", "evdb", "serve", str(snapshot), "--port", str(port)]
    t0 = time.perf_counter()
    server = subprocess.Popen([*cmd, "--log-level", "warning"], env=env_with(cache))
    try:
        while True:
            request = urllib.request.Request(url, body, {"content-type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=300) as response:
                    json.loads(response.read())
                return time.perf_counter() - t0
            except (urllib.error.URLError, ConnectionError):
                if server.poll() is not None:
                    raise SystemExit("evdb serve exited before answering") from None
                time.sleep(0.1)
    finally:
        server.terminate()
        server.wait(timeout=60)


def time_warmup(cache: Path, processes: int) -> float:
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "evdb", "warmup", "--processes", str(processes), "--json"]
    subprocess.run(cmd, env=env_with(cache), check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warmup", action="store_true", help="also time evdb warmup")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    threads = os.environ.get("NUMBA_NUM_THREADS", "default")
    print(
        f"bench_start: {os.cpu_count()} cores, numba threads {threads}, load average "
        f"{load:.1f}; each process starts with an empty NUMBA_CACHE_DIR, then again with that "
        "cache filled (warm)"
    )
    rows: list[tuple[str, float, float | None]] = []
    with tempfile.TemporaryDirectory(prefix="evdb-bench-start-") as tmp:
        work = Path(tmp)
        cache = work / "cache-import"
        cold = time_import(cache)
        rows.append(("import evdb", cold, time_import(cache)))
        cache, out = work / "cache-train", work / "example"
        cold = time_first_step(cache, out, finish=True)
        rows.append(
            ("first training step", cold, time_first_step(cache, work / "again", finish=False))
        )
        cache = work / "cache-serve"
        cold = time_first_lookup(cache, out / "serving")
        rows.append(("evdb serve, first lookup", cold, time_first_lookup(cache, out / "serving")))
        if args.warmup:
            for processes in sorted({1, os.cpu_count() or 1}):
                seconds = time_warmup(work / f"cache-warmup-{processes}", processes)
                rows.append((f"evdb warmup, {processes} process(es)", seconds, None))
    print(f"\n{'from an empty cache':<34}{'cold s':>8}{'warm s':>8}{'cold/warm':>11}  aim")
    for name, cold, warm in rows:
        aim = AIMS.get(name)
        verdict = "" if aim is None else f"< {aim:g} s: {'met' if cold < aim else 'MISSED'}"
        ratio = "" if warm is None else f"{cold / warm:.1f}x"
        warm_s = "" if warm is None else f"{warm:.2f}"
        print(f"{name:<34}{cold:>8.2f}{warm_s:>8}{ratio:>11}  {verdict}")


if __name__ == "__main__":
    main()
