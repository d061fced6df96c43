"""The ``evdb`` commands that act on a whole database: ``info``, ``compact``, ``checkpoint``,
``reshard`` and ``convert`` (see :mod:`evdb.tools.cli`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

import evdb
from evdb import offline
from evdb.config import ROUNDINGS, ROW_DTYPES
from evdb.convert import convert

from .exit_codes import EXIT_CODES
from .output import (
    json_option,
    manifest_bytes,
    print_json,
    print_pairs,
    print_table,
    progress_bar,
)
from .paths import PATH_ARG, is_sharded, require_path

__all__ = ["cmd_checkpoint", "cmd_compact", "cmd_convert", "cmd_info", "cmd_reshard"]


@click.command("info", epilog=EXIT_CODES, short_help="Show the step and the tables.")
@click.argument("path", type=PATH_ARG)
@json_option
def cmd_info(path: Path, as_json: bool) -> None:
    """Show the step and each table's size and configuration.

    PATH may be a database or a checkpoint; it is opened read-only (the state of its last
    flush) and nothing changes.
    """
    if is_sharded(path):
        _sharded_info(path, as_json)
        return
    result = offline.info(path)
    if as_json:
        print_json(result)
        return
    ckpt = result["checkpoint"]
    kind = "database" if ckpt is None else f"{ckpt['kind']} checkpoint"
    serving = ckpt is not None and ckpt["kind"] == "export-serving"
    if serving:  # its tables' optimizer, TTL and admission are not the trained table's
        kind = "serving export (values only: no optimizer state, TTL or admission)"
    pairs: list[tuple[str, Any]] = [("path", result["path"]), ("kind", kind)]
    if ckpt is not None and "base" in ckpt:
        pairs.append(("base", ckpt["base"]))
    pairs += [("step", result["step"]), ("tables", len(result["tables"]))]
    print_pairs(pairs)
    if not result["tables"]:
        return
    click.echo()
    if ckpt is not None and ckpt["kind"] == "incremental":
        rows = [[n, t["rows"], t["changed_rows"]] for n, t in result["tables"].items()]
        print_table(["table", "rows", "changed_rows"], rows)
        return
    header = ["table", "dim", "key_type", "rows", "on_disk", "disk_bytes"]
    if serving:  # what a row costs served
        header += ["dtype", "bytes_per_row"]
    else:
        header += ["ttl_steps", "l2_threshold", "optimizer"]
    rows = []
    for name, t in result["tables"].items():
        disk = t["stats"]["tiers"].get("rocksdb", {})
        cfg = t["config"]
        rows.append([name, t["dim"], t["key_type"], t["rows"], disk.get("rows"), disk.get("bytes")])
        if serving:
            dram = t["stats"]["tiers"].get("dram", {})
            per_row = dram.get("bytes_per_row") if dram.get("rows") else None  # none loaded yet
            rows[-1] += [t["stats"].get("dtype", cfg.get("dtype")), per_row]
        else:
            rows[-1] += [cfg["ttl_steps"], cfg["l2_threshold"], cfg["optimizer"]["kind"]]
    print_table(header, rows)
    counted = [
        (name, op, counts)
        for name, t in result["tables"].items()
        for op, counts in t["stats"].get("reads", {}).items()
        if sum(counts.values())
    ]
    if counted:  # the keys each tier answered (and none held), since the table was created
        levels = list(dict.fromkeys(level for _, _, c in counted for level in c))
        click.echo()
        print_table(
            ["table", "reads", *levels],
            [[name, op, *(c.get(level, "-") for level in levels)] for name, op, c in counted],
        )


def _sharded_info(path: Path, as_json: bool) -> None:
    from evdb import distributed

    result = distributed.info(path)
    if as_json:
        print_json(result)
        return
    ckpt = result["checkpoint"]
    kind = "sharded database" if ckpt is None else f"sharded {ckpt['kind']} checkpoint"
    print_pairs(
        [
            ("path", result["path"]),
            ("kind", kind),
            ("shards", result["world_size"]),
            ("step", result["step"]),
            ("tables", len(result["tables"])),
        ]
    )
    if result["tables"]:
        click.echo()
        rows = [
            [n, t["placement"]["kind"], t["rows"], " ".join(map(str, t["shards"])), t["imbalance"]]
            for n, t in result["tables"].items()
        ]
        print_table(["table", "placement", "rows", "rows per shard", "imbalance"], rows)


@click.command("compact", epilog=EXIT_CODES, short_help="Remove rows by rule; reclaim space.")
@click.argument("path", type=PATH_ARG)
@click.option("--table", metavar="T", help="Only this table (default: every table).")
@click.option(
    "--ttl-steps",
    metavar="N",
    type=click.IntRange(min=0),
    help="Remove rows with step - last_step > N (default: each table's ttl_steps).",
)
@click.option(
    "--l2-threshold",
    metavar="X",
    type=click.FloatRange(min=0.0),
    help="Remove rows whose L2 norm is below X (default: each table's l2_threshold).",
)
@click.option(
    "--min-freq",
    metavar="K",
    type=click.IntRange(min=0),
    help="Remove rows pulled fewer than K times.",
)
@click.option(
    "--step",
    metavar="S",
    type=click.IntRange(min=0),
    help="Judge TTL at step S (default: the database's).",
)
@click.option("--dry-run", is_flag=True, help="Count what would be removed; change nothing.")
@json_option
def cmd_compact(
    path: Path,
    table: str | None,
    ttl_steps: int | None,
    l2_threshold: float | None,
    min_freq: int | None,
    step: int | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Remove rows by rule from a closed database, then compact RocksDB.

    A row goes if it matches any rule (TTL, L2, min freq); one matching several counts under
    the first. Removed rows leave every tier; then RocksDB rewrites its files so the space
    goes back to the file system.
    """
    with progress_bar("compact") as progress:
        result = offline.compact(
            path,
            table,
            ttl_steps=ttl_steps,
            l2_threshold=l2_threshold,
            min_freq=min_freq,
            step=step,
            dry_run=dry_run,
            progress=progress,
        )
    if as_json:
        print_json(result)
        return
    header = ["table", "rows_before", "kept", "ttl", "l2", "min_freq"]
    rows = [
        [name, t["rows_before"], t["kept"], *t["removed"].values()]
        for name, t in result["tables"].items()
    ]
    rows.append(["total", result["rows_before"], result["kept"], *result["removed"].values()])
    print_table(header, rows)
    click.echo(f"at step {result['step']:,}" + ("; dry run: nothing changed" if dry_run else ""))


