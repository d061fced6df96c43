"""``import_vectors``: start a table from pre-trained vectors (word2vec, GloVe, fastText, npz).

The file is read twice, a chunk at a time: the first pass checks every line and counts the
rows (so a malformed line 9,000,000 raises before a single row is written), the second upserts.
Memory is bounded by the chunk size; the header's row count is never trusted. A word file
fills (or creates) a ``key_type="str"`` table that keeps its strings, so the table can be
exported back to word2vec; a token given twice takes its last vector, as ``upsert`` does, and
the duplicates are counted. ``freeze=True`` marks the imported rows frozen: training reads them
as they are (the exact pre-trained vector is the row's start) and never changes them, while
rows created later train normally.

An npz that evdb exported (``evdb.io.export``) carries its table's config (a ``config``
member) and, with ``include_slots``, the optimizer slots: a table the import creates takes
that config (optimizer and learning rate, TTL, admission, initializer, tiers; the
``table_options`` given win; not the HBM tier, which is this machine's to add), and its rows
take the slots, so export then import gives the table back (each row's ``freq`` and
``last_step`` start again at the import, as after ``upsert``). An npz from elsewhere, with
only ``keys`` and ``values``, imports as before: the table is created with
``table_options`` or the defaults (SGD, no TTL, no admission). A ``slots`` member must be as
wide as the table's optimizer keeps (``ConfigError`` otherwise, before anything is written).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import zipfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from evdb.config import MAX_DIM, TableConfig
from evdb.errors import ConfigError, CorruptDataError, InvalidArgumentError
from evdb.io.vectors import _TOKEN_MAX_BYTES, FORMATS, read_vectors
from evdb.keys import first_above_int64
from evdb.optim import SGD
from evdb.records import FROZEN, RecordBatch

if TYPE_CHECKING:
    from evdb.database import Database
    from evdb.table import Table

__all__ = ["IMPORT_FORMATS", "import_vectors"]

IMPORT_FORMATS = (*FORMATS, "npz")
Progress = Callable[[int, int], object]
_CHUNK_BYTES = 64 << 20  # most bytes of one npz array read at once
_CONFIG_BYTES = 1 << 20  # an exported config is a few hundred bytes
Chunk = tuple[Any, np.ndarray, "np.ndarray | None"]  # keys, values (m, dim), slots (m, k)


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


def _npz_config(src: Path) -> TableConfig | None:
    """The table config an evdb npz export carries (its ``config`` member), None if the
    file has none (an npz from elsewhere)."""
    with zipfile.ZipFile(src) as zf:  # _npz_chunks has read the file's directory already
        if "config.npy" not in zf.namelist():
            return None
        f, shape, dtype = _npy_member(zf, "config", src)
        with f:
            if dtype != np.uint8 or len(shape) != 1 or shape[0] > _CONFIG_BYTES:
                raise CorruptDataError(f"{src}: 'config' must be a uint8 JSON text, not {dtype}")
            blob = _read_exactly(f, shape[0], src, "config", 0)
    try:
        return TableConfig.from_dict(json.loads(blob)["config"])
    except (KeyError, TypeError, ValueError) as e:  # JSON, a missing field, a bad value
        raise CorruptDataError(f"{src}: 'config' is not an evdb table config ({e})") from e


def _npz_chunks(src: Path, chunk_rows: int) -> tuple[int, int | None, Iterator[Chunk]]:
    """dim, the width of its ``slots`` (None without them) and (keys, values, slots)
    chunks of an npz holding ``keys`` (n,), ``values`` (n, dim) and optionally ``slots``
    (n, k), read a chunk at a time (at most ``_CHUNK_BYTES`` of each array, whatever the
    dtypes)."""
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
    sf, width = None, None
    if "slots.npy" in zf.namelist():
        sf, sshape, sdtype = _npy_member(zf, "slots", src)
        if len(sshape) != 2 or sshape[0] != n or sdtype.kind != "f":
            raise CorruptDataError(
                f"{src}: slots {sshape} {sdtype} do not line up with values {vshape}"
            )
        if kdtype.kind == "U":
            raise CorruptDataError(f"{src}: slots come with int64 keys, not {kdtype}")
        width = int(sshape[1])
    row_bytes = max(kdtype.itemsize, dim * vdtype.itemsize, (width or 0) * 8)
    rows_per_read = max(1, min(chunk_rows, _CHUNK_BYTES // row_bytes))

    def floats(f: Any, m: int, cols: int, dt: np.dtype, name: str, start: int) -> np.ndarray:
        raw = np.frombuffer(_read_exactly(f, m * cols * dt.itemsize, src, name, start), dt)
        with np.errstate(over="ignore"):  # float64 beyond float32: inf, refused below
            out = raw.reshape(m, cols).astype(np.float32)
        bad = ~np.isfinite(out)
        if bad.any():
            i, j = np.argwhere(bad)[0]
            raise CorruptDataError(f"{src}: {name}[{start + i}, {j}] is not a finite float32")
        return out

    def chunks() -> Iterator[Chunk]:
        with zf, kf, vf, contextlib.nullcontext() if sf is None else sf:
            for start in range(0, n, rows_per_read):
                m = min(rows_per_read, n - start)
                k = np.frombuffer(
                    _read_exactly(kf, m * kdtype.itemsize, src, "keys", start), kdtype
                )
                v = floats(vf, m, dim, vdtype, "values", start)
                slots = None if sf is None else floats(sf, m, width or 0, sdtype, "slots", start)
                if kdtype.kind == "U":
                    yield k.tolist(), v, None
                    continue
                big = first_above_int64(k)
                if big is not None:
                    raise InvalidArgumentError(
                        f"{src}: keys[{start + big}] = {k[big]} is outside int64 (evdb keys are "
                        "int64, as in every lookup; map larger unsigned ids into int64 first)"
                    )
                yield k.astype(np.int64), v, slots

    return int(dim), width, chunks()


def _chunks(src: Path, format: str, chunk_rows: int) -> tuple[int, int | None, Iterator[Chunk]]:
    if format == "npz":
        return _npz_chunks(src, chunk_rows)
    header, rows = read_vectors(src, format, chunk_rows=chunk_rows)
    return header.dim, None, ((c.tokens, c.values, None) for c in rows)


def _options_of(config: TableConfig) -> dict[str, Any]:
    """``create_table``'s arguments for a table like config (no HBM tier: this machine's)."""
    return {
        "key_type": config.key_type,
        "initializer": config.initializer,
        "admission": config.admission,
        "optimizer": config.optimizer,
        "ttl_steps": config.ttl_steps,
        "l2_threshold": config.l2_threshold,
        "default_value": config.default_value,
        "dram": config.dram,
        "disk": False if config.disk is None else config.disk,
        "dtype": config.dtype,  # a half-precision table comes back one, rows bit for bit
        "rounding": config.rounding,
        "slot_dtype": config.slot_dtype,
    }


def _put_with_slots(
    t: Table, step: int, keys: Any, values: np.ndarray, slots: np.ndarray, freeze: bool
) -> None:
    """Rows of keys with their values and slots, as ``upsert`` would leave them otherwise: a
    key given twice takes its last row, an existing row is replaced."""
    k = np.asarray(keys, dtype=np.int64)
    uniq, first_of_reversed = np.unique(k[::-1], return_index=True)
    last = k.shape[0] - 1 - first_of_reversed
    there = t.contains(uniq)
    if there.any():
        t.delete(uniq[there])
    n = uniq.shape[0]
    records = RecordBatch(
        values=values[last],
        slots=slots[last],
        freq=np.zeros(n, dtype=np.uint32),
        last_step=np.full(n, step, dtype=np.int64),
        version=np.full(n, t.meta.bump(), dtype=np.uint64),
        flags=np.full(n, FROZEN if freeze else 0, dtype=np.uint8),
    )
    t.restore_records(uniq, records)


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
    "created", "frozen", "config", "slots"}``. For a new table ``duplicates`` counts the lines
    whose key an earlier line had (the last one wins); filling an existing table, lines that
    updated a row that was already there are not told apart from duplicates, and
    ``duplicates`` is None. ``config`` says where a created table's config came from
    ("file": an evdb npz export's, "options": ``table_options`` and the defaults; None when the
    table existed); ``slots`` whether the rows took the file's optimizer slots.
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
    dim, width, chunks = _chunks(path, format, chunk_rows)
    total = sum(v.shape[0] for _, v, _ in chunks)
    exported = _npz_config(path) if format == "npz" else None
    if exported is not None and exported.dim != dim:
        raise CorruptDataError(f"{path}: its config has dim {exported.dim}, its values {dim}")
    exists = table in db.tables()
    if exists:
        t = db.table(table)
        if t.dim != dim:
            raise ConfigError(f"table: {table!r} has dim {t.dim}, {path} has dim {dim}")
        if words and t.config.key_type != "str":
            raise ConfigError(f"table: {table!r} has int64 keys; {format} files have words")
        optimizer = t.config.optimizer
    else:
        if words:
            table_options.setdefault("key_type", "str")
            table_options.setdefault("keep_strings", True)
        if exported is not None:
            options = _options_of(exported)
            if "dtype" in table_options and "slot_dtype" not in table_options:
                # half slots follow the values into the dtype asked for (float32: float32)
                half = options["slot_dtype"] != "float32"
                options["slot_dtype"] = table_options["dtype"] if half else "float32"
            table_options = {**options, **table_options}
        optimizer = table_options.get("optimizer") or SGD()
    if width is not None and width != optimizer.n_slots(dim):
        raise ConfigError(
            f"{path}: its slots have {width} columns; the optimizer of table {table!r} "
            f"({optimizer.kind!r}) keeps {optimizer.n_slots(dim)} for dim {dim}"
        )
    before = len(db.table(table)) if exists else 0

    # Pass 2: upsert chunk by chunk.
    if not exists:
        t = db.create_table(table, dim, **table_options)
    done = 0
    try:
        _, _, chunks = _chunks(path, format, chunk_rows)
        for keys, values, slots in chunks:
            if slots is None:
                t.upsert(keys, values, freeze=True if freeze else None)
            else:
                _put_with_slots(t, db.step, keys, values, slots, freeze)
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
        "config": None if exists else "options" if exported is None else "file",
        "slots": width is not None,
    }
