"""The int8 / int4 serving export (``evdb.export(..., format="serving", dtype="int8")``):
each table's live rows quantised row-wise (``quantize_rows``: an fp16 scale and bias per row
from the row's min and max, codes rounded to nearest) into one frozen file
(``evdb.tiers.frozen``) that ``evdb.quantized`` serves.

The scan is streamed: each chunk is quantised as it comes and its codes spooled to a
temporary file beside the output, keeping only the keys (8 bytes a row) in memory; the
file is then written in the order of the keys' hash, a chunk of the spool at a time.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from evdb.config import TableConfig
from evdb.errors import InvalidArgumentError
from evdb.kernels import backend
from evdb.optim import SGD
from evdb.quantized import QUANTIZED_DTYPES, SUFFIX, QuantizedSnapshot, QuantizedTable
from evdb.tiers.frozen import QUANTIZED_BITS, FrozenRows, file_order, row_stride, write_frozen

if TYPE_CHECKING:
    from evdb._types import Float32Array, Int64Array
    from evdb.database import Database
    from evdb.table import Table

__all__ = ["QUANTIZED_DTYPES", "SUFFIX", "check_quantizable", "quantize_full", "write_quantized"]

_kernels = backend("cpu")
_CHUNK_ROWS = 65536  # rows quantised at a time


def check_quantizable(tables: Sequence[Table], dtype: str) -> None:
    """Refuse, before anything is written, a table a quantised export cannot hold: one
    that keeps its keys' strings (the frozen file holds int64 keys only)."""
    for t in tables:
        if t.config.keep_strings:
            raise InvalidArgumentError(
                f"dtype={dtype!r}: table {t.name!r} keeps its strings (keep_strings=True), which "
                "a quantised serving export does not hold; export it with dtype 'float32', "
                "'float16' or 'bfloat16', or leave it out (tables=)"
            )


def serving_config(t: Table) -> TableConfig:
    """What a serving export's table keeps of t's configuration: the default values."""
    c = t.config
    return TableConfig(
        dim=c.dim,
        key_type=c.key_type,
        initializer=c.initializer,
        default_value=c.default_value,
        optimizer=SGD(),
        disk=None,
    )


def write_quantized(
    path: Path,
    t: Table,
    entry: dict[str, Any],
    step: int,
    chunks: Iterator[tuple[Int64Array, Float32Array, Any]],
    dtype: str,
) -> None:
    """Write t's live rows (``chunks``: the export's scan, adding up to ``entry["rows"]``)
    quantised to ``dtype`` into the frozen file ``path``; adds ``bytes`` and
    ``bytes_per_row`` (of the file) to entry."""
    n, dim, bits = entry["rows"], t.dim, QUANTIZED_BITS[dtype]
    stride = row_stride(dim, dtype)
    keys = np.empty(n, np.int64)
    with tempfile.TemporaryFile(dir=path.parent) as spool:
        done = 0
        for chunk_keys, values, _ in chunks:
            m = chunk_keys.shape[0]
            codes = np.empty((m, stride), np.uint8)
            try:
                _kernels.quantize_rows(np.ascontiguousarray(values, np.float32), bits, codes)
            except InvalidArgumentError as e:  # "values: row r ...": name the table and key
                raise InvalidArgumentError(
                    f"table {t.name!r}: cannot quantise to {dtype}: {_name_key(e, chunk_keys)}"
                ) from None
            keys[done : done + m] = chunk_keys
            spool.write(codes.data)
            done += m
        spool.flush()
        rows = (
            np.memmap(spool, np.uint8, "r", shape=(n, stride))
            if n
            else np.empty((0, stride), np.uint8)
        )
        meta = {"table": t.name, "step": step, "config": serving_config(t).to_dict()}
        size = write_frozen(path, keys, rows, dim=dim, dtype=dtype, meta=meta)
        del rows
    entry["bytes"] = size
    entry["bytes_per_row"] = size / max(n, 1)


def _name_key(error: InvalidArgumentError, keys: Int64Array) -> str:
    """The kernel's message with its row number replaced by the row's key."""
    text = str(error)
    words = text.split()
    if len(words) > 2 and words[0] == "values:" and words[1] == "row" and words[2].isdigit():
        key = int(keys[int(words[2])])
        return f"key {key}" + text[len(f"values: row {words[2]}") :]
    return text


def quantize_full(db: Database, dest: Path, dtype: str) -> QuantizedSnapshot:
    """A full publication's tables (``db``, opened read-only) quantised to ``dtype`` into
    frozen files in ``dest`` (a new folder), served as one snapshot: what a follower serving
    quantised holds in place of the float32 full (``evdb serve ROOT --follow --dtype int8``).

    Each table's rows live at the full's step are quantised as an export quantises them (the
    same kernel, row-wise), so a row reads as that row of ``evdb.export(..., dtype=dtype)``
    of the trainer's database; a table with ``ttl_steps`` also keeps each row's
    ``last_step`` (8 bytes a row, ``dest/<i>.steps``), so its rows expire at the step a view
    reads at, as the trainer's do. No float32 copy of a table is held: one chunk at a time.
    """
    if dtype not in QUANTIZED_DTYPES:
        raise InvalidArgumentError(f"dtype must be one of {QUANTIZED_DTYPES}, got {dtype!r}")
    dest.mkdir(parents=True)
    tables: dict[str, QuantizedTable] = {}
    try:
        for i, name in enumerate(sorted(db.tables())):
            t = db.table(name)
            config = replace(serving_config(t), ttl_steps=t.config.ttl_steps)
            n = t.count()
            keys = np.empty(n, np.int64)
            steps = np.empty(n, np.int64)
            done = 0

            def chunks(
                t: Table = t, keys: Int64Array = keys, steps: Int64Array = steps
            ) -> Iterator[tuple[Int64Array, Float32Array, Any]]:
                nonlocal done
                for chunk_keys, records in t.records(_CHUNK_ROWS, live_only=True):
                    m = chunk_keys.shape[0]
                    keys[done : done + m] = chunk_keys
                    steps[done : done + m] = records.last_step
                    done += m
                    yield chunk_keys, records.values, None

            path = dest / f"{i}{SUFFIX}"
            entry = {"rows": n}
            write_quantized(path, t, entry, db.step, chunks(), dtype)
            last_step = None
            if config.ttl_steps is not None and n:  # in the file's order (by the keys' hash)
                steps[file_order(keys)].tofile(dest / f"{i}.steps")
                last_step = np.fromfile(dest / f"{i}.steps", np.int64)
            rows = FrozenRows(path, verify=False)  # just written
            tables[name] = QuantizedTable(name, rows, config, db.step, last_step)
    except BaseException:
        for q in tables.values():
            q.close()
        raise
    return QuantizedSnapshot.of_tables(dest, db.step, dtype, tables)
