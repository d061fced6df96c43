"""Compile every cpu kernel ahead of time, into numba's on-disk cache (``evdb warmup``).

The cpu kernels compile on first use (``evdb.kernels.cpu._common.Kernel``), so a fresh machine
pays each kernel's compilation the first time a process calls it, and a cached one loads it in
milliseconds. An image builder (a Dockerfile, a CI cache step) runs this once so that no
container pays anything at start::

    RUN evdb warmup            # or: python -c "import evdb.kernels as k; k.warm_up()"

The kernels compile in worker processes (numba compiles one kernel at a time per process,
under one lock), each writing its kernels to the shared cache, and this process then loads
them all from it, which also checks that the cache kept them. What it costs is in
``bench/README.md`` (``bench_start``). Compiled code is cached where numba caches:
``__pycache__`` beside the kernel sources, or ``NUMBA_CACHE_DIR``; the cache is for this
machine's CPU and this numba, so warm up on the image's own base, and again after upgrading.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

__all__ = ["Compiled", "WarmUp", "cache_dir", "compile_kernel", "kernel_names", "warm_up"]

# The modules that define kernels (helpers such as _common and libm are inlined into them)
MODULES = (
    "bags",
    "bloom",
    "evict",
    "frozen",
    "index",
    "init",
    "lowp",
    "lowp_gather",
    "lowp_optim",
    "merge",
    "optim",
    "stamp",
)


@dataclass(frozen=True)
class Compiled:
    """One kernel made ready: its name, the seconds it took and whether it came from the cache."""

    name: str
    """``module.function`` under ``evdb.kernels.cpu``, e.g. ``"index._hash_find_parallel"``."""
    seconds: float
    """Wall-clock seconds of its compilation or cache load, in the process that did it."""
    from_cache: bool
    """True when numba loaded it from the on-disk cache instead of compiling it."""


def _kernel(name: str) -> Any:
    module, _, attr = name.partition(".")
    return getattr(importlib.import_module(f"evdb.kernels.cpu.{module}"), attr)


def kernel_names() -> list[str]:
    """Every kernel that compiles on its own (inlined helpers do not), as ``module.function``,
    the parallel ones first: they take the longest, so a pool that starts them first ends
    with its processes busy until about the same time."""
    from evdb.kernels.cpu._common import Kernel

    names = []
    for module in MODULES:
        mod = importlib.import_module(f"evdb.kernels.cpu.{module}")
        for attr, obj in sorted(vars(mod).items()):
            if (
                isinstance(obj, Kernel)
                and obj.py_func.__module__ == mod.__name__
                and obj.targetoptions.get("inline") != "always"
            ):
                names.append(f"{module}.{attr}")
    return sorted(names, key=lambda n: not _kernel(n).targetoptions.get("parallel"))


def compile_kernel(name: str) -> Compiled:
    """Compile one kernel (``module.function``), or load it from the cache, in this process."""
    kernel = _kernel(name)
    t0 = time.perf_counter()
    kernel.compile_declared()
    seconds = time.perf_counter() - t0
    stats = kernel.stats
    return Compiled(name, seconds, sum(stats.cache_hits.values()) > 0)


def cache_dir() -> str:
    """Where numba caches the kernels: ``__pycache__`` beside their sources, ``NUMBA_CACHE_DIR``,
    or (where neither is writable) a directory under the user's cache."""
    return str(_kernel(kernel_names()[0]).stats.cache_path)


@dataclass(frozen=True)
class WarmUp:
    """What :func:`warm_up` did."""

    compiled: list[Compiled]
    """Each kernel as its worker made it ready, in the order they finished."""
    processes: int
    """Worker processes that compiled."""
    seconds: float
    """Wall-clock seconds of the whole warm-up, this process's loads included."""
    cached: bool
    """Whether this process then loaded every kernel from the cache (what a new process does)."""
    cache: str
    """The cache directory (:func:`cache_dir`)."""


def warm_up(
    *,
    processes: int | None = None,
    progress: Callable[[Compiled], None] | None = None,
) -> WarmUp:
    """Compile every cpu kernel into the on-disk cache in worker processes, then load them
    all in this one.

    Parameters
    ----------
    processes
        Worker processes that compile at once (default: one per core, at most one per
        kernel). numba compiles one kernel at a time per process, so the workers are what
        makes it parallel; a kernel already cached only loads.
    progress
        Called with each kernel's :class:`Compiled` as a worker finishes it.

    Returns
    -------
    WarmUp
        ``cached`` is False when this process had to compile a kernel itself (a cache that
        cannot be written): then every new process compiles too.
    """
    t0 = time.perf_counter()
    names = kernel_names()
    processes = max(1, min(processes or os.cpu_count() or 1, len(names)))
    compiled = []
    # spawn, not fork: a fresh interpreter per worker, whatever threads this one runs
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(processes, mp_context=context) as pool:
        futures = [pool.submit(compile_kernel, name) for name in names]  # started in this order
        for future in as_completed(futures):
            done = future.result()
            compiled.append(done)
            if progress is not None:
                progress(done)
    cached = all([compile_kernel(name).from_cache for name in names])
    return WarmUp(compiled, processes, time.perf_counter() - t0, cached, cache_dir())
