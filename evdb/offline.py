"""Offline maintenance of a database directory that no process has open.

``compact`` removes rows by rule (TTL, L2 norm, pull frequency) from every tier and then has
RocksDB rewrite its files without them; ``info`` summarises a database or checkpoint without
changing it; ``import_file`` fills a table of a database (created if missing) from a vector
file. The ``evdb`` command line (``evdb compact``, ``evdb info``, ``evdb import``) calls them.

Unlike ``Table.compact()``, which a trainer calls on an open table with the table's own TTL and
L2 threshold, ``compact`` here takes the rules as arguments (each defaulting to the table's
config), adds a minimum pull frequency, can judge TTL at another step than the database's,
counts what each rule would remove without changing anything (``dry_run=True``), and returns
the disk space to the file system by a manual RocksDB compaction.
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from evdb import database as _database
from evdb.checkpoint import MANIFEST, read_manifest
from evdb.errors import InvalidArgumentError
from evdb.io.importer import IMPORT_FORMATS, import_vectors
from evdb.quantized import info as quantized_info
from evdb.quantized import is_quantized
from evdb.records import RecordBatch
from evdb.storage import POINTER

__all__ = ["RULES", "compact", "import_file", "info"]

RULES = ("ttl", "l2", "min_freq")
"""The removal rules, in the order a row matching several is counted under the first."""

_SCAN_ROWS = 65536  # rows per scanned chunk and per delete call: bounds their memory
_STEP_MAX = 2**63 - 1

Progress = Callable[[int, int], object]


def compact(
    path: str | os.PathLike[str],
    table: str | None = None,
    *,
    ttl_steps: int | None = None,
    l2_threshold: float | None = None,
    min_freq: int | None = None,
    step: int | None = None,
    dry_run: bool = False,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Remove rows by rule from the tables of a closed database, then compact RocksDB.

    Every stored row (expired ones included) of each table, or of the one named, is judged;
    a row goes if it matches any rule:

    ========  ==============================  =======================================
    rule      removes a row when              default
    ========  ==============================  =======================================
    ttl       ``step - last_step > ttl_steps``  the table's ``ttl_steps`` (None: off)
    l2        ``norm(value) < l2_threshold``    the table's ``l2_threshold`` (None: off)
    min_freq  ``freq < min_freq``               off
    ========  ==============================  =======================================

    Removed rows leave every tier (as ``Table.delete`` does); then the database is flushed,
    RocksDB compacts the tables' column families (so the space returns to the file system)
    and the database is closed.

    Parameters
    ----------
    path : str or PathLike
        A database directory (it must exist: this never creates one). Not a checkpoint:
        compacting one would turn it into a database, breaking incremental checkpoints based
        on it (``dry_run=True`` may read one).
    table : str, optional
        Only this table; default every table.
    ttl_steps : int >= 0, optional
        Overrides every table's ``ttl_steps`` for this run.
    l2_threshold : float >= 0, optional
        Overrides every table's ``l2_threshold`` for this run.
    min_freq : int >= 0, optional
        Remove rows pulled fewer than this many times (``freq``; upserted rows have 0).
    step : int >= 0, optional
        The step TTL is judged at; default the database's step.
    dry_run : bool
        Count what would be removed; change nothing (the database is opened read-only).
    progress : callable(rows_done, rows_total), optional
        Called after each scanned chunk, with totals over the tables compacted.

    Returns
    -------
    dict
        ``{"path", "step", "dry_run", "rows_before", "kept", "removed": {"ttl", "l2",
        "min_freq"}, "tables": {name: {"rows_before", "kept", "removed": {...}, "rules":
        {"ttl_steps", "l2_threshold", "min_freq"}}}}``. ``rows_before`` counts stored rows,
        expired ones included (so it can exceed ``len(table)``); ``rows_before = kept +
        sum(removed)``. A row matching several rules is counted under the first of ttl, l2,
        min_freq.

    Raises
    ------
    InvalidArgumentError
        A bad argument (named), or path is a checkpoint and dry_run is False. Nothing changes.
    FileNotFoundError
        path is not a database directory (no ``evdb.json``).
    TableNotFoundError
        No table called ``table``.
    DatabaseLockedError
        Another process has the database open.

    Examples
    --------
    >>> import tempfile, evdb, evdb.offline
    >>> path = tempfile.mkdtemp()
    >>> with evdb.open(path) as db:
    ...     t = db.create_table("item", dim=2)
    ...     t.upsert([1, 2, 3], [[0.0, 0.0], [3.0, 4.0], [1.0, 0.0]])
    >>> report = evdb.offline.compact(path, l2_threshold=0.5)
    >>> report["rows_before"], report["kept"], report["removed"]
    (3, 2, {'ttl': 0, 'l2': 1, 'min_freq': 0})
    """
    root = _parse_path(path)
    if table is not None and not isinstance(table, str):
        raise InvalidArgumentError(f"table must be a str or None, got {table!r}")
    ttl_steps = _parse_int("ttl_steps", ttl_steps)
    min_freq = _parse_int("min_freq", min_freq)
    step = _parse_int("step", step)
    if l2_threshold is not None and (
        isinstance(l2_threshold, bool)
        or not isinstance(l2_threshold, (int, float))
        or not math.isfinite(l2_threshold)
        or l2_threshold < 0
    ):
        raise InvalidArgumentError(
            f"l2_threshold must be a finite number >= 0 or None, got {l2_threshold!r}"
        )
    if not isinstance(dry_run, bool):
        raise InvalidArgumentError(f"dry_run must be a bool, got {dry_run!r}")
    if progress is not None and not callable(progress):
        raise InvalidArgumentError(f"progress must be a callable or None, got {progress!r}")
    _require_database(root)
    if not dry_run and (root / MANIFEST).exists():
        raise InvalidArgumentError(
            f"path: {root} is a checkpoint ({MANIFEST}); compacting it would turn it into a "
            "database and break the incremental checkpoints based on it: compact the "
            "database it was taken from, or open it once with evdb.open to make it one"
        )

    with _database.open(root, read_only=dry_run) as db:
        names = db.tables() if table is None else [db.table(table).name]
        at = db.step if step is None else step
        tables = [db.table(n) for n in names]
        total = sum(t.stored_rows() for t in tables)
        done = 0
        report: dict[str, Any] = {}
        for t in tables:
            ttl = t.config.ttl_steps if ttl_steps is None else ttl_steps
            l2 = t.config.l2_threshold if l2_threshold is None else l2_threshold
            rules = {"ttl_steps": ttl, "l2_threshold": l2, "min_freq": min_freq}
            counts = np.zeros(len(RULES), dtype=np.int64)
            doomed: list[np.ndarray] = []
            rows = 0
            for keys, records in t.records(_SCAN_ROWS):
                verdict = _judge(records, at, ttl, l2, min_freq)  # rule index, -1 = keep
                counts += np.bincount(verdict + 1, minlength=len(RULES) + 1)[1:]
                doomed.append(keys[verdict >= 0])
                rows += keys.shape[0]
                done += keys.shape[0]
                if progress is not None:
                    progress(done, max(total, done))
            removed = dict(zip(RULES, counts.tolist(), strict=True))
            if not dry_run and doomed:
                gone = np.concatenate(doomed)
                for start in range(0, gone.shape[0], _SCAN_ROWS):
                    t.delete(gone[start : start + _SCAN_ROWS])
            report[t.name] = {
                "rows_before": rows,
                "kept": rows - int(counts.sum()),
                "removed": removed,
                "rules": rules,
            }
        if not dry_run:
            db.flush()
            db.storage.compact_tables(set(names))
    return {
        "path": str(root),
        "step": at,
        "dry_run": dry_run,
        "rows_before": sum(r["rows_before"] for r in report.values()),
        "kept": sum(r["kept"] for r in report.values()),
        "removed": {rule: sum(r["removed"][rule] for r in report.values()) for rule in RULES},
        "tables": report,
    }


