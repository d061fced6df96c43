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

import math
import os
import zipfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from evdb.config import MAX_DIM
from evdb.errors import ConfigError, CorruptDataError, InvalidArgumentError
from evdb.io.vectors import _TOKEN_MAX_BYTES, FORMATS, read_vectors
from evdb.keys import first_above_int64

if TYPE_CHECKING:
    from evdb.database import Database

__all__ = ["IMPORT_FORMATS", "import_vectors"]

IMPORT_FORMATS = (*FORMATS, "npz")
Progress = Callable[[int, int], object]
_CHUNK_BYTES = 64 << 20  # most bytes of one npz array read at once


def _npy_member(zf: zipfile.ZipFile, name: str, src: Path) -> tuple[Any, tuple[int, ...], np.dtype]:
    """An open .npy member of an npz, positioned at its data, with its shape and dtype (numpy
    itself loads a member whole: an npz cannot be memory-mapped). Its header is checked
    against the member's size, so a header declaring more rows than the member holds fails
    here, before any row is read."""
    try:
        f = zf.open(f"{name}.npy")
        version = np.lib.format.read_magic(f)
        read = {
            (1, 0): np.lib.format.read_array_header_1_0,
            (2, 0): np.lib.format.read_array_header_2_0,
        }.get(version)
        if read is None:
            raise ValueError(f".npy format version {version} is not supported")
        shape, fortran, dtype = read(f)
        data_bytes = zf.getinfo(f"{name}.npy").file_size - f.tell()
    except (KeyError, ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise CorruptDataError(f"{src}: not an npz with a readable {name!r} array ({e})") from e
    if fortran or dtype.hasobject or dtype.itemsize == 0:
        raise CorruptDataError(
            f"{src}: {name!r} must be a C-ordered array of numbers or strings, not {dtype.str}"
        )
    if name == "keys" and dtype.kind == "U" and dtype.itemsize > _TOKEN_MAX_BYTES:
        raise CorruptDataError(
            f"{src}: keys dtype {dtype.str} holds strings of {dtype.itemsize // 4:,} characters; "
            f"keys are at most {_TOKEN_MAX_BYTES // 4:,} characters (64 KiB)"
        )
    declared = math.prod(shape) * dtype.itemsize
    if data_bytes != declared:
        rows = shape[0] if shape else 1
        raise CorruptDataError(
            f"{src}: array {name!r}: its header declares {rows:,} rows of shape {shape} and "
            f"dtype {dtype.str} ({declared:,} bytes), the file holds {data_bytes:,} bytes"
        )
    return f, shape, dtype


def _read_exactly(f: Any, n_bytes: int, src: Path, name: str, start: int) -> bytes:
    """n_bytes of a member, or ``CorruptDataError`` naming the file, the array and the row."""
    try:
        data: bytes = f.read(n_bytes)
    except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as e:  # damaged, bad CRC
        raise CorruptDataError(f"{src}: array {name!r} cannot be read at row {start} ({e})") from e
    if len(data) != n_bytes:
        raise CorruptDataError(f"{src}: array {name!r} ends early, at row {start}")
    return data


def _npz_chunks(src: Path, chunk_rows: int) -> tuple[int, Iterator[tuple[Any, np.ndarray]]]:
    """dim and (keys, values) chunks of an npz holding ``keys`` (n,) and ``values`` (n, dim),
    read a chunk at a time (at most ``_CHUNK_BYTES`` of each array, whatever the dtypes)."""
    try:
        zf = zipfile.ZipFile(src)
    except (OSError, zipfile.BadZipFile) as e:
        raise CorruptDataError(f"{src}: not an npz ({e})") from e
    kf, kshape, kdtype = _npy_member(zf, "keys", src)
    vf, vshape, vdtype = _npy_member(zf, "values", src)
    if len(kshape) != 1 or len(vshape) != 2 or vshape[0] != kshape[0]:
        raise CorruptDataError(f"{src}: keys {kshape} and values {vshape} do not line up")
    if kdtype.kind not in "iuU":
        raise CorruptDataError(f"{src}: keys must be integers or strings, not {kdtype}")
    if vdtype.kind != "f":
        raise CorruptDataError(f"{src}: values must be floats, not {vdtype}")
    n, dim = vshape
    if not 1 <= dim <= MAX_DIM:
        raise CorruptDataError(f"{src}: values have dim {dim}; a table's dim is in [1, {MAX_DIM}]")
    row_bytes = max(kdtype.itemsize, dim * vdtype.itemsize)
    rows_per_read = max(1, min(chunk_rows, _CHUNK_BYTES // row_bytes))

    def chunks() -> Iterator[tuple[Any, np.ndarray]]:
        with zf, kf, vf:
            for start in range(0, n, rows_per_read):
                m = min(rows_per_read, n - start)
                k = np.frombuffer(
                    _read_exactly(kf, m * kdtype.itemsize, src, "keys", start), kdtype
                )
                v = np.frombuffer(
                    _read_exactly(vf, m * dim * vdtype.itemsize, src, "values", start), vdtype
                )
                with np.errstate(over="ignore"):  # float64 beyond float32: inf, refused below
                    v = v.reshape(m, dim).astype(np.float32)
                bad = ~np.isfinite(v)
                if bad.any():
                    i, j = np.argwhere(bad)[0]
                    raise CorruptDataError(
                        f"{src}: values[{start + i}, {j}] is not a finite float32"
                    )
                if kdtype.kind == "U":
                    yield k.tolist(), v
                    continue
                big = first_above_int64(k)
                if big is not None:
                    raise InvalidArgumentError(
                        f"{src}: keys[{start + big}] = {k[big]} is outside int64 (evdb keys are "
                        "int64, as in every lookup; map larger unsigned ids into int64 first)"
                    )
                yield k.astype(np.int64), v

    return int(dim), chunks()


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
    db.check_writable()
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