@click.command("checkpoint", epilog=EXIT_CODES, short_help="Write a checksummed checkpoint.")
@click.argument("path", type=PATH_ARG)
@click.argument("dest", type=PATH_ARG)
@click.option(
    "--base",
    metavar="PREV",
    type=PATH_ARG,
    help="An earlier checkpoint: store only the rows changed since.",
)
@json_option
def cmd_checkpoint(path: Path, dest: Path, base: Path | None, as_json: bool) -> None:
    """Write a checksummed checkpoint of the database at PATH to DEST (full, or incremental
    with --base)."""
    require_path(path)
    if base is not None:
        require_path(base, "base", "evdb checkpoint", "MANIFEST.json")
    with evdb.open(path) as db:
        manifest = db.checkpoint(dest, base=base)
    n_files, n_bytes = manifest_bytes(manifest)
    result: dict[str, Any] = {
        "dest": str(dest),
        "kind": manifest["kind"],
        "step": manifest["step"],
        "tables": {name: t["rows"] for name, t in manifest["tables"].items()},
        "files": n_files,
        "bytes": n_bytes,
    }
    if manifest["kind"] == "incremental":
        result["base"] = manifest["base"]
        result["changed_rows"] = manifest["changed_rows"]
    if as_json:
        print_json(result)
        return
    pairs = [(k, result[k]) for k in ("dest", "kind", "step")]
    if "base" in result:
        pairs.append(("base", result["base"]))
    pairs += [("files", n_files), ("bytes", n_bytes)]
    print_pairs(pairs)
    if result["tables"]:
        click.echo()
        changed = result.get("changed_rows")
        if changed is None:
            print_table(["table", "rows"], list(result["tables"].items()))
        else:
            rows = [[n, r, changed.get(n)] for n, r in result["tables"].items()]
            print_table(["table", "rows", "changed_rows"], rows)


