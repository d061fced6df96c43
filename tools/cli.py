"""The ``evdb`` command line: look after evdb databases from the shell.

Usage (``evdb`` is also ``python -m evdb``)::

    evdb info PATH [--json]
    evdb compact PATH [--table T] [--ttl-steps N] [--l2-threshold X] [--min-freq K]
                      [--step S] [--dry-run] [--json]
    evdb export PATH DEST --format F [--table T]... [--dtype float32|float16]
                          [--include-slots] [--json]
    evdb import SRC PATH --table T --format F [--freeze] [--json]
    evdb checkpoint PATH DEST [--base PREV] [--json]
    evdb verify PATH [--json]
    evdb reshard SRC DEST --shards M [--json]
    evdb serve PATH [--host H] [--port P] [--workers N] [--token-file F]
                    [--allow-root DIR]... [--max-keys K] [--cache-rows R] [--mmap-reads]
                    [--no-dashboard] [--max-scan-rows N]
                    [--follow [--poll-interval S] [--max-staleness S]]

Each subcommand is a ``cmd_<name>`` that calls the library (``evdb``, ``evdb.offline``,
``evdb.io.export``) and prints its result: with ``--json`` one JSON object on stdout, otherwise
a short aligned summary. Progress bars go to stderr, and only when stderr is a terminal, so
pipes and CI logs stay quiet. Errors the library expects (``evdb.EvdbError``, a missing file)
print one line, ``evdb: error: ...``, on stderr, with the exit code of ``EXIT_CODES``; anything
else is a bug and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import click
import numpy as np

import evdb
from evdb import offline
from evdb.io.export import EXPORT_FORMATS, export
from evdb.io.importer import IMPORT_FORMATS

__all__ = ["EXIT_CODES", "cli", "exit_code", "main"]

EXIT_CODES = """\b
Exit codes:
  0  success
  1  failure: an unexpected error (with a traceback), or an expected one that is not
     the command line's fault, such as a database another process holds (one line)
  2  usage: a bad option or value, found by the command line or by evdb (InvalidArgument,
     InvalidType, Config, TableExists errors)
  3  verification failed or data corrupt (evdb.CorruptDataError)
  4  not found: a missing path or file, an unknown table
  5  I/O error: the disk is full or cannot be written (evdb.StorageError, an OSError)
"""

_PathArg = click.Path(path_type=Path)
ProgressFn = Callable[[int, int], None]


# -- errors -------------------------------------------------------------------------------
def exit_code(error: BaseException) -> int | None:
    """The exit code of an expected error; None for an unexpected one (a bug)."""
    if isinstance(error, evdb.CorruptDataError):
        return 3
    if isinstance(error, (evdb.TableNotFoundError, FileNotFoundError)):
        return 4
    if isinstance(error, OSError):  # evdb.StorageError, or a write of the command's own
        return 5
    if isinstance(
        error,
        (
            evdb.InvalidArgumentError,
            evdb.InvalidTypeError,
            evdb.ConfigError,
            evdb.TableExistsError,
        ),
    ):
        return 2
    if isinstance(error, evdb.EvdbError):
        return 1
    return None


class _Cli(click.Group):
    """A group that turns expected errors into one line on stderr and an exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except Exception as e:
            code = exit_code(e)
            if code is None:  # click's own exceptions, and bugs (traceback, exit 1)
                raise
            message = " ".join(str(e).split()) or type(e).__name__
            click.echo(f"evdb: error: {message}", err=True)
            raise click.exceptions.Exit(code) from None


# -- output -------------------------------------------------------------------------------
def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _print_json(result: dict[str, Any]) -> None:
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


def _print_pairs(pairs: Sequence[tuple[str, Any]]) -> None:
    width = max((len(k) for k, _ in pairs), default=0)
    for key, value in pairs:
        click.echo(f"{key:<{width}}  {_fmt(value)}")


def _print_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
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
def _progress(label: str) -> Iterator[ProgressFn | None]:
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


def _require_path(
    path: Path, name: str = "path", what: str = "evdb database", marker: str = "evdb.json"
) -> None:
    """Exit 4 rather than open (and so create) a database that is not there."""
    if not (path / marker).is_file():
        why = "does not exist" if not path.exists() else f"has no {marker}"
        raise FileNotFoundError(f"{name}: {path} {why}: not an {what}")


def _manifest_bytes(manifest: dict[str, Any]) -> tuple[int, int]:
    files = manifest.get("files", {})
    return len(files), sum(int(f["size"]) for f in files.values())


