"""``evdb serve``: the REST service (:mod:`evdb.api`) under uvicorn, configured through the
``EVDB_`` environment its workers read (see :mod:`evdb.tools.cli`)."""

from __future__ import annotations

from pathlib import Path

import click

import evdb
from evdb.manifest import MANIFEST
from evdb.publish_root import HEAD
from evdb.quantized import is_quantized, open_quantized
from evdb.storage import POINTER

from .exit_codes import EXIT_CODES
from .paths import PATH_ARG, require_path

__all__ = ["cmd_serve"]


@click.command("serve", epilog=EXIT_CODES, short_help="Serve lookups over REST (FastAPI).")
@click.argument("path", type=PATH_ARG)
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
    "--dtype",
    type=click.Choice(["float32", "int8", "int4"]),
    default="float32",
    show_default=True,
    help="With --follow: serve the rows quantised, each full publication quantised row-wise "
    "as it loads (no float32 copy held) and each delta's rows as applied.",
)
@click.option(
    "--cache-dir",
    type=click.Path(path_type=Path, file_okay=False, exists=True),
    help="With --follow --dtype int8|int4: where each worker writes its quantised fulls "
    "(default: the system's temporary folder).",
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
@click.option(
    "--grpc-port",
    type=click.IntRange(1, 65535),
    help="Also serve the KServe v2 gRPC protocol (tritonclient.grpc) on this port, from the "
    "same snapshot; every worker binds it.",
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
    dtype: str,
    cache_dir: Path | None,
    grpc_port: int | None,
    log_level: str,
) -> None:
    """Serve the tables of PATH (a serving export, int8 and int4 ones included, or a
    database nobody writes to) for online inference: /v1 lookups (JSON or raw bytes), the
    KServe v2 protocol, /metrics, and POST /v1/admin/reload to swap in a new export. Docs at
    /docs (offline); a dashboard at /dashboard unless --no-dashboard.

    Needs the serve extra (pip install 'evdb[serve]'). Every worker opens PATH read-only;
    each keeps the rows it reads in its DRAM cache. With --follow, every worker follows the
    publish root PATH on its own (X-Evdb-Version on each answer is the publication's seq);
    with --dtype int8 or int4 it serves them quantised.
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
    if not follow and dtype != "float32":
        raise click.UsageError(
            "--dtype needs --follow: a snapshot is served in the dtype it was exported in "
            "(evdb export --format serving --dtype int8)"
        )
    if cache_dir is not None and dtype == "float32":
        raise click.UsageError("--cache-dir needs --follow --dtype int8 or int4")
    if follow:  # a root may have no HEAD yet: the workers wait for the first publication
        if not path.is_dir():
            raise FileNotFoundError(f"path: {path} is not a directory: not a publish root")
        is_database = (path / POINTER).exists() or (path / MANIFEST).exists()
        if is_database and not (path / HEAD).exists():  # it would wait for HEAD forever
            raise click.UsageError(
                f"path: {path} is an evdb database or export, not a publish root: serve it "
                "without --follow, or follow the root a trainer publishes to (db.publish(root))"
            )
    elif is_quantized(path):  # an int8 / int4 export: its files, memory-mapped
        open_quantized(path).close()  # checked here once, as below
    else:
        require_path(path, "path", "evdb database or serving export")
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
        env["EVDB_FOLLOW_DTYPE"] = dtype
        if cache_dir is not None:
            env["EVDB_FOLLOW_CACHE"] = str(cache_dir.resolve())
    if grpc_port is not None:
        try:
            import tritonclient.grpc  # noqa: F401  (the stubs the gRPC service serves)
        except ImportError as e:
            raise click.UsageError(
                f"--grpc-port needs the serve extra: pip install 'evdb[serve]' ({e})"
            ) from None
        env["EVDB_GRPC_PORT"] = str(grpc_port)
        env["EVDB_GRPC_HOST"] = host
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