@click.command("reshard", epilog=EXIT_CODES, short_help="Reshard a sharded checkpoint.")
@click.argument("src", type=PATH_ARG)
@click.argument("dest", type=PATH_ARG)
@click.option(
    "--shards", required=True, type=click.IntRange(1), help="Ranks the new checkpoint is for."
)
@json_option
def cmd_reshard(src: Path, dest: Path, shards: int, as_json: bool) -> None:
    """Write a sharded checkpoint for SHARDS ranks at DEST from the sharded checkpoint (or
    closed sharded database) SRC, offline: every new shard gets exactly the rows, slots,
    counters and pending admission counts its tables' placements send it. SRC is not
    changed."""
    from evdb import distributed

    require_path(src, "src", "evdb sharded checkpoint", "sharding.json")
    with progress_bar("reshard") as progress:
        layout = distributed.reshard(src, dest, shards, progress=progress)
    result = {
        "dest": str(dest),
        "shards": layout["world_size"],
        "step": layout["step"],
        "tables": sorted(layout["tables"]),
    }
    if as_json:
        print_json(result)
        return
    print_pairs([(k, result[k]) for k in ("dest", "shards", "step", "tables")])


@click.command("convert", epilog=EXIT_CODES, short_help="Copy a database, rows in another dtype.")
@click.argument("src", type=PATH_ARG)
@click.argument("dest", type=PATH_ARG)
@click.option(
    "--dtype",
    type=click.Choice(ROW_DTYPES),
    required=True,
    help="Row dtype of the converted tables.",
)
@click.option(
    "--table",
    "tables",
    metavar="T",
    multiple=True,
    help="Convert this table (repeatable; default: all); the others are copied as they are.",
)
@click.option(
    "--rounding",
    type=click.Choice(ROUNDINGS),
    default=None,
    help="Push rounding of the converted tables [default: each source table's].",
)
@click.option(
    "--slot-dtype",
    type=click.Choice(ROW_DTYPES),
    default=None,
    help="Optimizer slot dtype of the converted tables: float32 or DTYPE [default: float32 "
    "slots stay float32, half slots follow the rows].",
)
@json_option
def cmd_convert(
    src: Path,
    dest: Path,
    dtype: str,
    tables: tuple[str, ...],
    rounding: str | None,
    slot_dtype: str | None,
    as_json: bool,
) -> None:
    """Write the closed database SRC to a new database DEST with the rows of its tables in
    DTYPE, rounded to nearest even; every row keeps its slots, counts, last step and version,
    and every table its pending admission counts and strings, at SRC's step. SRC is not
    changed, and a failed conversion leaves no DEST."""
    require_path(src, "src")
    with progress_bar("convert") as progress:
        result = convert(
            src, dest, dtype, tables=list(tables) or None, rounding=rounding,
            slot_dtype=slot_dtype, progress=progress,
        )  # fmt: skip
    if as_json:
        print_json(result)
        return
    print_pairs([(k, result[k]) for k in ("src", "dest", "dtype", "step")])
    rows = [
        [n, t["rows"], t["from"], t["to"], t["slots_from"], t["slots_to"]]
        for n, t in result["tables"].items()
    ]
    print_table(["table", "rows", "from", "to", "slots_from", "slots_to"], rows)
