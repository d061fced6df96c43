"""Numba version of ``evdb.kernels.reference.pack``: the same bytes, in one pass.

Gathering the columns (six fancy-index copies) and then interleaving them into records
(``RecordBatch.pack``, six strided field copies) reads and writes each byte of a victim three
times; this kernel writes each record once, field after field, from the rows in place: 1,600
rows of 532 bytes (dim 64, Adagrad) 150 -> 50 ns a row on this project's machine.

The one kernel without an explicit signature: its output's numba type is a record of the
table's dim and slot count, so numba compiles (and caches on disk) one version per record
shape met, on its first call with that shape.
"""

from __future__ import annotations

from typing import Any

from numba import njit

from evdb.kernels.cpu._common import OPTS

__all__ = ["gather_records"]


@njit(**OPTS)
def _gather_records(values, slots, freq, last_step, version, flags, rows, out):  # type: ignore[no-untyped-def]
    for i in range(rows.shape[0]):
        r = rows[i]
        rec = out[i]
        value = rec.value
        for j in range(values.shape[1]):
            value[j] = values[r, j]
        slot = rec.slots
        for j in range(slots.shape[1]):
            slot[j] = slots[r, j]
        rec.freq = freq[r]
        rec.last_step = last_step[r]
        rec.version = version[r]
        rec.flags = flags[r]


def gather_records(*args: Any) -> None:
    """See ``evdb.kernels.reference.pack.gather_records`` (same arguments, same bytes)."""
    _gather_records(*args)