def info(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Summarise a database or checkpoint directory without changing it.

    Returns
    -------
    dict
        ``{"path", "step", "checkpoint": None | {"kind", ...}, "tables": {name: {"dim",
        "key_type", "config", "rows", "stats"}}}``. A database opens read-only (the state of
        its last flush). An incremental checkpoint cannot be opened read-only, so for one
        the tables report what its manifest records (``rows``, ``changed_rows``).

    Raises
    ------
    FileNotFoundError
        path is neither a database nor a checkpoint.
    CorruptDataError
        A file is damaged (a checkpoint's files are checked against its manifest).
    """
    root = _parse_path(path)
    manifest = read_manifest(root) if root.is_dir() else None
    if manifest is None:
        _require_database(root)
    elif is_quantized(root):  # frozen files, not a database: read as they are served
        return quantized_info(root)
    checkpoint = None
    if manifest is not None:
        checkpoint = {"kind": manifest["kind"], "created": manifest.get("created")}
        if manifest["kind"] == "incremental":
            checkpoint["base"] = manifest["base"]
            changed = manifest.get("changed_rows", {})
            return {
                "path": str(root),
                "step": manifest["step"],
                "checkpoint": checkpoint,
                "tables": {
                    name: {"rows": t["rows"], "changed_rows": changed.get(name)}
                    for name, t in sorted(manifest["tables"].items())
                },
            }
    with _database.open(root, read_only=True) as db:
        tables = {}
        for name in db.tables():
            t = db.table(name)
            tables[name] = {
                "dim": t.dim,
                "key_type": t.config.key_type,
                "config": t.config.to_dict(),
                "rows": len(t),
                "stats": t.stats(),
            }
        return {"path": str(root), "step": db.step, "checkpoint": checkpoint, "tables": tables}


def import_file(
    path: str | os.PathLike[str],
    table: str,
    src: str | os.PathLike[str],
    format: str = "word2vec",
    *,
    freeze: bool = False,
    progress: Progress | None = None,
    **table_options: Any,
) -> dict[str, Any]:
    """``evdb.import_vectors`` into the database at path, which is created if missing.

    A failed import leaves nothing behind: the table it created is dropped (as
    ``import_vectors`` does), and so is the database directory if this call created it (with
    the parent directories it created); a directory that existed before is never removed.

    Returns
    -------
    dict
        What ``import_vectors`` returns.

    Raises
    ------
    FileNotFoundError
        src is not a file (checked before anything is created).
    InvalidArgumentError, CorruptDataError, ConfigError
        As ``import_vectors``: a bad argument, a malformed file (naming it, and the line,
        record or array), a table of another dim.
    """
    root = _parse_path(path)
    if not isinstance(src, (str, os.PathLike)):
        raise InvalidArgumentError(f"src must be a str or os.PathLike, got {src!r}")
    source = Path(src)
    if not source.is_file():
        raise FileNotFoundError(
            f"src: {source} {'is not a file' if source.exists() else 'does not exist'}"
        )
    if format not in IMPORT_FORMATS:
        raise InvalidArgumentError(f"format must be one of {IMPORT_FORMATS}, got {format!r}")
    created = _make_dirs(root)
    try:
        with _database.open(root) as db:
            return import_vectors(
                db, table, source, format, freeze=freeze, progress=progress, **table_options
            )
    except BaseException:
        if created is not None:  # closed first (above), so nothing writes into it any more
            shutil.rmtree(created, ignore_errors=True)
        raise


def _make_dirs(root: Path) -> Path | None:
    """Create root and its missing parents; return the topmost directory this call created
    (None if root existed). Made one at a time with mkdir, which fails on an existing entry,
    so a directory another process made meanwhile is never taken for ours."""
    missing = []
    at = root
    while not os.path.lexists(at):
        missing.append(at)
        at = at.parent
    created = None
    for d in reversed(missing):
        try:
            os.mkdir(d)
        except FileExistsError:
            if created is not None:  # someone made it below ours: stop claiming anything
                return None
            continue
        created = created or d
    return created


# -- helpers ------------------------------------------------------------------------------
def _judge(
    records: RecordBatch,
    step: int,
    ttl_steps: int | None,
    l2_threshold: float | None,
    min_freq: int | None,
) -> np.ndarray:
    """(n,) int8: the index in RULES of the first rule each record matches, -1 for none."""
    n = len(records)
    verdict = np.full(n, -1, dtype=np.int8)
    masks: list[np.ndarray | None] = [None, None, None]
    if ttl_steps is not None and step - ttl_steps > -(2**63):
        masks[0] = records.last_step < step - ttl_steps  # step - last_step > ttl_steps
    if l2_threshold is not None:
        masks[1] = np.linalg.norm(records.values, axis=1) < l2_threshold
    if min_freq is not None:
        masks[2] = records.freq.astype(np.int64) < min_freq
    for i in reversed(range(len(RULES))):  # the first matching rule is written last
        mask = masks[i]
        if mask is not None:
            verdict[mask] = i
    return verdict


def _parse_path(path: Any) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidArgumentError(f"path must be a str or os.PathLike, got {path!r}")
    return Path(path)


def _parse_int(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidArgumentError(f"{name} must be an int >= 0 or None, got {value!r}")
    if not 0 <= value <= _STEP_MAX:
        raise InvalidArgumentError(f"{name} must be in [0, 2**63 - 1] or None, got {value}")
    return int(value)


def _require_database(root: Path) -> None:
    if not (root / POINTER).is_file():
        what = "does not exist" if not root.exists() else f"has no {POINTER}"
        raise FileNotFoundError(f"path: {root} {what}: not an evdb database")
