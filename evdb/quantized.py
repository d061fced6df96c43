"""Quantised serving snapshots: ``evdb.export(..., format="serving", dtype="int8" | "int4")``
writes one frozen file per table (``evdb.tiers.frozen``: keys ordered by hash, a bucket
directory, and rows of int8 or int4 codes with an fp16 scale and bias each), and this
module serves them. A :class:`QuantizedTable` is the read half of a table
(``evdb.view.ReadableTable``), so ``evdb serve`` answers from it as from a ``Table``::

    dest/
      MANIFEST.json        kind "export-serving", dtype "int8"; per table rows, dim,
                           key_type, file, bytes_per_row; every file's xxh3-128
      user.evq             frozen rows of table "user"

    snap = evdb.quantized.open_quantized(dest)    rows memory-mapped, read in place
    snap.table("user").lookup([7, 9])             (2, dim) float32, dequantised as read

A lookup finds each key through the directory and dequantises its row into the float32
answer in one kernel (bags: one fused find + dequantise + combine); a key without a row
reads its default value, as it does in a float32 serving export (its initializer's value,
or the table's constant). A row costs its key (8 bytes), its codes and scale and bias (int8
at dim 64: 68; int4: 36), and about a byte of directory: 77 and 45 bytes at dim 64.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from evdb._types import BoolArray, Float32Array, Int64Array
from evdb.bags import parse_lookup
from evdb.config import TableConfig
from evdb.errors import CorruptDataError, InvalidArgumentError, TableNotFoundError
from evdb.keys import normalize_keys
from evdb.manifest import read_manifest
from evdb.manifest import verify as verify_manifest
from evdb.neighbors import neighbors as _neighbors
from evdb.records import RecordBatch
from evdb.tiers.frozen import QUANTIZED_BITS, FrozenRows

if TYPE_CHECKING:
    from evdb.view import ReadableTable

__all__ = [
    "QUANTIZED_DTYPES",
    "QuantizedSnapshot",
    "QuantizedTable",
    "info",
    "is_quantized",
    "open_quantized",
]

QUANTIZED_DTYPES = tuple(QUANTIZED_BITS)  # ("int8", "int4")
SUFFIX = ".evq"


def is_quantized(path: str | os.PathLike[str]) -> bool:
    """Whether path is a quantised serving export (its manifest says so)."""
    root = Path(path)
    if not (root / "MANIFEST.json").is_file():
        return False
    manifest = read_manifest(root)
    return (
        manifest is not None
        and manifest["kind"] == "export-serving"
        and manifest.get("dtype") in QUANTIZED_DTYPES
    )


class QuantizedTable:
    """One table of a quantised serving snapshot: its frozen rows, read-only.

    Parameters
    ----------
    name : str
    rows : FrozenRows
        The table's file, opened.
    config : TableConfig
        The serving table's configuration (dim, key_type, initializer, default_value; SGD,
        no TTL, no admission): what a float32 serving export of the table would have.
    step : int
        The step the snapshot was exported at.

    Examples
    --------
    >>> import tempfile, numpy as np, evdb
    >>> from evdb.quantized import open_quantized
    >>> root = tempfile.mkdtemp()
    >>> with evdb.open(root + "/db") as db:
    ...     db.create_table("w", dim=4).upsert([1, 2], [[0, 1, 2, 3], [-1, 0, 1, 2]])
    ...     _ = evdb.export(db, root + "/q", dtype="int8")
    >>> with open_quantized(root + "/q") as snap:
    ...     t = snap.table("w")
    ...     t.lookup([1, 2]).round(2).tolist(), t.contains([2, 3]).tolist(), t.dtype
    ([[0.0, 1.0, 2.0, 3.0], [-1.0, 0.0, 1.0, 2.0]], [True, False], 'int8')
    """

    def __init__(self, name: str, rows: FrozenRows, config: TableConfig, step: int) -> None:
        if rows.dim != config.dim:
            raise CorruptDataError(f"{rows.path}: rows of dim {rows.dim}, config of {config.dim}")
        self._name = name
        self._rows = rows
        self._config = config
        self._step = step
        dv = config.default_value
        init = config.initializer.kernel_params() if dv == "init" else (0, 0, float(dv), 0.0)
        self._default_params = init
        self._found = 0  # keys found and not found by lookups (counted without a lock:
        self._not_found = 0  # ``x += n`` on an int attribute is one GIL-held step)

    # -- what the table is ----------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._name

    @property
    def dim(self) -> int:
        return self._config.dim

    @property
    def config(self) -> TableConfig:
        """The serving table's configuration (its ``dtype`` says float32: the rows' own
        dtype is :attr:`dtype`)."""
        return self._config

    @property
    def dtype(self) -> str:
        """How the rows are stored: "int8" or "int4"."""
        return self._rows.dtype

    @property
    def step(self) -> int:
        return self._step

    @property
    def keeps_strings(self) -> bool:
        return False

    @property
    def nbytes(self) -> int:
        """Bytes of the table's file (keys, directory, rows, header), all memory-mapped."""
        return self._rows.nbytes

    def __repr__(self) -> str:
        return f"QuantizedTable({self._name!r}, dim={self.dim}, dtype={self.dtype!r})"

    def _keys(self, keys: Any) -> Int64Array:
        return normalize_keys(keys, self._config.key_type)

    def defaults(self, keys: Int64Array) -> Float32Array:
        """The value (n, dim) float32 keys without a row read."""
        dv = self._config.default_value
        if dv == "init":
            return self._config.initializer.values(keys, self.dim)
        return np.full((keys.shape[0], self.dim), dv, dtype=np.float32)

    # -- reads ----------------------------------------------------------------------------
    def lookup(
        self,
        keys: Any,
        offsets: Any = None,
        weights: Any = None,
        combiner: str | None = None,
        max_norm: float | None = None,
        *,
        out: Float32Array | None = None,
        promote: bool = False,
        found: BoolArray | None = None,
        step: int | None = None,
    ) -> Float32Array:
        """``Table.lookup``: the same arguments, checks and answer, each row dequantised as
        it is read (``promote`` and ``step`` change nothing: every row is mapped, and a
        serving snapshot has no TTL)."""
        k = self._keys(keys)
        n = k.shape[0]
        bags, shape = parse_lookup(n, self.dim, offsets, weights, combiner, max_norm, out, found)
        if out is None:
            out = np.empty(shape, dtype=np.float32)
        if bags is not None:
            missing = self._rows.lookup_bags(
                k, bags.bounds, bags.weights, bags.combiner, bags.max_norm,
                self._default_params, out,
            )  # fmt: skip
            if found is not None:
                np.greater_equal(self._rows.find(k), 0, out=found)
        else:
            rows = np.empty(n, np.int64)
            missing = self._rows.lookup(k, out, rows)
            if missing:
                miss = rows < 0
                out[miss] = self.defaults(k[miss])
            if found is not None:
                np.greater_equal(rows, 0, out=found)
        self._found += n - missing
        self._not_found += missing
        return out

    def contains(self, keys: Any, *, step: int | None = None) -> BoolArray:
        """(n,) bool: whether each key has a row."""
        found: BoolArray = self._rows.find(self._keys(keys)) >= 0
        return found

    def count(self, *, step: int | None = None) -> int:
        return self._rows.n_rows

    def __len__(self) -> int:
        return self._rows.n_rows

    def records(
        self,
        chunk_rows: int = 65536,
        *,
        live_only: bool = False,
        strict: bool = True,
        step: int | None = None,
    ) -> Iterator[tuple[Int64Array, RecordBatch]]:
        """``(keys, RecordBatch)`` chunks of every row (dequantised), in the file's order
        (by the keys' hash). A serving snapshot keeps values only: slots (m, 0), ``freq``
        and ``version`` 0, ``last_step`` the snapshot's step."""
        _check_chunk_rows(chunk_rows)
        for keys, values in self._rows.chunks(chunk_rows):
            m = keys.shape[0]
            yield (
                keys,
                RecordBatch(
                    values=values,
                    slots=np.zeros((m, 0), np.float32),
                    freq=np.zeros(m, np.uint32),
                    last_step=np.full(m, self._step, np.int64),
                    version=np.zeros(m, np.uint64),
                ),
            )

    def items(
        self, chunk_rows: int = 65536, *, step: int | None = None
    ) -> Iterator[tuple[Int64Array, Float32Array]]:
        """``(keys, values)`` chunks of every row, dequantised."""
        _check_chunk_rows(chunk_rows)
        yield from self._rows.chunks(chunk_rows)

    def live_values(self, *, step: int | None = None) -> Iterator[tuple[Float32Array, Int64Array]]:
        """``(values, keys)`` chunks of every row, dequantised (what neighbours scan)."""
        for keys, values in self._rows.chunks(65536):
            yield values, keys

    def neighbors(
        self,
        query: Any,
        k: int = 10,
        metric: str = "cosine",
        *,
        as_strings: bool = False,
        step: int | None = None,
    ) -> tuple[Any, Float32Array]:
        """``Table.neighbors`` over the dequantised rows."""
        # evdb.neighbors reads lookup, live_values, strings and config: all here
        return _neighbors(self, query, k, metric, as_strings)  # type: ignore[arg-type]

    def strings(self, keys: Any) -> list[str | None]:
        raise InvalidArgumentError(
            f"table {self._name!r} does not keep its strings (a quantised serving export "
            "keeps none)"
        )

    def stats(self) -> dict[str, Any]:
        """Counts, in ``Table.stats``' shape: one tier, "dram" (the mapped file), with its
        dtype and bytes a row by component."""
        n, rows = self._rows.n_rows, self._rows
        per = max(n, 1)
        stride = rows.stride
        index = rows.nbytes - n * (8 + stride)  # the directory, the header and the padding
        dram = {
            "rows": n,
            "capacity": n,
            "bytes": rows.nbytes,
            "bytes_per_row": rows.nbytes / per,
            "bytes_per_row_by_component": {
                "values": float(stride) if n else 0.0,
                "slots": 0.0,
                "metadata": 8.0 if n else 0.0,  # the key
                "index": index / per,
            },
            "dtype": rows.dtype,
            "device": "cpu",
            "evictions": 0,
            "promotions": 0,
            "hits": self._found,
            "misses": self._not_found,
            "lookup_hits": self._found,
            "lookup_misses": self._not_found,
            "pull_hits": 0,
            "pull_misses": 0,
        }
        return {
            "name": self._name,
            "dim": self.dim,
            "dtype": rows.dtype,
            "rows": n,
            "step": self._step,
            "tiers": {"dram": dram},
            "reads": {"lookup": {"dram": self._found, "not_found": self._not_found}},
        }

    def close(self) -> None:
        self._rows.close()


