"""``import_vectors``: start a table from pre-trained vectors (word2vec, GloVe, fastText, npz).

The file is read twice, a chunk at a time: the first pass checks every line and counts the
rows (so a malformed line 9,000,000 raises before a single row is written), the second upserts.
Memory is bounded by the chunk size; the header's row count is never trusted. A word file
fills (or creates) a ``key_type="str"`` table that keeps its strings, so the table can be
exported back to word2vec; a token given twice takes its last vector, as ``upsert`` does, and
the duplicates are counted. ``freeze=True`` marks the imported rows frozen: training reads them
as they are (the exact pre-trained vector is the row's start) and never changes them, while
rows created later train normally.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from evdb.errors import ConfigError, CorruptDataError, InvalidArgumentError
from evdb.io.vectors import FORMATS, read_vectors

if TYPE_CHECKING:
    from evdb.database import Database

__all__ = ["IMPORT_FORMATS", "import_vectors"]

IMPORT_FORMATS = (*FORMATS, "npz")
Progress = Callable[[int, int], None]


def _npz_chunks(src: Path, chunk_rows: int) -> tuple[int, Iterator[tuple[np.ndarray, np.ndarray]]]:
    """dim and (keys, values) chunks of an npz holding ``keys`` (n,) and ``values`` (n, dim)."""
    try:
        z = np.load(src, allow_pickle=False, mmap_mode="r")
        keys, values = z["keys"], z["values"]
    except (OSError, ValueError, KeyError) as e:
        raise CorruptDataError(f"{src}: not an npz with 'keys' and 'values' ({e})") from e
    if keys.ndim != 1 or values.ndim != 2 or values.shape[0] != keys.shape[0]:
        raise CorruptDataError(f"{src}: keys {keys.shape} and values {values.shape} do not line up")
    if keys.dtype.kind not in "iuU":
        raise CorruptDataError(f"{src}: keys must be integers or strings, not {keys.dtype}")

    def chunks() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for start in range(0, keys.shape[0], chunk_rows):
            v = np.asarray(values[start : start + chunk_rows], dtype=np.float32)
            bad = ~np.isfinite(v)
            if bad.any():
                i, j = np.argwhere(bad)[0]
                raise CorruptDataError(f"{src}: values[{start + i}, {j}] is not finite")
            k = keys[start : start + chunk_rows]
            yield (k.tolist() if k.dtype.kind == "U" else np.asarray(k, np.int64)), v

    return int(values.shape[1]), chunks()


def _chunks(
    src: Path, format: str, chunk_rows: int
) -> tuple[int, Iterator[tuple[Any, np.ndarray]]]:
    if format == "npz":
        return _npz_chunks(src, chunk_rows)
    header, rows = read_vectors(src, format, chunk_rows=chunk_rows)
    return header.dim, ((c.tokens, c.values) for c in rows)


def import_vectors(
    db: Database,
    table: str,
    src: str | os.PathLike[str],
    format: str = "word2vec",
    *,
    freeze: bool = False,
    chunk_rows: int = 65536,
    progress: Progress | None = None,
    **table_options: Any,
) -> dict[str, Any]:
    """Fill table (created if missing, with ``table_options``) from a vector file.

    Returns ``{"table", "format", "dim", "rows_read", "new_rows", "duplicates", "rows",
    "created", "frozen"}``. For a new table ``duplicates`` counts the lines whose key an
    earlier line had (the last one wins); filling an existing table, lines that updated a row
    that was already there are not told apart from duplicates, and ``duplicates`` is None.
    """
    if format not in IMPORT_FORMATS:
        raise InvalidArgumentError(f"format must be one of {IMPORT_FORMATS}, got {format!r}")
    if isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 1:
        raise InvalidArgumentError(f"chunk_rows must be an int >= 1, got {chunk_rows!r}")
    path = Path(src)
    if not path.is_file():
        raise FileNotFoundError(f"src: no file {path}")
    db._check_writable()
    words = format != "npz"

    # Pass 1: every line checked, rows counted, nothing written.
    dim, chunks = _chunks(path, format, chunk_rows)
    total = sum(v.shape[0] for _, v in chunks)
    exists = table in db.tables()
    if exists:
        t = db.table(table)
        if t.dim != dim:
            raise ConfigError(f"table: {table!r} has dim {t.dim}, {path} has dim {dim}")
        if words and t.config.key_type != "str":
            raise ConfigError(f"table: {table!r} has int64 keys; {format} files have words")
    before = len(db.table(table)) if exists else 0

    # Pass 2: upsert chunk by chunk.
    if not exists:
        if words:
            table_options.setdefault("key_type", "str")
            table_options.setdefault("keep_strings", True)
        t = db.create_table(table, dim, **table_options)
    done = 0
    try:
        _, chunks = _chunks(path, format, chunk_rows)
        for keys, values in chunks:
            t.upsert(keys, values, freeze=True if freeze else None)
            done += values.shape[0]
            if progress is not None:
                progress(done, total)
    except BaseException:
        if not exists:  # never leave a half-filled new table behind
            db.drop_table(table)
        raise
    rows = len(t)
    return {
        "table": table,
        "format": format,
        "dim": dim,
        "rows_read": total,
        "new_rows": rows - before,
        "duplicates": None if exists else total - rows,
        "rows": rows,
        "created": not exists,
        "frozen": freeze,
    }
