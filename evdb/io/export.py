"""Export tables' live rows to files other tools read, or to a read-only serving snapshot.

=====================  ====================================================================
format                 ``dest`` holds, besides ``MANIFEST.json``
=====================  ====================================================================
``serving``            an evdb database of the live rows (SGD: no slots; no TTL, no
                       admission) that ``evdb.open(dest, read_only=True)`` serves; with
                       ``dtype`` "int8" / "int4", ``<table>.evq`` frozen quantised rows
                       that ``evdb.quantized`` (and ``evdb serve``) serves
``npz``                ``<table>.npz``: ``keys`` (n,) int64, ``values`` (n, dim), with
                       ``include_slots`` ``slots`` (n, k) float32, and ``config`` (uint8:
                       the table's config as JSON), which ``evdb import`` restores
``safetensors``        ``<table>.safetensors``: the same tensors (``I64``, ``F32``/``F16``)
``parquet``            ``<table>.parquet``: ``key`` int64, ``value`` fixed_size_list[dim],
                       optional ``slots``; a row group per chunk
``word2vec(-binary)``  ``<table>.txt`` / ``.bin``: the tokens of a ``keep_strings`` table
=====================  ====================================================================

Only live rows are exported (not expired ones, even before ``compact()``), in scan order,
streamed: ``len(table)`` gives the row count up front, so headers go first and rows follow a
chunk at a time (memory: ``chunk_rows`` rows, whatever the table's size). One scan serves
all of a table's arrays: safetensors' are written at their known offsets; npz's keys and
slots (a zip takes one member at a time) are spooled to temporary files and copied in after
``values``, rather than scanning RocksDB once per member. ``dest`` is built under a temporary
sibling name and renamed into place once every file is checksummed into ``MANIFEST.json``
(``evdb.checkpoint.finish_dir``): a failure leaves no ``dest``; ``evdb.verify(dest)`` checks it.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from evdb import checkpoint as _checkpoint
from evdb.config import DiskConfig
from evdb.database import CHECKPOINTS, WORKING, Database
from evdb.database import open as open_database
from evdb.errors import (
    ConfigError,
    CorruptDataError,
    InvalidArgumentError,
    InvalidTypeError,
)
from evdb.io.export_quantized import QUANTIZED_DTYPES, SUFFIX, check_quantizable, write_quantized
from evdb.io.vectors import write_vectors
from evdb.optim import SGD

if TYPE_CHECKING:
    from evdb._types import Float32Array, Int64Array
    from evdb.table import Table

__all__ = ["EXPORT_FORMATS", "export"]

EXPORT_FORMATS = ("serving", "npz", "safetensors", "parquet", "word2vec", "word2vec-binary")
DTYPES = ("float32", "float16", "bfloat16", *QUANTIZED_DTYPES)
_WITH_SLOTS = ("npz", "safetensors", "parquet")
_SUFFIX = {"serving": "", "npz": ".npz", "safetensors": ".safetensors", "parquet": ".parquet"}
_SUFFIX |= {"word2vec": ".txt", "word2vec-binary": ".bin"}
_SAFETENSORS_DTYPE = {"<i8": "I64", "<f4": "F32", "<f2": "F16"}
_COPY_BYTES = 1 << 20

Progress = Callable[[int, int], object]
Chunk = tuple["Int64Array", "Float32Array", "Float32Array | None"]


def export(
    db_or_path: Database | str | os.PathLike[str],
    dest: str | os.PathLike[str],
    tables: Sequence[str] | None = None,
    format: str = "serving",
    dtype: str = "float32",
    include_slots: bool = False,
    *,
    chunk_rows: int = 65536,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Write the live rows of tables to the new directory dest, atomically and checksummed.

    Parameters
    ----------
    db_or_path : Database, or the path of one
        A path is opened read-only (no lock: its last flush) and closed again. The path of a
        sharded checkpoint or database (``evdb.distributed``) exports the shards merged.
    dest : path
        The directory to create; it must not exist.
    tables : list of str, optional
        The tables to export; all by default.
    format : str
        One of ``EXPORT_FORMATS`` (see the module's table).
    dtype : "float32" | "float16" | "bfloat16" | "int8" | "int4"
        Of the values; slots stay float32. float16 rounds, and values beyond its range become
        inf (counted in each table's ``float16_overflows``). word2vec files are float32;
        bfloat16, int8 and int4 are for ``format="serving"`` only. A serving snapshot of
        float16 or bfloat16 holds tables of that ``dtype`` (rounded to nearest even): its
        lookups read half the bytes, widened to float32 as they are read. int8 and int4 are
        row-wise quantised (an fp16 scale and bias per row, ``evdb.io.export_quantized``),
        served by ``evdb.quantized``; tables that keep strings are refused.
    include_slots : bool
        Also write the optimizer slots (npz, safetensors, parquet). A table whose optimizer
        keeps none gets (n, 0) arrays, and no parquet column (pyarrow has no empty lists).
    chunk_rows : int
        Rows read and written at a time: bounds the memory.
    progress : callable, optional
        ``progress(rows_done, rows_total)`` after each chunk, over all the tables.

    Returns
    -------
    dict
        The manifest, also in ``dest/MANIFEST.json``: ``kind`` ("export-<format>"),
        ``step``, ``dtype``, per table ``rows``, ``dim``, ``key_type`` and ``file`` (relative
        to dest), and the size and xxh3-128 of every file.

    Raises
    ------
    InvalidArgumentError, TableNotFoundError, ConfigError
        A bad argument (named, with its value), an existing dest, a missing table, or
        ``format="parquet"`` without pyarrow: before anything is written.
    CorruptDataError
        A word2vec export meets a key without a string, or the table changes meanwhile.

    Examples
    --------
    >>> import tempfile, numpy as np, evdb
    >>> from evdb.io.export import export
    >>> root = tempfile.mkdtemp()
    >>> with evdb.open(root + "/db") as db:
    ...     db.create_table("user", dim=2).upsert([7, 9], [[1, 2], [3, 4]])
    ...     manifest = export(db, root + "/out", format="npz")
    >>> manifest["tables"]["user"]
    {'rows': 2, 'dim': 2, 'key_type': 'int64', 'file': 'user.npz'}
    >>> with np.load(root + "/out/user.npz") as z:
    ...     z["keys"].tolist(), z["values"].tolist()
    ([7, 9], [[1.0, 2.0], [3.0, 4.0]])
    """
    _check_arguments(format, dtype, include_slots, chunk_rows, progress)
    if isinstance(db_or_path, str | os.PathLike) and (Path(db_or_path) / "sharding.json").is_file():
        from evdb.distributed import export as export_sharded  # it builds on this function

        return export_sharded(
            db_or_path,
            dest,
            tables=tables,
            format=format,
            dtype=dtype,
            include_slots=include_slots,
            chunk_rows=chunk_rows,
            progress=progress,
        )
    dest = Path(dest)
    if dest.exists() or dest.is_symlink():
        raise InvalidArgumentError(f"dest: {dest} already exists")
    if isinstance(db_or_path, Database):
        db = db_or_path
    elif isinstance(db_or_path, (str, os.PathLike)):
        db = open_database(db_or_path, read_only=True)
    else:
        raise InvalidTypeError(f"db_or_path must be a Database or a path, got {db_or_path!r}")
    try:
        selected = _select(db, tables, format)
        if dtype in QUANTIZED_DTYPES:
            check_quantizable(selected, dtype)
        entries = {t.name: _entry(t, format, dtype, include_slots) for t in selected}
        manifest: dict[str, Any] = {
            "format": _checkpoint.FORMAT,
            "kind": f"export-{format}",
            "created": time.time(),
            "step": db.step,
            "dtype": dtype,
            "tables": entries,
        }
        dest.parent.mkdir(parents=True, exist_ok=True)
        # locked while it is built: a later export or checkpoint beside it sweeps it if we die
        tmp, owner = _checkpoint.temp_dir_beside(dest)
        job = _Job(tmp, chunk_rows, sum(e["rows"] for e in entries.values()), progress)
        try:
            if dtype in QUANTIZED_DTYPES:
                for t in selected:
                    e = entries[t.name]
                    rows = job.chunks(t, e["rows"], False)
                    write_quantized(tmp / e["file"], t, e, db.step, rows, dtype)
            elif format == "serving":
                _write_serving(job, db.step, selected, entries, dtype)
            else:
                for t in selected:
                    _write_file(job, t, format, entries[t.name], db.step)
            _checkpoint.finish_dir(tmp, dest, manifest)
        except BaseException as e:
            shutil.rmtree(tmp, ignore_errors=True)
            error = _checkpoint.as_storage_error(e, f"dest: {dest}: export failed", dest)
            if error is None:
                raise
            raise error from e
        finally:
            os.close(owner)  # after the rename or the removal: a sweep never sees it unlocked
    finally:
        if db is not db_or_path:
            db.close()
    return manifest


