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
at dim 64: 68; int4: 36), and 4-8 bytes of directory: 80 and 48 bytes at dim 64.
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
from evdb.kernels import backend
from evdb.keys import normalize_keys
from evdb.manifest import read_manifest
from evdb.manifest import verify as verify_manifest
from evdb.neighbors import neighbors as _neighbors
from evdb.records import RecordBatch
from evdb.tiers.frozen import QUANTIZED_BITS, FrozenRows
from evdb.ttl import min_live_step

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
_kernels = backend("cpu")
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
    last_step : (n,) int64, optional
        Each row's ``last_step``, in the file's order: with the config's ``ttl_steps``, a row
        older than the TTL at the step read reads as missing (a follower's quantised full,
        ``evdb.io.export_quantized.quantize_full``). Without it every row is live.

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

    def __init__(
        self,
        name: str,
        rows: FrozenRows,
        config: TableConfig,
        step: int,
        last_step: Int64Array | None = None,
    ) -> None:
        if rows.dim != config.dim:
            raise CorruptDataError(f"{rows.path}: rows of dim {rows.dim}, config of {config.dim}")
        if last_step is not None and last_step.shape != (rows.n_rows,):
            raise CorruptDataError(f"{rows.path}: {rows.n_rows} rows, {last_step.shape} steps")
        # rows expire only with both a TTL and their steps
        ttl = config.ttl_steps
        self._last_step = last_step if ttl is not None and rows.n_rows else None
        self._live_counts: dict[int, int] = {}  # step -> rows live then
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

    def _min_live(self, step: int | None) -> int | None:
        """The oldest ``last_step`` live at step (None: every row is live)."""
        if self._last_step is None:
            return None
        return min_live_step(self._step if step is None else int(step), self._config.ttl_steps)

    def _expire(self, rows: Int64Array, min_live: int | None) -> int:
        """Set to -1 the rows (a find's: a row or -1) expired at min_live; returns how many."""
        if min_live is None or self._last_step is None:
            return 0
        expired = (rows >= 0) & (self._last_step[rows.clip(min=0)] < min_live)
        rows[expired] = -1
        return int(np.count_nonzero(expired))

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
        it is read (``promote`` changes nothing: every row is mapped; ``step`` matters only
        to rows with a TTL and their steps, see ``last_step``)."""
        k = self._keys(keys)
        n = k.shape[0]
        bags, shape = parse_lookup(n, self.dim, offsets, weights, combiner, max_norm, out, found)
        if out is None:
            out = np.empty(shape, dtype=np.float32)
        min_live = self._min_live(step)
        if bags is not None and min_live is not None:  # rows may expire: the unfused way
            values = self.lookup(k, found=found, step=step)
            index = np.arange(n, dtype=np.int64)
            _kernels.gather_combine(
                values, index, bags.bounds, bags.weights, bags.combiner, bags.max_norm, out
            )
            return out
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
            missing += self._expire(rows, min_live)
            if missing:
                miss = rows < 0
                out[miss] = self.defaults(k[miss])
            if found is not None:
                np.greater_equal(rows, 0, out=found)
        self._found += n - missing
        self._not_found += missing
        return out

    def contains(self, keys: Any, *, step: int | None = None) -> BoolArray:
        """(n,) bool: whether each key has a (live) row."""
        rows = self._rows.find(self._keys(keys))
        self._expire(rows, self._min_live(step))
        found: BoolArray = rows >= 0
        return found

    def count(self, *, step: int | None = None) -> int:
        """Rows (live at step)."""
        min_live = self._min_live(step)
        if min_live is None or self._last_step is None:
            return self._rows.n_rows
        n = self._live_counts.get(min_live)
        if n is None:  # one pass over the steps per step asked (a view asks at its own)
            n = self._live_counts[min_live] = int(np.count_nonzero(self._last_step >= min_live))
        return n

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
        """``(keys, RecordBatch)`` chunks of every row (dequantised; only those live at
        ``step`` if ``live_only``), in the file's order (by the keys' hash). A serving
        snapshot keeps values only: slots (m, 0), ``freq`` and ``version`` 0, ``last_step``
        the row's (see ``last_step``), else the snapshot's step."""
        _check_chunk_rows(chunk_rows)
        for keys, values, last in self._chunks(chunk_rows, step if live_only else None):
            m = keys.shape[0]
            yield (
                keys,
                RecordBatch(
                    values=values,
                    slots=np.zeros((m, 0), np.float32),
                    freq=np.zeros(m, np.uint32),
                    last_step=last,
                    version=np.zeros(m, np.uint64),
                ),
            )

    def items(
        self, chunk_rows: int = 65536, *, step: int | None = None
    ) -> Iterator[tuple[Int64Array, Float32Array]]:
        """``(keys, values)`` chunks of every (live) row, dequantised."""
        _check_chunk_rows(chunk_rows)
        for keys, values, _ in self._chunks(chunk_rows, step, live=True):
            yield keys, values

    def live_values(self, *, step: int | None = None) -> Iterator[tuple[Float32Array, Int64Array]]:
        """``(values, keys)`` chunks of every (live) row, dequantised (what neighbours scan)."""
        for keys, values, _ in self._chunks(65536, step, live=True):
            yield values, keys

    def _chunks(
        self, chunk_rows: int, step: int | None, *, live: bool = False
    ) -> Iterator[tuple[Int64Array, Float32Array, Int64Array]]:
        """(keys, values, last_step) chunks in the file's order; with ``live`` (or a step
        given), only the rows live at the step."""
        min_live = self._min_live(step) if live or step is not None else None
        for a, (keys, values) in zip(
            range(0, self._rows.n_rows, chunk_rows), self._rows.chunks(chunk_rows), strict=True
        ):
            if self._last_step is None:
                yield keys, values, np.full(keys.shape[0], self._step, np.int64)
                continue
            last = np.array(self._last_step[a : a + keys.shape[0]], np.int64)
            if min_live is None:
                yield keys, values, last
                continue
            keep = last >= min_live
            if keep.any():
                yield keys[keep], values[keep], last[keep]

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
                # the key, and a TTL'd row's step (a follower's full)
                "metadata": (8.0 + 8.0 * (self._last_step is not None)) if n else 0.0,
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

    @classmethod
    def of_tables(
        cls, path: Path, step: int, dtype: str, tables: dict[str, QuantizedTable]
    ) -> QuantizedSnapshot:
        """Tables quantised already (a follower's full, ``export_quantized.quantize_full``),
        as one snapshot; ``path`` is their folder. Closing it closes them."""
        snap = cls.__new__(cls)
        snap.path, snap.manifest, snap.dtype, snap.step = Path(path), {}, dtype, step
        snap._tables = dict(tables)
        return snap

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
