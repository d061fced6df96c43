"""A bounded, deterministic sample of a table's live rows, for the dashboard's distributions.

Each live row gets a priority from its key alone (splitmix64 of the key), and the sample is
the ``max_rows`` rows of lowest priority: a uniform sample of the rows that is the same on
every call, every worker and every process for the same table, kept in one streamed pass
(memory: the sample plus one chunk, whatever the table's size).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from evdb._types import Float32Array, Int64Array
from evdb.errors import InvalidArgumentError
from evdb.kernels.hashing import mix64_np

if TYPE_CHECKING:
    from evdb.table import Table

__all__ = ["RowSample", "sample_rows", "sample_steps"]

_CHUNK_ROWS = 16384  # as evdb.neighbors reads disk rows: memory stays small per chunk


@dataclass(frozen=True)
class RowSample:
    """Sampled rows, in priority order (any prefix is itself a uniform sample).

    keys (m,) int64, values (m, dim) float32, freq (m,) int64 (training pulls counted),
    last_step (m,) int64; ``step`` is the table's global step, ``total`` its live rows.
    """

    keys: Int64Array
    values: Float32Array
    freq: Int64Array
    last_step: Int64Array
    step: int
    total: int


def sample_steps(table: Table, max_rows: int) -> Iterator[RowSample | None]:
    """:func:`sample_rows` one chunk at a time: yields None after each chunk scanned (a
    server gives other work a turn there), then the sample."""
    if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
        raise InvalidArgumentError(f"max_rows must be an int >= 1, got {max_rows!r}")
    dim = table.dim
    prio = np.empty(0, dtype=np.uint64)
    keys = np.empty(0, dtype=np.int64)
    values = np.empty((0, dim), dtype=np.float32)
    freq = np.empty(0, dtype=np.int64)
    last = np.empty(0, dtype=np.int64)
    total = 0
    # each chunk read under the lock; writes between chunks do not stop a sample
    for k, records in table.records(_CHUNK_ROWS, live_only=True, strict=False):
        total += k.shape[0]
        prio = np.concatenate([prio, mix64_np(k.view(np.uint64))])
        keys = np.concatenate([keys, k])
        values = np.concatenate([values, records.values])
        freq = np.concatenate([freq, records.freq.astype(np.int64)])
        last = np.concatenate([last, records.last_step])
        if prio.shape[0] > max_rows:
            keep = np.argpartition(prio, max_rows - 1)[:max_rows]
            prio, keys, values = prio[keep], keys[keep], values[keep]
            freq, last = freq[keep], last[keep]
        yield None
    order = np.argsort(prio, kind="stable")
    yield RowSample(keys[order], values[order], freq[order], last[order], table.step, total)


def sample_rows(table: Table, max_rows: int = 10_000) -> RowSample:
    """Up to ``max_rows`` live rows chosen uniformly (by a hash of the key: the same rows on
    every call), with their frequency and last step."""
    for out in sample_steps(table, max_rows):
        if out is not None:
            return out
    raise AssertionError("sample_steps ends with the sample")  # pragma: no cover
