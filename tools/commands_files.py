"""The ``evdb`` commands that move rows between a database and files: ``export`` and
``import``, and ``verify``, which checks the files a checkpoint or export wrote (see
:mod:`evdb.tools.cli`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

import evdb
from evdb import offline
from evdb.io.export import DTYPES, EXPORT_FORMATS, export
from evdb.io.importer import IMPORT_FORMATS

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

__all__ = ["cmd_export", "cmd_import", "cmd_verify"]


@click.command("export", epilog=EXIT_CODES, short_help="Export tables' live rows to files.")
@click.argument("path", type=PATH_ARG)
@click.argument("dest", type=PATH_ARG)
@click.option(
    "--format",
    "format_",
    type=click.Choice(EXPORT_FORMATS),
    required=True,
    help="serving: a read-only evdb database; npz, safetensors, parquet: keys and values "
    "(and slots); word2vec(-binary): the tokens of a keep_strings table.",
)
@click.option(
    "--table",
    "tables",
    metavar="T",
    multiple=True,
    help="Export this table (repeatable; default: all).",
)
@click.option(
    "--dtype",
    type=click.Choice(DTYPES),
    default="float32",
    show_default=True,
    help="Type of the values written (slots stay float32). bfloat16, int8 and int4 need "
    "--format serving; int8 and int4 are row-wise quantised (an fp16 scale and bias per "
    "row), served by evdb serve from a memory map.",
)
@click.option("--include-slots", is_flag=True, help="Also write the optimizer slots.")
@json_option
def cmd_export(
    path: Path,
    dest: Path,
    format_: str,
    tables: tuple[str, ...],
    dtype: str,
    include_slots: bool,
    as_json: bool,
) -> None:
    """Export the live rows of tables to the new directory DEST.

    PATH is read as of its last flush (read-only, no lock). DEST gets a MANIFEST.json with
    the checksum of every file (evdb verify DEST checks them).
    """
    if not is_sharded(path):  # a sharded one exports merged
        require_path(path)
    with progress_bar("export") as progress:
        manifest = export(
            path,
            dest,
            tables=list(tables) or None,
            format=format_,
            dtype=dtype,
            include_slots=include_slots,
            progress=progress,
        )
    n_files, n_bytes = manifest_bytes(manifest)
    result: dict[str, Any] = {
        "dest": str(dest),
        "kind": manifest["kind"],
        "step": manifest["step"],
        "dtype": manifest.get("dtype", dtype),
        "tables": manifest["tables"],
        "files": n_files,
        "bytes": n_bytes,
    }
    if as_json:
        print_json(result)
        return
    print_pairs([(k, result[k]) for k in ("dest", "kind", "step", "dtype", "files", "bytes")])
    if result["tables"]:
        click.echo()
        rows = [
            [name, t.get("rows"), t.get("dim"), t.get("file")]
            for name, t in result["tables"].items()
        ]
        header = ["table", "rows", "dim", "file"]
        if any("bytes_per_row" in t for t in result["tables"].values()):  # int8 / int4
            header.append("bytes_per_row")
            for row, t in zip(rows, result["tables"].values(), strict=True):
                row.append(round(t["bytes_per_row"], 1))
        print_table(header, rows)


@click.command("import", epilog=EXIT_CODES, short_help="Import vectors into a table.")
@click.argument("src", type=PATH_ARG)
@click.argument("path", type=PATH_ARG)
@click.option("--table", metavar="T", required=True, help="Table to fill (created if missing).")
@click.option(
    "--format",
    "format_",
    type=click.Choice(IMPORT_FORMATS),
    required=True,
    help="Vector file format (npz: arrays keys and values; an evdb npz export's config "
    "and slots too).",
)
@click.option(
    "--freeze", is_flag=True, help="Freeze the imported rows: training never changes them."
)
@json_option
def cmd_import(
    src: Path, path: Path, table: str, format_: str, freeze: bool, as_json: bool
) -> None:
    """Import vectors from the file SRC into a table of the database at PATH.

    The database is created if missing, the table too (word formats: a str table that keeps
    its strings; an npz that evdb exported: the exported table's config, and its slots if
    exported with --include-slots; another npz: SGD, no TTL, no admission). A failed import
    leaves nothing behind: no new table, and no database directory it created.
    """
    with progress_bar("import") as progress:  # a failed import removes a database it created
        result = offline.import_file(
            path, table, src, format=format_, freeze=freeze, progress=progress
        )
    if as_json:
        print_json(result)
    else:
        print_pairs(list(result.items()))


@click.command("verify", epilog=EXIT_CODES, short_help="Check a checkpoint's or export's files.")
@click.argument("path", type=PATH_ARG)
@json_option
def cmd_verify(path: Path, as_json: bool) -> None:
    """Check the size and checksum of every file of the checkpoint at PATH (and of its
    base, for an incremental one). Exit 3 names the first damaged file."""
    require_path(path, "path", "evdb checkpoint or export", "MANIFEST.json")
    manifest = evdb.verify(path)
    n_files, n_bytes = manifest_bytes(manifest)
    result = {
        "path": str(path),
        "ok": True,
        "kind": manifest["kind"],
        "step": manifest["step"],
        "files": n_files,
        "bytes": n_bytes,
    }
    if manifest["kind"] == "incremental":
        result["base"] = manifest["base"]
    if as_json:
        print_json(result)
        return
    base = f" (and its base {result['base']})" if "base" in result else ""
    click.echo(f"OK: {n_files:,} files, {n_bytes:,} bytes checked in {path}{base}")