def _check_arguments(
    format: Any, dtype: Any, include_slots: Any, chunk_rows: Any, progress: Any
) -> None:
    if format not in EXPORT_FORMATS:
        raise InvalidArgumentError(f"format must be one of {EXPORT_FORMATS}, got {format!r}")
    if dtype not in DTYPES:
        raise InvalidArgumentError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if dtype not in ("float32", "float16") and format != "serving":
        raise InvalidArgumentError(
            f"dtype={dtype!r} needs format='serving' (the {format} files hold float32 or "
            f"float16), got format={format!r}"
        )
    if dtype != "float32" and format.startswith("word2vec"):
        raise InvalidArgumentError(
            f"dtype must be 'float32' for format={format!r} (its files hold float32), got {dtype!r}"
        )
    if not isinstance(include_slots, bool):
        raise InvalidArgumentError(f"include_slots must be a bool, got {include_slots!r}")
    if include_slots and format not in _WITH_SLOTS:
        raise InvalidArgumentError(
            f"include_slots=True needs a format in {_WITH_SLOTS}, got format={format!r}"
        )
    if isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 1:
        raise InvalidArgumentError(f"chunk_rows must be an int >= 1, got {chunk_rows!r}")
    if progress is not None and not callable(progress):
        raise InvalidArgumentError(f"progress must be callable or None, got {progress!r}")
    if format == "parquet":
        _pyarrow()


