"""What the ``evdb`` commands print: with ``--json`` one JSON object on stdout, otherwise
aligned pairs and tables; and progress bars on stderr, only when stderr is a terminal, so pipes
and CI logs stay quiet."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import click
import numpy as np

__all__ = [
    "ProgressFn",
    "json_option",
    "manifest_bytes",
    "print_json",
    "print_pairs",
    "print_table",
    "progress_bar",
]

ProgressFn = Callable[[int, int], None]

json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON object on stdout instead."
)


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def print_json(result: dict[str, Any]) -> None:
    click.echo(json.dumps(result, default=_json_default, sort_keys=False))


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, np.integer)):
        return f"{int(value):,}"
    if isinstance(value, (float, np.floating)):
        return f"{float(value):g}"
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, default=_json_default)
    return str(value)


def print_pairs(pairs: Sequence[tuple[str, Any]]) -> None:
    width = max((len(k) for k, _ in pairs), default=0)
    for key, value in pairs:
        click.echo(f"{key:<{width}}  {_fmt(value)}")


def print_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Aligned columns: text to the left, numbers to the right."""
    cells = [[_fmt(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(header)]
    numeric = [
        bool(rows) and all(isinstance(r[i], (int, float, np.number)) or r[i] is None for r in rows)
        for i in range(len(header))
    ]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    click.echo(line(header))
    for row in cells:
        click.echo(line(row))


@contextlib.contextmanager
def progress_bar(label: str) -> Iterator[ProgressFn | None]:
    """A ``progress(rows_done, rows_total)`` callback drawing a bar on stderr, or None when
    stderr is not a terminal."""
    if not sys.stderr.isatty():
        yield None
        return
    state: dict[str, Any] = {"bar": None, "seen": 0}

    def update(done: int, total: int) -> None:
        bar = state["bar"]
        if bar is None:
            bar = click.progressbar(length=max(total, 1), label=label, file=sys.stderr)
            state["bar"] = bar
        bar.length = max(total, done, 1)
        bar.update(done - state["seen"])
        state["seen"] = done

    try:
        yield update
    finally:
        if state["bar"] is not None:
            state["bar"].render_finish()


def manifest_bytes(manifest: dict[str, Any]) -> tuple[int, int]:
    files = manifest.get("files", {})
    return len(files), sum(int(f["size"]) for f in files.values())
