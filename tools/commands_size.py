"""The ``evdb size`` command: how many DRAM rows a table needs, from a key trace (see
:mod:`evdb.tools.cli` and :mod:`evdb.sizing`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

import evdb
from evdb.config import TableConfig
from evdb.sizing import DEFAULT_TARGETS, MIN_MINIATURE_ROWS, SizingReport, size_table
from evdb.sizing_logs import open_trace
from evdb.trace import DEFAULT_MIN_KEYS, read_trace

from .exit_codes import EXIT_CODES
from .output import json_option, print_json, print_pairs, print_table, progress_bar
from .paths import PATH_ARG, require_path

__all__ = ["cmd_size"]


def _ints(text: str | None) -> list[int]:
    if not text:
        return []
    try:
        out = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise evdb.InvalidArgumentError(
            f"--rows must be ints separated by commas, got {text!r}"
        ) from None
    if any(r < 1 for r in out):
        raise evdb.InvalidArgumentError(f"--rows must be >= 1, got {text!r}")
    return out


@click.command(
    "size", epilog=EXIT_CODES, short_help="DRAM rows for hit-rate targets, from a key trace."
)
@click.argument("trace", type=PATH_ARG)
@click.option("--db", "db_path", type=PATH_ARG, help="Take the table's configuration from PATH.")
@click.option("--table", metavar="T", help="The table in --db (default: the trace's).")
@click.option("--rows", metavar="N,N,...", help="DRAM sizes to simulate (default: a grid).")
@click.option(
    "--target",
    "targets",
    type=click.FloatRange(0, 1, min_open=True),
    multiple=True,
    help="Hit-rate target (repeatable; default 0.9, 0.95, 0.99).",
)
@click.option("--lru-only", is_flag=True, help="Only the LRU curve (no simulation).")
@click.option(
    "--tier",
    type=click.Choice(["dram", "hbm"]),
    default="dram",
    show_default=True,
    help="The tier whose sizes are simulated (hbm: a table with hbm_rows; DRAM stays as is).",
)
@click.option("--bins", type=click.IntRange(1), default=100, show_default=True,
              help="Bins of TorchRec's mrc_hist_counts.")  # fmt: skip
@click.option("--plot", type=PATH_ARG, help="Draw the curves into this PNG (needs matplotlib).")
@click.option("--allow-incomplete", is_flag=True, help="Read a trace without its end record.")
@click.option("--column", default="key", show_default=True, help="Key column of a key log.")
@click.option("--step-column", default="step", show_default=True, help="Step column of a log.")
@click.option("--rate", type=click.FloatRange(0, 1, min_open=True), default=1.0,
              show_default=True, help="Sampling rate applied to a key log.")  # fmt: skip
@click.option("--min-keys", type=click.IntRange(0), default=DEFAULT_MIN_KEYS, show_default=True,
              help="A key log's --rate is raised to keep this many distinct keys (0: exactly "
              "--rate), as a recorder's is.")  # fmt: skip
@click.option("--batch-keys", type=click.IntRange(1), default=4096, show_default=True,
              help="Keys per batch of a key log without steps.")  # fmt: skip
@json_option
def cmd_size(
    trace: Path,
    db_path: Path | None,
    table: str | None,
    rows: str | None,
    targets: tuple[float, ...],
    lru_only: bool,
    tier: str,
    bins: int,
    plot: Path | None,
    allow_incomplete: bool,
    column: str,
    step_column: str,
    rate: float,
    min_keys: int,
    batch_keys: int,
    as_json: bool,
) -> None:
    """Miss-ratio curves of TRACE: evdb's own policy (admission, TTL, eviction, disk tier)
    by miniature simulation of real tables, and exact LRU for reference.

    TRACE is a file evdb.trace.KeyRecorder wrote (it names its table and configuration), or
    a user's key log: an .npy of keys, or an .npz or .parquet with a --column of keys and an
    optional --step-column (sampled at --rate, raised for --min-keys; a log needs --db and
    --table for the simulation). Prints the DRAM rows each hit-rate target needs, the hit
    rate at the table's current dram_rows, the curves, and TorchRec's mrc_hist_counts (with --json).
    With --tier hbm, the same for the HBM tier of a table with hbm_rows, and the hit
    rates of both tiers at each size.
    """
    if plot is not None:
        _require_matplotlib()
    tr = open_trace(
        trace,
        allow_incomplete=allow_incomplete,
        column=column,
        step_column=step_column,
        rate=rate,
        min_keys=min_keys,
        batch_keys=batch_keys,
    )
    config = None
    if db_path is not None:
        config = _table_config(db_path, table or tr.header.table, trace, tr.header.source)
    elif table is not None:
        raise evdb.InvalidArgumentError("--table needs --db (the database it is in)")
    with progress_bar("size") as progress:
        report = size_table(
            tr,
            rows=_ints(rows) or None,
            targets=targets or DEFAULT_TARGETS,
            config=config,
            simulate_policy=not lru_only,
            tier=tier,
            progress=progress,
        )
    result = report.to_dict(n_bins=bins)
    if plot is not None:
        _plot(report, plot)
        result["plot"] = str(plot)
    if as_json:
        print_json(result)
        return
    _print(result)


def _table_config(db_path: Path, name: str, trace: Path, source: str) -> TableConfig:
    require_path(db_path, "--db")
    with evdb.open(db_path, read_only=True) as db:
        t = db.table(name)
        if source == "evdb":  # a recorded trace must come from this very table
            read_trace(trace, table=t, allow_incomplete=True)
        return t.config


def _print(r: dict[str, Any]) -> None:
    pct = _pct
    tier = r["tier"]
    print_pairs(
        [
            ("table", r["table"] or "-"),
            ("sampling rate", r["rate"]),
            (
                "accesses",
                f"{r['estimated_accesses']:,} distinct-per-batch pulls "
                f"({r['sampled_accesses']:,} sampled)",
            ),
            (
                "distinct keys",
                f"{r['estimated_distinct_keys']:,} ({r['sampled_distinct_keys']:,} sampled)",
            ),
            (f"current {tier}_rows", r[f"current_{tier}_rows"]),
            *(
                [("HBM hit rate now", pct(r.get("current_hit_rate", {}).get("hbm")))]
                if tier == "hbm"
                else []
            ),
            ("DRAM hit rate now", pct(r.get("current_hit_rate", {}).get("dram"))),
            (
                "highest hit rate",
                f"{pct(r['highest_hit_rate']['evdb'])} (evdb policy), "
                f"{pct(r['highest_hit_rate']['lru'])} (LRU), of the sizes simulated",
            ),
        ]
    )
    click.echo("")
    print_table(
        ["target", f"{tier}_rows (evdb)", f"{tier}_rows (LRU)"],
        [[f"{float(t):.0%}", v["evdb_rows"], v["lru_rows"]] for t, v in r["targets"].items()],
    )
    if r["curve"]:
        click.echo("")
        hbm = tier == "hbm"
        print_table(
            [f"{tier}_rows", "evdb hit rate", "LRU hit rate", "lookup hit rate"]
            + (["DRAM tier hit rate", "HBM or DRAM"] if hbm else []),
            [
                [c[f"{tier}_rows"], pct(c["evdb_hit_rate"]) + ("" if c["reliable"] else " *"),
                 pct(c["lru_hit_rate"]), pct(c["evdb_lookup_hit_rate"])]
                + ([pct(c["dram_tier_hit_rate"]), pct(c["hbm_or_dram_hit_rate"])] if hbm else [])
                for c in r["curve"]
            ],
        )  # fmt: skip
    if any(not c["reliable"] for c in r["curve"]):
        click.echo(
            f"* a miniature of fewer than {MIN_MINIATURE_ROWS:,} rows: off by a point or more "
            "(see the warning)"
        )
    for w in r["warnings"]:
        click.echo(f"warning: {w}", err=True)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"


def _require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise evdb.InvalidArgumentError(
            "--plot needs matplotlib, which is not installed (pip install matplotlib); "
            "--json prints the curve's points instead"
        ) from None


def _plot(report: SizingReport, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    lru = report.lru
    fig, ax = plt.subplots(figsize=(7, 4.5))
    top = max(lru.distinct_estimate, 2)
    xs = np.unique(np.geomspace(1, top, 400).round())
    ax.plot(xs, lru.hit_rate(xs), label="LRU (exact, stack distances)", color="0.5")
    if report.policy is not None:
        ax.plot(report.policy.rows, report.policy.hit_rate("pull"), "o-", label="evdb policy")
    if report.current_rows:
        ax.axvline(report.current_rows, ls=":", color="k", label="current dram_rows")
    ax.set_xscale("log")
    ax.set_xlabel("DRAM rows")
    ax.set_ylabel("DRAM hit rate (pulls)")
    ax.set_ylim(0, 1)
    ax.set_title(f"evdb size: {report.table or 'key log'} (sampled at {report.rate:g})")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