def _select(db: Database, tables: Any, format: str) -> list[Table]:
    """The tables to export, checked: every name exists once, and each table suits format."""
    if tables is None:
        names = db.tables()
    else:
        if isinstance(tables, (str, bytes)) or not isinstance(tables, Sequence):
            raise InvalidArgumentError(f"tables must be a list of table names, got {tables!r}")
        names = list(tables)
        if not names:
            raise InvalidArgumentError("tables is empty; pass None to export every table")
        for i, name in enumerate(names):
            if name in names[:i]:
                raise InvalidArgumentError(f"tables[{i}]: {name!r} is listed twice")
    selected = [db.table(name) for name in names]  # TableNotFoundError names the first
    for t in selected:
        if format.startswith("word2vec") and not t.config.keep_strings:
            raise InvalidArgumentError(
                f"tables: format={format!r} writes tokens, so it needs tables created with "
                f"key_type='str', keep_strings=True; table {t.name!r} has key_type="
                f"{t.config.key_type!r}, keep_strings=False"
            )
    return selected


def _entry(t: Table, format: str, dtype: str, include_slots: bool) -> dict[str, Any]:
    """The table's manifest entry; the writers read the export's shape from it too."""
    entry: dict[str, Any] = {"rows": len(t), "dim": t.dim, "key_type": t.config.key_type}
    entry["file"] = t.name + (SUFFIX if dtype in QUANTIZED_DTYPES else _SUFFIX[format])
    if dtype in QUANTIZED_DTYPES:
        entry["dtype"] = dtype
    if include_slots:
        entry["slots"] = t.config.optimizer.n_slots(t.dim)
    if dtype == "float16":
        entry["float16_overflows"] = 0
    return entry


@dataclass
class _Job:
    """Where an export writes, its chunk size, and the rows done over all its tables."""

    tmp: Path
    chunk_rows: int
    total: int
    progress: Progress | None
    done: int = 0

    def chunks(self, t: Table, n: int, slots: bool) -> Iterator[Chunk]:
        """The live rows of t: (keys (m,) int64, values (m, dim) float32, slots (m, k)
        float32 or None), checked to add up to n (the count the headers were written with)."""
        if slots:  # items(), with the slots: the same scan and the same TTL filter
            scan: Iterator[Chunk] = (
                (keys, records.values, records.slots)
                for keys, records in t.records(self.chunk_rows, live_only=True)
            )
        else:
            scan = ((keys, values, None) for keys, values in t.items(self.chunk_rows))
        done = 0
        for chunk in scan:
            done += chunk[0].shape[0]
            if done > n:
                break
            yield chunk
            self.done += chunk[0].shape[0]
            if self.progress is not None:
                self.progress(self.done, self.total)
        if done != n:
            raise CorruptDataError(
                f"table {t.name!r}: len() said {n} live rows, the scan finds "
                f"{'more' if done > n else done}; was the table changed during the export?"
            )


