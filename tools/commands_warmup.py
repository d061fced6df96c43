"""``evdb warmup``: compile every cpu kernel into numba's on-disk cache, for image builders
(see :mod:`evdb.tools.cli` and :mod:`evdb.kernels.warmup`)."""

from __future__ import annotations

import errno
from typing import Any

import click

import evdb
from evdb.kernels import warm_up

from .exit_codes import EXIT_CODES
from .output import json_option, print_json, print_pairs, print_table

__all__ = ["cmd_warmup"]


@click.command("warmup", epilog=EXIT_CODES, short_help="Compile every kernel ahead of time.")
@click.option(
    "--processes",
    type=click.IntRange(min=1),
    metavar="N",
    help="Processes that compile at once (default: one per core).",
)
@json_option
def cmd_warmup(processes: int | None, as_json: bool) -> None:
    """Compile every cpu kernel into numba's on-disk cache, in parallel processes.

    evdb compiles a kernel the first time a process calls it, once per machine; run this
    when building an image (after pip install) so that no container pays it. Kernels already
    cached load in milliseconds, so a second run is quick.
    """
    result = warm_up(processes=processes)
    compiled = [c for c in result.compiled if not c.from_cache]
    slowest = sorted(compiled, key=lambda c: -c.seconds)[:5]
    summary: dict[str, Any] = {
        "kernels": len(result.compiled),
        "compiled": len(compiled),
        "already_cached": len(result.compiled) - len(compiled),
        "processes": result.processes,
        "seconds": round(result.seconds, 1),
        "compile_seconds": round(sum(c.seconds for c in compiled), 1),
        "cached": result.cached,
        "cache": result.cache,
        "slowest": [{"kernel": c.name, "seconds": round(c.seconds, 1)} for c in slowest],
    }
    if as_json:
        print_json(summary)
    else:
        print_pairs([(k, v) for k, v in summary.items() if k != "slowest"])
        if slowest:
            click.echo()
            rows = [[c.name, round(c.seconds, 1)] for c in slowest]
            print_table(["slowest kernel", "seconds"], rows)
    if not result.cached:
        raise evdb.StorageError(
            errno.EACCES,
            f"the kernels could not be cached in {result.cache}: every process will compile "
            "them again (make it writable, or set NUMBA_CACHE_DIR)",
            result.cache,
        )
