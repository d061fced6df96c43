"""Helpers shared by the benchmark scripts in this folder: memory, keys, formatting, header.

The scripts run as ``python bench/<script>.py``, which puts ``bench/`` on ``sys.path``, so
they import this module as ``from _common import ...``.
"""

from __future__ import annotations

import ctypes
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numba
import numpy as np
import psutil

import evdb

_I64 = np.iinfo(np.int64)


# -- memory -------------------------------------------------------------------------------
def rss() -> int:
    return int(psutil.Process().memory_info().rss)


def peak_rss() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB (bytes on macOS)
    return peak * (1 if sys.platform == "darwin" else 1024)


def _load_malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


_malloc_trim = _load_malloc_trim()


def malloc_trim() -> bool:
    """Have glibc hand its free heap memory back to the system; False without glibc."""
    if _malloc_trim is None:
        return False
    _malloc_trim(0)
    return True


# -- data ---------------------------------------------------------------------------------
def random_keys(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(_I64.min, _I64.max, size=n, dtype=np.int64, endpoint=True)


# -- formatting ---------------------------------------------------------------------------
def fmt_rate(per_s: float | None, digits: int = 1) -> str:
    """A rate as M/s with `digits` decimals, or below 1e6 as K/s with one decimal fewer."""
    if per_s is None:
        return "-"
    if per_s >= 1e6:
        return f"{per_s / 1e6:.{digits}f}M/s"
    return f"{per_s / 1e3:.{digits - 1}f}K/s"


def fmt_ratio(r: float | None) -> str:
    if r is None:
        return "-"
    return f"{r:.2f}x" if r < 10 else f"{r:.1f}x"


def fmt_count(n: float) -> str:
    return f"{n:,.0f}"


def fmt_gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def print_table(header: list[str], rows: list[list[str]], first_left: int = 0) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i < first_left else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    print(line(header))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print(line(r))


# -- the machine and the code -------------------------------------------------------------
def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def git_revision() -> str:
    """' (git <commit>[, modified])' of the checkout evdb is imported from, or ''."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(evdb.__file__)))
    try:
        rev = subprocess.run(
            ["git", "-C", root, "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", root, "status", "--porcelain", "--untracked-files=no", "--", "evdb"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return f" (git {rev}{', evdb/ modified' if dirty else ''})"


def cpu_line() -> str:
    """The header's cpu line: model, cores (and how many this process may use), RAM."""
    return (
        f"cpu         {cpu_model()}, {os.cpu_count()} cores "
        f"({len(os.sched_getaffinity(0))} usable), "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB RAM"
    )


def versions_line(torch_version: str) -> str:
    """The header's versions line, ending in the git commit evdb is imported from."""
    return (
        f"versions    python {platform.python_version()}, numpy {np.__version__}, "
        f"numba {numba.__version__}, torch {torch_version}, evdb {evdb.__version__}"
        f"{git_revision()}"
    )


def wall_line() -> str:
    """The closing line: wall time of the whole process and its peak RSS."""
    wall = time.time() - psutil.Process().create_time()
    return f"wall time {wall:.0f}s (whole process), peak RSS {fmt_gib(peak_rss())}"


# -- shared by the tier and io benchmarks -------------------------------------------------
VALUE_STD = 0.05  # "trained-like" values: normal(0, 0.05)


def log(msg: str) -> None:
    """Progress on stderr (the figures go to stdout)."""
    print(msg, file=sys.stderr, flush=True)


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def values_like_trained(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    v = rng.standard_normal((n, dim), dtype=np.float32)
    v *= VALUE_STD
    return v


def fill(t: evdb.Table, keys: Any, values: np.ndarray, chunk: int = 65_536) -> None:
    """Upsert rows a chunk at a time (as a loader would)."""
    for start in range(0, values.shape[0], chunk):
        t.upsert(keys[start : start + chunk], values[start : start + chunk])


def adagrad_table_in_dram(
    prefix: str, rows: int, dim: int, rng: np.random.Generator
) -> tuple[evdb.Database, evdb.Table, np.ndarray]:
    """A fresh database with one Adagrad table of ``rows`` rows of ones, all in DRAM, whose
    keys are drawn from [-2**62, 2**62) (keys from 2**62 up are free for new ones): the table
    bench_threads and profile_pull time pulls and lookups on."""
    db = evdb.open(tempfile.mkdtemp(prefix=prefix))
    t = db.create_table("t", dim=dim, optimizer=evdb.optim.Adagrad(lr=0.05), disk=False)
    keys = rng.integers(-(2**62), 2**62, rows)
    for chunk in np.array_split(keys, 16):
        t.upsert(chunk, np.ones((chunk.shape[0], dim), np.float32))
    return db, t, keys


def batches_with_new_keys(
    rng: np.random.Generator, keys: np.ndarray, batch: int, n: int
) -> list[np.ndarray]:
    """n batches of ``batch`` keys of the table from adagrad_table_in_dram, 10% of each new
    (drawn from [2**62, 2**63), where the table has none): every pull of one creates rows."""
    return [
        np.concatenate(
            [rng.choice(keys, batch - batch // 10), rng.integers(2**62, 2**63 - 1, batch // 10)]
        )
        for _ in range(n)
    ]


def discard(db: evdb.Database) -> None:
    """Close a benchmark's scratch database and delete its directory. Its tables are dropped
    first: ``close`` would otherwise write every DRAM row into the directory (0.5-0.8 GB for
    the 1M-row tables here), which then stayed behind in the temp directory after each run."""
    for name in db.tables():
        db.drop_table(name)
    db.close()
    shutil.rmtree(db.path, ignore_errors=True)


def fs_of(path: str) -> str:
    """'<fstype> on <device>' of the mount that holds path, from /proc/mounts."""
    path = os.path.realpath(path)
    best = ("", "?", "?")
    try:
        with open("/proc/mounts") as f:
            for line in f:
                dev, mnt, fstype = line.split()[:3]
                inside = path == mnt or path.startswith(mnt.rstrip("/") + "/")
                if inside and len(mnt) >= len(best[0]):
                    best = (mnt, dev, fstype)
    except OSError:
        pass
    return f"{best[2]} on {best[1]}"