def _write_file(job: _Job, t: Table, format: str, entry: dict[str, Any], step: int) -> None:
    rows = job.chunks(t, entry["rows"], "slots" in entry)
    path = job.tmp / entry["file"]
    if format == "npz":
        _write_npz(path, rows, entry, {"step": step, "config": t.config.to_dict()})
    elif format == "safetensors":
        _write_safetensors(path, rows, entry, step)
    elif format == "parquet":
        _write_parquet(path, rows, entry, step)
    else:
        tokens = ((_tokens(t, keys), values) for keys, values, _ in rows)
        write_vectors(path, format, tokens, rows=entry["rows"], dim=t.dim)


def _cast(values: Float32Array, entry: dict[str, Any]) -> np.ndarray:
    """values (C-contiguous) in the export's dtype, counting float16 overflows."""
    if "float16_overflows" not in entry:
        return np.ascontiguousarray(values, "<f4")
    with np.errstate(over="ignore"):  # counted instead
        out = np.ascontiguousarray(values, "<f2")
    entry["float16_overflows"] += int(np.count_nonzero(np.isinf(out)))
    return out


# -- npz ------------------------------------------------------------------------------------


def _npy_header(f: IO[bytes], descr: str, shape: list[int]) -> None:
    header = {"descr": descr, "fortran_order": False, "shape": tuple(shape)}
    np.lib.format.write_array_header_1_0(f, header)


def _write_npz(
    path: Path, rows: Iterator[Chunk], entry: dict[str, Any], config: dict[str, Any]
) -> None:
    """``values.npy`` streams straight into the zip (stored, zip64, as ``np.savez`` writes);
    keys and slots are spooled to anonymous temporary files and copied in after it;
    ``config.npy`` is the JSON of config (the step and the table's config) as uint8, so
    the file alone brings its table back (``evdb.io.importer``)."""
    n, dim = entry["rows"], entry["dim"]
    value_descr = "<f2" if "float16_overflows" in entry else "<f4"
    with (
        zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as zf,
        tempfile.TemporaryFile(dir=path.parent) as keys_file,
        tempfile.TemporaryFile(dir=path.parent) as slots_file,
    ):
        with zf.open("values.npy", "w", force_zip64=True) as f:
            _npy_header(f, value_descr, [n, dim])
            for keys, values, slots in rows:
                f.write(_cast(values, entry).data)
                keys_file.write(np.ascontiguousarray(keys, "<i8").data)
                if slots is not None:
                    slots_file.write(np.ascontiguousarray(slots, "<f4").data)
        members = [("keys", keys_file, "<i8", [n])]
        if "slots" in entry:
            members.append(("slots", slots_file, "<f4", [n, entry["slots"]]))
        for name, spool, descr, shape in members:
            spool.seek(0)
            with zf.open(f"{name}.npy", "w", force_zip64=True) as f:
                _npy_header(f, descr, shape)
                shutil.copyfileobj(spool, f, _COPY_BYTES)
        blob = np.frombuffer(json.dumps(config, sort_keys=True).encode(), np.uint8)
        with zf.open("config.npy", "w") as f:
            np.lib.format.write_array(f, blob, allow_pickle=False)


# -- safetensors ----------------------------------------------------------------------------


def _write_safetensors(path: Path, rows: Iterator[Chunk], entry: dict[str, Any], step: int) -> None:
    """The huggingface/safetensors layout: an 8-byte little-endian header length; a JSON
    header (per tensor dtype, shape, [begin, end) byte offsets into the data; ``__metadata__``
    str -> str) padded with spaces to a multiple of 8; then the tensors' little-endian bytes,
    back to back. The offsets follow from n, so each chunk's parts go to their places."""
    n, dim = entry["rows"], entry["dim"]
    value_descr = "<f2" if "float16_overflows" in entry else "<f4"
    tensors = [("keys", "<i8", [n]), ("values", value_descr, [n, dim])]
    if "slots" in entry:
        tensors.append(("slots", "<f4", [n, entry["slots"]]))
    meta = {"format": "evdb-export", "key_type": entry["key_type"], "step": str(step)}
    header: dict[str, Any] = {"__metadata__": meta}
    at = 0
    for name, descr, shape in tensors:
        end = at + int(np.prod(shape)) * np.dtype(descr).itemsize
        header[name] = {
            "dtype": _SAFETENSORS_DTYPE[descr],
            "shape": shape,
            "data_offsets": [at, end],
        }
        at = end
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    base = 8 + len(blob)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        f.truncate(base + at)  # the final size; the chunks fill it in
        done = 0
        for keys, values, slots in rows:
            parts = [np.ascontiguousarray(keys, "<i8"), _cast(values, entry)]
            if slots is not None:
                parts.append(np.ascontiguousarray(slots, "<f4"))
            for (name, _, shape), part in zip(tensors, parts, strict=True):
                row_bytes = part.itemsize * int(np.prod(shape[1:]))
                f.seek(base + header[name]["data_offsets"][0] + row_bytes * done)
                f.write(part.data)
            done += keys.shape[0]