def _check_chunk_rows(chunk_rows: Any) -> None:
    if isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 1:
        raise InvalidArgumentError(f"chunk_rows must be an int >= 1, got {chunk_rows!r}")


class QuantizedSnapshot:
    """A quantised serving export, opened: its step and tables (what ``evdb serve`` serves).

    Parameters
    ----------
    path : path
        The export's directory.
    verify : bool
        Check every file against the manifest first (size and xxh3-128); without it, each
        table's file is still checked for its size, header and directory.

    Raises
    ------
    CorruptDataError
        Naming the damaged file: not listed, resized, damaged, truncated, or not a
        quantised serving export at all.
    """

    def __init__(self, path: str | os.PathLike[str], *, verify: bool = True) -> None:
        self.path = Path(path)
        manifest = verify_manifest(self.path) if verify else read_manifest(self.path)
        if manifest is None or not is_quantized(self.path):
            raise CorruptDataError(f"{self.path}: not a quantised (int8/int4) serving export")
        self.manifest: dict[str, Any] = manifest
        self.dtype: str = manifest["dtype"]
        self.step: int = int(manifest["step"])
        self._tables: dict[str, QuantizedTable] = {}
        try:
            for name, entry in sorted(manifest["tables"].items()):
                rows = FrozenRows(self.path / entry["file"], verify=False)  # checked above
                meta = rows.meta
                if meta.get("table") != name or rows.dtype != self.dtype:
                    raise CorruptDataError(
                        f"{rows.path}: holds table {meta.get('table')!r} of dtype "
                        f"{rows.dtype!r}; {self.path / 'MANIFEST.json'} lists {name!r}, "
                        f"{self.dtype!r}"
                    )
                config = TableConfig.from_dict(meta["config"])
                self._tables[name] = QuantizedTable(name, rows, config, self.step)
        except BaseException:
            self.close()
            raise

    def tables(self) -> list[str]:
        return list(self._tables)

    def table(self, name: str) -> QuantizedTable:
        try:
            return self._tables[name]
        except KeyError:
            raise TableNotFoundError(
                f"table {name!r} is not in {self.path} (it has {sorted(self._tables)})"
            ) from None

    def close(self) -> None:
        for t in self._tables.values():
            t.close()

    def __enter__(self) -> QuantizedSnapshot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_quantized(path: str | os.PathLike[str], *, verify: bool = True) -> QuantizedSnapshot:
    """Open a quantised serving export read-only (see :class:`QuantizedSnapshot`)."""
    return QuantizedSnapshot(path, verify=verify)


def info(path: str | os.PathLike[str]) -> dict[str, Any]:
    """``evdb.offline.info`` of a quantised serving export (the same shape): its step, and
    each table's dim, key_type, config, rows and ``stats()`` (whose ``dtype`` and
    ``tiers.dram.bytes_per_row`` say what a row costs served). Every file is verified."""
    with open_quantized(path) as snap:
        tables = {
            name: {
                "dim": t.dim,
                "key_type": t.config.key_type,
                "config": t.config.to_dict(),
                "rows": len(t),
                "stats": t.stats(),
            }
            for name in snap.tables()
            for t in [snap.table(name)]
        }
        checkpoint = {"kind": snap.manifest["kind"], "created": snap.manifest.get("created")}
        return {
            "path": str(snap.path),
            "step": snap.step,
            "checkpoint": checkpoint,
            "tables": tables,
        }


if TYPE_CHECKING:  # mypy checks that a quantised table satisfies the read protocol

    def _quantized_reads(t: QuantizedTable) -> ReadableTable:
        return t
