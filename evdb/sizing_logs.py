"""Key traces from a user's own logs: an npy, npz or parquet column of keys, with optional
steps, read as a ``evdb.trace.Trace`` sampled as a ``KeyRecorder`` would have, for ``evdb size``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from evdb._types import Int64Array
from evdb.errors import InvalidArgumentError
from evdb.sizing_kernels import sample_threshold
from evdb.trace import (
    DEFAULT_MIN_KEYS,
    MAGIC,
    Trace,
    TraceHeader,
    config_digest,
    op_code,
    parse_rate,
    parse_seed,
    read_trace,
    salt_of,
)
from evdb.trace_sample import FULL, key_hashes, threshold_of

__all__ = ["open_trace", "read_key_log"]


def read_key_log(
    path: str | os.PathLike[str],
    *,
    column: str = "key",
    step_column: str | None = "step",
    rate: float = 1.0,
    seed: int = 0,
    batch_keys: int = 4096,
    op: str = "pull",
    min_keys: int = DEFAULT_MIN_KEYS,
) -> Trace:
    """A trace from a user's own log of keys: an ``.npy`` of keys, an ``.npz`` or a
    ``.parquet`` file (pyarrow) with a ``column`` of int keys and optionally a
    ``step_column`` of non-decreasing steps (one batch per step). Without steps, every
    ``batch_keys`` keys are one batch at the next step. Keys are sampled as a
    ``KeyRecorder(rate=rate, min_keys=min_keys)`` would have kept them: by key hash, at
    ``rate`` raised to keep at least ``min_keys`` distinct keys (fixed-size SHARDS,
    ``evdb.trace_sample``; 0: exactly ``rate``)."""
    p = Path(path)
    keys, steps = _load_log(p, column, step_column)
    if keys.ndim != 1 or not np.issubdtype(keys.dtype, np.integer):
        raise InvalidArgumentError(f"{column!r} in {str(p)!r} must be 1-d ints, got {keys.dtype}")
    keys = keys.astype(np.int64, copy=False)
    if isinstance(min_keys, bool) or not isinstance(min_keys, int) or min_keys < 0:
        raise InvalidArgumentError(f"min_keys must be an int >= 0, got {min_keys!r}")
    if isinstance(batch_keys, bool) or not isinstance(batch_keys, int) or batch_keys < 1:
        raise InvalidArgumentError(f"batch_keys must be an int >= 1, got {batch_keys!r}")
    if steps is None:
        steps = np.arange(keys.shape[0], dtype=np.int64) // batch_keys
    else:
        steps = np.asarray(steps).astype(np.int64, copy=False)
        if steps.shape != keys.shape:
            raise InvalidArgumentError(f"{step_column!r} and {column!r} differ in length")
        if steps.size and (np.diff(steps) < 0).any():
            first = int(np.flatnonzero(np.diff(steps) < 0)[0]) + 1
            raise InvalidArgumentError(
                f"{step_column!r} in {str(p)!r} must not decrease: row {first} has step "
                f"{int(steps[first])} after {int(steps[first - 1])} (sort the log by step)"
            )
    floor = sample_threshold(parse_rate(rate))
    hashes = key_hashes(keys, salt_of(parse_seed(seed))) if floor < FULL else None
    threshold = floor
    if hashes is not None and min_keys > 0:  # the threshold a recorder would have ended at
        smallest = np.unique(hashes)[:min_keys]
        threshold = threshold_of(smallest, min_keys, floor)
    header = TraceHeader(
        "",
        None,
        config_digest(None),
        rate if threshold == floor else threshold / FULL,
        seed,
        p.suffix.lstrip(".") or "log",
        min_keys=min_keys,
        floor_rate=rate,
    )
    starts = np.flatnonzero(np.diff(steps, prepend=steps[:1] - 1) != 0) if steps.size else steps
    seen = np.diff(np.append(starts, keys.shape[0]))
    batch_of = np.repeat(np.arange(starts.shape[0]), seen)
    code = op_code(op)
    # what the table would count: a pull's distinct keys per batch, a lookup's positions
    counted = seen if code == 1 else _distinct_per_batch(keys, batch_of, starts.shape[0])
    if hashes is not None and threshold < FULL:
        mask = hashes < np.uint64(threshold)
        kept_per = np.bincount(batch_of[mask], minlength=starts.shape[0])
        keys = keys[mask]
    else:
        kept_per = seen
    bounds = np.zeros(kept_per.shape[0] + 1, dtype=np.int64)
    np.cumsum(kept_per, out=bounds[1:])
    ops = np.full(kept_per.shape[0], code, dtype=np.uint8)
    return Trace(header, keys, bounds, ops, steps[starts], seen, counted.astype(np.int64))


def _distinct_per_batch(keys: Int64Array, batch_of: Int64Array, n_batches: int) -> Int64Array:
    """Distinct keys of each batch, (n_batches,) int64: one sort of (batch, key) pairs."""
    if keys.size == 0:
        return np.zeros(n_batches, dtype=np.int64)
    order = np.lexsort((keys, batch_of))
    k, b = keys[order], batch_of[order]
    first = np.ones(k.shape[0], dtype=bool)
    first[1:] = (k[1:] != k[:-1]) | (b[1:] != b[:-1])
    return np.bincount(b[first], minlength=n_batches).astype(np.int64)


def _load_log(
    p: Path, column: str, step_column: str | None
) -> tuple[np.ndarray, np.ndarray | None]:
    if not p.exists():
        raise FileNotFoundError(f"no key log at {str(p)!r}")
    suffix = p.suffix.lower()
    if suffix == ".npy":
        return np.load(p, allow_pickle=False), None
    if suffix == ".npz":
        with np.load(p, allow_pickle=False) as z:
            if column not in z.files:
                raise InvalidArgumentError(
                    f"column: {str(p)!r} has no array {column!r} (it has {z.files})"
                )
            steps = z[step_column] if step_column and step_column in z.files else None
            return z[column], steps
    if suffix in (".parquet", ".pq"):
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise InvalidArgumentError(
                "reading a parquet key log needs pyarrow: pip install 'evdb[parquet]'"
            ) from None
        names = pq.read_schema(p).names
        if column not in names:
            raise InvalidArgumentError(
                f"column: {str(p)!r} has no column {column!r} (it has {names})"
            )
        wanted = [column] + ([step_column] if step_column and step_column in names else [])
        t = pq.read_table(p, columns=wanted)
        keys = t.column(column).to_numpy()
        steps = t.column(step_column).to_numpy() if len(wanted) == 2 else None
        return keys, steps
    raise InvalidArgumentError(
        f"{str(p)!r}: a key log is an .npy, .npz or .parquet file (or an evdb trace)"
    )


def open_trace(
    path: str | os.PathLike[str], *, allow_incomplete: bool = False, **log_options: Any
) -> Trace:
    """An evdb trace file (by its magic bytes), or else a user's key log (``read_key_log``
    with ``log_options``)."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no trace at {str(p)!r}")
    with open(p, "rb") as f:
        magic = f.read(len(MAGIC))
    if magic == MAGIC:
        return read_trace(p, allow_incomplete=allow_incomplete)
    return read_key_log(p, **log_options)