# -- the commands -------------------------------------------------------------------------
@click.group(
    cls=_Cli,
    epilog=EXIT_CODES,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(evdb.__version__, prog_name="evdb")
def cli() -> None:
    """Inspect, compact, export, import, checkpoint and verify evdb databases.

    PATH is a database directory (what evdb.open(PATH) opened); no command but import
    creates one. Close it in other processes first (compact, import and checkpoint take its
    lock; info, export and verify only read).
    """


json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON object on stdout instead."
)


@cli.command("info", epilog=EXIT_CODES, short_help="Show the step and the tables.")
@click.argument("path", type=_PathArg)
@json_option
def cmd_info(path: Path, as_json: bool) -> None:
    """Show the step and each table's size and configuration.

    PATH may be a database or a checkpoint; it is opened read-only (the state of its last
    flush) and nothing changes.
    """
    if _is_sharded(path):
        _sharded_info(path, as_json)
        return
    result = offline.info(path)
    if as_json:
        _print_json(result)
        return
    ckpt = result["checkpoint"]
    kind = "database" if ckpt is None else f"{ckpt['kind']} checkpoint"
    pairs: list[tuple[str, Any]] = [("path", result["path"]), ("kind", kind)]
    if ckpt is not None and "base" in ckpt:
        pairs.append(("base", ckpt["base"]))
    pairs += [("step", result["step"]), ("tables", len(result["tables"]))]
    _print_pairs(pairs)
    if not result["tables"]:
        return
    click.echo()
    if ckpt is not None and ckpt["kind"] == "incremental":
        rows = [[n, t["rows"], t["changed_rows"]] for n, t in result["tables"].items()]
        _print_table(["table", "rows", "changed_rows"], rows)
        return
    header = ["table", "dim", "key_type", "rows", "on_disk", "disk_bytes", "ttl_steps"]
    header += ["l2_threshold", "optimizer"]
    rows = []
    for name, t in result["tables"].items():
        disk = t["stats"]["tiers"].get("rocksdb", {})
        cfg = t["config"]
        rows.append([name, t["dim"], t["key_type"], t["rows"], disk.get("rows"), disk.get("bytes")])
        rows[-1] += [cfg["ttl_steps"], cfg["l2_threshold"], cfg["optimizer"]["kind"]]
    _print_table(header, rows)


@cli.command("compact", epilog=EXIT_CODES, short_help="Remove rows by rule; reclaim space.")
@click.argument("path", type=_PathArg)
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
    with _progress("compact") as progress:
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
        _print_json(result)
        return
    header = ["table", "rows_before", "kept", "ttl", "l2", "min_freq"]
    rows = [
        [name, t["rows_before"], t["kept"], *t["removed"].values()]
        for name, t in result["tables"].items()
    ]
    rows.append(["total", result["rows_before"], result["kept"], *result["removed"].values()])
    _print_table(header, rows)
    click.echo(f"at step {result['step']:,}" + ("; dry run: nothing changed" if dry_run else ""))


def _is_sharded(path: Path) -> bool:
    return (path / "sharding.json").is_file()


