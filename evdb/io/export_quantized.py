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
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from evdb.config import TableConfig
from evdb.errors import InvalidArgumentError
from evdb.kernels import backend
from evdb.optim import SGD
from evdb.quantized import QUANTIZED_DTYPES, SUFFIX
from evdb.tiers.frozen import QUANTIZED_BITS, row_stride, write_frozen

if TYPE_CHECKING:
    from evdb._types import Float32Array, Int64Array
    from evdb.table import Table

__all__ = ["QUANTIZED_DTYPES", "SUFFIX", "check_quantizable", "write_quantized"]

_kernels = backend("cpu")


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
