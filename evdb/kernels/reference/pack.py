"""Reference of ``cpu/pack.py``: cached rows gathered straight into packed records."""

from __future__ import annotations

import numpy as np

__all__ = ["gather_records"]


def gather_records(
    values: np.ndarray,
    slots: np.ndarray,
    freq: np.ndarray,
    last_step: np.ndarray,
    version: np.ndarray,
    flags: np.ndarray,
    rows: np.ndarray,
    out: np.ndarray,
) -> None:
    """out[i] = the record of row rows[i] of the columns, in the canonical packed layout.

    values (cap, dim) float32, slots (cap, n_slots) float32, freq (cap,) uint32, last_step
    (cap,) int64, version (cap,) uint64, flags (cap,) uint8 (a cache tier's columns), rows (n,)
    int64, out (n,) structured array of ``evdb.records.record_dtype(dim, n_slots)`` (float32
    values): the bytes ``RecordBatch.pack`` writes for the same rows.
    """
    out["value"] = values[rows]
    out["slots"] = slots[rows]
    out["freq"] = freq[rows]
    out["last_step"] = last_step[rows]
    out["version"] = version[rows]
    out["flags"] = flags[rows]
