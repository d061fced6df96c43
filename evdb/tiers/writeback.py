"""Victims gathered straight into the bytes the disk tier writes.

The write-back path today reads a victim's fields out of the cache (``CacheTier.read``: six
gathers into a ``RecordBatch``) and the disk tier then interleaves them into packed records
(``RecordBatch.pack``: six strided field copies). ``gather_packed`` does both in one pass
(``kernels.cpu.pack.gather_records``): 1,600 rows of 532 bytes 150 -> 50 ns a row. It is
ready for a cache to call on its own columns (the tier owns them; bench/README, issue 32,
says what that hook buys a spilling step).
"""

from __future__ import annotations

import numpy as np

from evdb._types import Int64Array
from evdb.kernels.cpu import pack
from evdb.records import RecordBatch, record_dtype

__all__ = ["gather_packed", "pack_records"]

_FLOAT32 = "<f4"


def gather_packed(columns: RecordBatch, rows: Int64Array, value: str = _FLOAT32) -> np.ndarray:
    """The records of ``rows`` of ``columns`` as a (n,) structured array of
    ``record_dtype(dim, n_slots, value)``: the bytes ``columns.take(rows).pack(value)`` makes.

    ``columns`` are a cache's whole column arrays (or any batch), ``rows`` (n,) int64 indexes
    them. Float32 values go through one kernel pass; float16 and bfloat16 values, which round,
    through ``RecordBatch.pack``.
    """
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    dim, n_slots = columns.values.shape[1], columns.slots.shape[1]
    if value != _FLOAT32:
        return columns.take(rows).pack(value)
    out = np.empty(rows.shape[0], dtype=record_dtype(dim, n_slots))
    if rows.shape[0]:
        pack.gather_records(
            np.ascontiguousarray(columns.values, dtype=np.float32),
            np.ascontiguousarray(columns.slots, dtype=np.float32),
            np.ascontiguousarray(columns.freq, dtype=np.uint32),
            np.ascontiguousarray(columns.last_step, dtype=np.int64),
            np.ascontiguousarray(columns.version, dtype=np.uint64),
            np.ascontiguousarray(columns.flags, dtype=np.uint8),
            rows,
            out,
        )
    return out


def pack_records(records: RecordBatch, value: str = _FLOAT32) -> np.ndarray:
    """``records.pack(value)`` (the same bytes) in one kernel pass for float32 values."""
    return gather_packed(records, np.arange(len(records), dtype=np.int64), value)