def _sharded_info(path: Path, as_json: bool) -> None:
    from evdb import distributed

    result = distributed.info(path)
    if as_json:
        _print_json(result)
        return
    ckpt = result["checkpoint"]
    kind = "sharded database" if ckpt is None else f"sharded {ckpt['kind']} checkpoint"
    _print_pairs(
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
        _print_table(["table", "placement", "rows", "rows per shard", "imbalance"], rows)


@cli.command("reshard", epilog=EXIT_CODES, short_help="Reshard a sharded checkpoint.")
@click.argument("src", type=_PathArg)
@click.argument("dest", type=_PathArg)
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

    _require_path(src, "src", "evdb sharded checkpoint", "sharding.json")
    with _progress("reshard") as progress:
        layout = distributed.reshard(src, dest, shards, progress=progress)
    result = {
        "dest": str(dest),
        "shards": layout["world_size"],
        "step": layout["step"],
        "tables": sorted(layout["tables"]),
    }
    if as_json:
        _print_json(result)
        return
    _print_pairs([(k, result[k]) for k in ("dest", "shards", "step", "tables")])


@cli.command("export", epilog=EXIT_CODES, short_help="Export tables' live rows to files.")
@click.argument("path", type=_PathArg)
@click.argument("dest", type=_PathArg)
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
    type=click.Choice(["float32", "float16"]),
    default="float32",
    show_default=True,
    help="Type of the values written (slots stay float32).",
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
    if not _is_sharded(path):  # a sharded one exports merged
        _require_path(path)
    with _progress("export") as progress:
        manifest = export(
            path,
            dest,
            tables=list(tables) or None,
            format=format_,
            dtype=dtype,
            include_slots=include_slots,
            progress=progress,
        )
    n_files, n_bytes = _manifest_bytes(manifest)
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
        _print_json(result)
        return
    _print_pairs([(k, result[k]) for k in ("dest", "kind", "step", "dtype", "files", "bytes")])
    if result["tables"]:
        click.echo()
        rows = [
            [name, t.get("rows"), t.get("dim"), t.get("file")]
            for name, t in result["tables"].items()
        ]
        _print_table(["table", "rows", "dim", "file"], rows)


@cli.command("import", epilog=EXIT_CODES, short_help="Import vectors into a table.")
@click.argument("src", type=_PathArg)
@click.argument("path", type=_PathArg)
@click.option("--table", metavar="T", required=True, help="Table to fill (created if missing).")
@click.option(
    "--format",
    "format_",
    type=click.Choice(IMPORT_FORMATS),
    required=True,
    help="Vector file format (npz: arrays keys and values).",
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
    its strings). A failed import leaves nothing behind: no new table, and no database
    directory it created.
    """
    with _progress("import") as progress:  # a failed import removes a database it created
        result = offline.import_file(
            path, table, src, format=format_, freeze=freeze, progress=progress
        )
    if as_json:
        _print_json(result)
    else:
        _print_pairs(list(result.items()))


@cli.command("checkpoint", epilog=EXIT_CODES, short_help="Write a checksummed checkpoint.")
@click.argument("path", type=_PathArg)
@click.argument("dest", type=_PathArg)
@click.option(
    "--base",
    metavar="PREV",
    type=_PathArg,
    help="An earlier checkpoint: store only the rows changed since.",
)
@json_option
def cmd_checkpoint(path: Path, dest: Path, base: Path | None, as_json: bool) -> None:
    """Write a checksummed checkpoint of the database at PATH to DEST (full, or incremental
    with --base)."""
    _require_path(path)
    if base is not None:
        _require_path(base, "base", "evdb checkpoint", "MANIFEST.json")
    with evdb.open(path) as db:
        manifest = db.checkpoint(dest, base=base)
    n_files, n_bytes = _manifest_bytes(manifest)
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
        _print_json(result)
        return
    pairs = [(k, result[k]) for k in ("dest", "kind", "step")]
    if "base" in result:
        pairs.append(("base", result["base"]))
    pairs += [("files", n_files), ("bytes", n_bytes)]
    _print_pairs(pairs)
    if result["tables"]:
        click.echo()
        changed = result.get("changed_rows")
        if changed is None:
            _print_table(["table", "rows"], list(result["tables"].items()))
        else:
            rows = [[n, r, changed.get(n)] for n, r in result["tables"].items()]
            _print_table(["table", "rows", "changed_rows"], rows)


@cli.command("verify", epilog=EXIT_CODES, short_help="Check a checkpoint's or export's files.")
@click.argument("path", type=_PathArg)
@json_option
def cmd_verify(path: Path, as_json: bool) -> None:
    """Check the size and checksum of every file of the checkpoint at PATH (and of its
    base, for an incremental one). Exit 3 names the first damaged file."""
    _require_path(path, "path", "evdb checkpoint or export", "MANIFEST.json")
    manifest = evdb.verify(path)
    n_files, n_bytes = _manifest_bytes(manifest)
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
        _print_json(result)
        return
    base = f" (and its base {result['base']})" if "base" in result else ""
    click.echo(f"OK: {n_files:,} files, {n_bytes:,} bytes checked in {path}{base}")


@cli.command("serve", epilog=EXIT_CODES, short_help="Serve lookups over REST (FastAPI).")
@click.argument("path", type=_PathArg)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535))
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1), help="Processes.")
@click.option(
    "--token-file",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="File holding the bearer token of the admin endpoints (without it: no admin).",
)
@click.option(
    "--allow-root",
    "allow_roots",
    multiple=True,
    type=click.Path(path_type=Path, file_okay=False, exists=True),
    help="Directory a reload may open snapshots from (repeatable; default: PATH's parent).",
)
@click.option(
    "--max-keys",
    default=100_000,
    show_default=True,
    type=click.IntRange(1),
    help="Most keys in one request (more: 413).",
)
@click.option(
    "--cache-rows",
    type=click.IntRange(1),
    help="Rows of each table every worker keeps in DRAM (default: the snapshot's dram_rows).",
)
@click.option(
    "--mmap-reads",
    is_flag=True,
    help="Read the rows on disk through memory maps (evdb.open(mmap_reads=True)): faster "
    "cold lookups; the file pages read count in each worker's RSS.",
)
@click.option(
    "--follow",
    is_flag=True,
    help="PATH is a publish root (Database.publish): serve its newest publication and apply "
    "each newer one as it appears.",
)
@click.option(
    "--poll-interval",
    default=1.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="With --follow: seconds between polls of HEAD (jittered across workers).",
)
@click.option(
    "--max-staleness",
    type=click.FloatRange(min=0, min_open=True),
    help="With --follow: /readyz answers 503 while the publication served is older than this "
    "many seconds (default: never for staleness).",
)
@click.option(
    "--no-dashboard",
    is_flag=True,
    help="Serve no /dashboard page and no /v1/dashboard JSON (on by default).",
)
@click.option(
    "--max-scan-rows",
    default=2_000_000,
    show_default=True,
    type=click.IntRange(1),
    help="Largest table a neighbours query (POST /v1/tables/{name}/neighbors) scans.",
)
@click.option("--log-level", default="info", show_default=True, help="uvicorn's log level.")
def cmd_serve(
    path: Path,
    host: str,
    port: int,
    workers: int,
    token_file: Path | None,
    allow_roots: tuple[Path, ...],
    max_keys: int,
    cache_rows: int | None,
    mmap_reads: bool,
    no_dashboard: bool,
    max_scan_rows: int,
    follow: bool,
    poll_interval: float,
    max_staleness: float | None,
    log_level: str,
) -> None:
    """Serve the tables of PATH (a serving export, or a database nobody writes to) for
    online inference: /v1 lookups (JSON or raw bytes), the KServe v2 protocol, /metrics,
    and POST /v1/admin/reload to swap in a new export. Docs at /docs (offline); a dashboard
    at /dashboard unless --no-dashboard.

    Needs the serve extra (pip install 'evdb[serve]'). Every worker opens PATH read-only;
    each keeps the rows it reads in its DRAM cache. With --follow, every worker follows the
    publish root PATH on its own (X-Evdb-Version on each answer is the publication's seq).
    """
    import os
    import shutil
    import tempfile

    try:
        import uvicorn

        from evdb.api.settings import read_token
    except ImportError as e:
        raise click.UsageError(
            f"evdb serve needs the serve extra: pip install 'evdb[serve]' ({e})"
        ) from None
    if not follow and (poll_interval != 1.0 or max_staleness is not None):
        raise click.UsageError("--poll-interval and --max-staleness need --follow")
    if follow:  # a root may have no HEAD yet: the workers wait for the first publication
        if not path.is_dir():
            raise FileNotFoundError(f"path: {path} is not a directory: not a publish root")
    else:
        _require_path(path, "path", "evdb database or serving export")
        # Fail here, once, rather than in each worker; the workers then skip the checksum pass.
        evdb.open(path, read_only=True).close()
    if token_file is not None:
        try:
            read_token(token_file)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--token-file") from None
    roots = allow_roots or (path.resolve().parent,)
    env = {
        "EVDB_PATH": str(path.resolve()),
        "EVDB_PATH_VERIFIED": "1",
        "EVDB_ALLOW_ROOTS": os.pathsep.join(str(r.resolve()) for r in roots),
        "EVDB_MAX_KEYS": str(max_keys),
        "EVDB_MAX_SCAN_ROWS": str(max_scan_rows),
        "EVDB_WORKERS": str(workers),
        "EVDB_DASHBOARD": "0" if no_dashboard else "1",
    }
    if follow:  # the workers follow the root; nothing is loaded from a fixed path
        del env["EVDB_PATH"], env["EVDB_PATH_VERIFIED"]
        env["EVDB_FOLLOW_ROOT"] = str(path.resolve())
        env["EVDB_POLL_INTERVAL"] = repr(poll_interval)
        if max_staleness is not None:
            env["EVDB_MAX_STALENESS"] = repr(max_staleness)
    if cache_rows is not None:
        env["EVDB_CACHE_ROWS"] = str(cache_rows)
    if mmap_reads:
        env["EVDB_MMAP_READS"] = "1"
    if token_file is not None:
        env["EVDB_TOKEN_FILE"] = str(token_file.resolve())
    state_dir = tempfile.mkdtemp(prefix="evdb-serve-") if workers > 1 else None
    if state_dir is not None:  # how a reload that one worker takes reaches the others
        env["EVDB_STATE_FILE"] = os.path.join(state_dir, "snapshot")
        # prometheus-client's multiprocess mode: /metrics sums the workers' metric files
        env["PROMETHEUS_MULTIPROC_DIR"] = os.path.join(state_dir, "metrics")
        os.mkdir(env["PROMETHEUS_MULTIPROC_DIR"])
    os.environ.update(env)
    try:
        uvicorn.run(
            "evdb.api:create_app",
            factory=True,
            host=host,
            port=port,
            workers=workers,
            log_level=log_level,
        )
    finally:
        if state_dir is not None:
            shutil.rmtree(state_dir, ignore_errors=True)


def main() -> None:
    """The ``evdb`` console script and ``python -m evdb``."""
    cli()