# -- parquet --------------------------------------------------------------------------------


def _pyarrow() -> tuple[Any, Any]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError("format='parquet' needs pyarrow: pip install evdb[parquet]") from None
    return pa, pq


def _write_parquet(path: Path, rows: Iterator[Chunk], entry: dict[str, Any], step: int) -> None:
    """A row group per chunk; float32 columns are zero-copy views of the chunk's arrays."""
    pa, pq = _pyarrow()
    dim, n_slots = entry["dim"], entry.get("slots", 0)
    value_type = pa.float16() if "float16_overflows" in entry else pa.float32()
    fields = [
        pa.field("key", pa.int64(), nullable=False),
        pa.field("value", pa.list_(value_type, dim), nullable=False),
    ]
    if n_slots:  # pyarrow refuses zero-width lists (and crashes reading one back)
        fields.append(pa.field("slots", pa.list_(pa.float32(), n_slots), nullable=False))
    meta = {"format": "evdb-export", "key_type": entry["key_type"], "step": step}
    schema = pa.schema(fields, metadata={"evdb": json.dumps(meta)})
    with pq.ParquetWriter(path, schema) as writer:
        for keys, values, slots in rows:
            columns = [pa.array(keys), _fixed_lists(pa, _cast(values, entry), dim)]
            if n_slots and slots is not None:
                columns.append(_fixed_lists(pa, slots, n_slots))
            writer.write_table(pa.Table.from_arrays(columns, schema=schema))


def _fixed_lists(pa: Any, matrix: np.ndarray, width: int) -> Any:
    return pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(matrix).ravel()), width)


# -- word2vec -------------------------------------------------------------------------------


def _tokens(t: Table, keys: Int64Array) -> list[str]:
    tokens = t.strings(keys)
    if None in tokens:
        key = int(keys[tokens.index(None)])
        raise CorruptDataError(
            f"table {t.name!r}: key {key} has no string (was it written as a hashed int64 "
            "key?); a word2vec file needs a token for every row"
        )
    return [s for s in tokens if s is not None]


# -- serving --------------------------------------------------------------------------------


def _write_serving(
    job: _Job, step: int, selected: list[Table], entries: dict[str, dict[str, Any]], dtype: str
) -> None:
    """A new database of the live rows, flushed and closed; then only its checkpoint stays
    (read-only opens serve ``checkpoints/``): not the working copy, not the lock file."""
    tmp = job.tmp
    out = open_database(tmp)
    try:
        out.advance(step)  # rows get last_step = the source's step
        for t in selected:
            entry = entries[t.name]
            new = out.create_table(
                t.name,
                dim=t.dim,
                key_type=t.config.key_type,
                initializer=t.config.initializer,
                default_value=t.config.default_value,
                optimizer=SGD(),
                keep_strings=t.config.keep_strings,
                dram_rows=job.chunk_rows,
                dtype=dtype,  # type: ignore[arg-type]  # half: stored so, on disk as well
                disk=DiskConfig(dtype=dtype),  # type: ignore[arg-type]
            )
            for keys, values, _ in job.chunks(t, entry["rows"], False):
                if "float16_overflows" in entry:
                    _cast(values, entry)  # only counts: the disk tier rounds them
                if not t.config.keep_strings:
                    new.upsert(keys, values)
                    continue
                strings = t.strings(keys)  # upserted as str, so the new table keeps them
                known = np.array([s is not None for s in strings], dtype=bool)
                if known.any():
                    new.upsert([s for s in strings if s is not None], values[known])
                if not known.all():
                    new.upsert(keys[~known], values[~known])
        out.close()
    finally:
        out.close(flush=False)  # after a failure (a full disk): tmp goes, so none of it stays
    (tmp / "LOCK").unlink()
    shutil.rmtree(tmp / WORKING)
    (checkpoint,) = (tmp / CHECKPOINTS).iterdir()
    for entry in entries.values():
        entry["file"] = checkpoint.relative_to(tmp).as_posix()
