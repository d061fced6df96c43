"""Reference row bookkeeping of a pull and a push: the metadata stamps of the rows a batch
touches, and the unpinning of the previous batch's rows.

``rows`` (u,) int64 are the distinct rows of a batch's distinct keys, -1 where a key has no
row; the column arrays are the cache tier's (one entry per slab row), changed in place.
"""

from __future__ import annotations

import numpy as np


def stamp_pushed(
    rows: np.ndarray,
    flags: np.ndarray,
    frozen_bit: int,
    step: int,
    version: int,
    last_step: np.ndarray,
    versions: np.ndarray,
    is_dirty: np.ndarray,
) -> tuple[int, int]:
    """A push's filter and stamp: entries of rows that are -1 (no row: the gradient is dropped)
    or whose row has ``flags & frozen_bit`` set (frozen: set to -1 here, so the update skips
    them) are counted; every other row gets ``last_step[r] = step``, ``versions[r] = version``
    and ``is_dirty[r] = True``. Returns (dropped, frozen)."""
    have = rows >= 0
    frozen = np.zeros(rows.shape[0], dtype=bool)
    frozen[have] = (flags[rows[have]] & frozen_bit) != 0
    rows[frozen] = -1
    r = rows[rows >= 0]
    last_step[r] = step
    versions[r] = version
    is_dirty[r] = True
    return int(np.count_nonzero(~have)), int(np.count_nonzero(frozen))


def clear_flags(flags: np.ndarray, rows: np.ndarray) -> None:
    """``flags[rows] = False`` for flags (h,) bool and rows (n,) int64, every entry in
    [0, h) (repeats allowed): how a pull unpins the rows of the batch before it."""
    flags[rows] = False


def stamp_gather_pulled(
    rows: np.ndarray,
    counts: np.ndarray,
    step: int,
    version: int,
    freq_max: int,
    freq: np.ndarray,
    last_step: np.ndarray,
    versions: np.ndarray,
    is_dirty: np.ndarray,
    is_pinned: np.ndarray,
    values: np.ndarray,
    out: np.ndarray,
) -> int:
    """A pull's pass over the rows it found: for each ``r = rows[i] >= 0``, ``freq[r]``
    (uint32) grows by ``counts[i]`` (the key's occurrences in the batch) saturating at
    ``freq_max``, ``last_step[r] = step``, ``versions[r] = version``, ``is_dirty[r]`` and
    ``is_pinned[r]`` (protected from eviction until the next pull) become True, and
    ``out[i] = values[r]``. The other entries of out (keys without a row: the caller writes
    their default) are left as they are. Returns how many rows were stamped."""
    have = rows >= 0
    r = rows[have]
    freq[r] = np.minimum(freq[r].astype(np.int64) + counts[have], freq_max).astype(np.uint32)
    last_step[r] = step
    versions[r] = version
    is_dirty[r] = True
    is_pinned[r] = True
    out[have] = values[r]
    return int(r.shape[0])
