"""Fixed-size spatial sampling: a trace's sampling rate raised so it keeps enough keys.

At a fixed rate, a small key space or a small cache leaves a miniature too few keys to answer
(1% of 1,682 MovieLens items is 17 keys; a 5,000-row DRAM tier is a 50-row miniature, whose
hit rate moves by several points with which hot keys the sample kept). Fixed-size SHARDS
(Waldspurger et al., FAST'15, section 3.3) keeps the ``min_keys`` distinct keys of smallest
hash instead: the threshold starts at 1 (every key) and falls, as new keys come, to the
``min_keys``-th smallest hash seen. evdb keeps the user's rate as a floor under it: the
threshold never falls below ``rate``, so a large key space is sampled at ``rate`` as before.

The threshold only falls, so a key under the final threshold was kept at every access; a key
kept while the threshold was higher is dropped when the trace is read (``final_threshold``
finds the threshold from the kept keys alone, so a file cut short reads the same way).
"""

from __future__ import annotations

import numpy as np

from evdb._types import Int64Array
from evdb.kernels.hashing import mix64_np
from evdb.sizing_kernels import THRESHOLD_BITS, smallest_add

__all__ = [
    "FULL",
    "SmallestHashes",
    "SmallestHashesReference",
    "final_threshold",
    "keep_under",
    "key_hashes",
]

FULL = 1 << THRESHOLD_BITS  # the threshold that keeps every key
_SHIFT = np.uint64(64 - THRESHOLD_BITS)


def key_hashes(keys: Int64Array, salt: int) -> np.ndarray:
    """The 53-bit hashes (uint64) the sampling kernel compares with the threshold."""
    return mix64_np(keys.view(np.uint64) ^ np.uint64(salt)) >> _SHIFT


def threshold_of(smallest: np.ndarray, min_keys: int, floor: int) -> int:
    """The threshold for the sorted distinct hashes ``smallest`` seen (at most ``min_keys``
    of them): all keys until ``min_keys`` were seen, then just above the largest of them,
    never below ``floor``."""
    if min_keys <= 0:
        return floor
    if smallest.shape[0] < min_keys:
        return FULL
    return max(floor, int(smallest[min_keys - 1]) + 1)


class SmallestHashesReference:
    """The ``min_keys`` smallest distinct key hashes seen, and the threshold they set: the
    plain-numpy specification of ``SmallestHashes``.

    ``add`` takes the hashes of a batch's kept keys (the keys under the current threshold:
    the only ones that can be among the smallest). Cheap: a sorted array of at most
    ``min_keys`` uint64, merged with a batch's few new hashes; once the threshold reaches
    the floor it stops changing and ``add`` returns at once.
    """

    def __init__(self, min_keys: int, floor: int) -> None:
        self.min_keys = min_keys
        self.floor = floor
        self.hashes = np.zeros(0, dtype=np.uint64)
        self.threshold = threshold_of(self.hashes, min_keys, floor)

    @property
    def settled(self) -> bool:
        """True once the threshold is the floor (it can fall no further)."""
        return self.threshold <= self.floor

    def add(self, hashes: np.ndarray) -> int:
        """Take a batch's kept hashes (any order, repeats allowed); returns the threshold."""
        if self.settled or hashes.shape[0] == 0:
            return self.threshold
        new = np.unique(hashes)
        at = np.searchsorted(self.hashes, new)
        known = at < self.hashes.shape[0]
        known[known] = self.hashes[at[known]] == new[known]
        if not known.all():
            merged = np.insert(self.hashes, at[~known], new[~known])
            self.hashes = merged[: self.min_keys]
            self.threshold = threshold_of(self.hashes, self.min_keys, self.floor)
        return self.threshold


class SmallestHashes:
    """``SmallestHashesReference`` on the ``smallest_add`` kernel: a max-heap of the
    ``min_keys`` smallest distinct hashes and a set of them (``hashes`` is the heap,
    unordered; ``sorted_hashes()`` sorts it)."""

    def __init__(self, min_keys: int, floor: int) -> None:
        self.min_keys = min_keys
        self.floor = floor
        self._heap = np.zeros(max(min_keys, 1), dtype=np.uint64)
        self._table = np.zeros(1 << max(4, (2 * max(min_keys, 1)).bit_length()), np.uint64)
        self._size = 0
        self.threshold = FULL if min_keys > 0 else floor

    @property
    def settled(self) -> bool:
        """True once the threshold is the floor (it can fall no further)."""
        return self.threshold <= self.floor

    @property
    def size(self) -> int:
        """How many hashes it holds (at most ``min_keys``)."""
        return self._size

    def sorted_hashes(self) -> np.ndarray:
        return np.sort(self._heap[: self._size])

    def add(self, hashes: np.ndarray, n: int | None = None) -> int:
        """Take ``hashes[:n]`` (uint64; all of them by default); returns the threshold."""
        if self.settled:
            return self.threshold
        count = hashes.shape[0] if n is None else n
        self._size = smallest_add(hashes, count, self._heap, self._size, self._table)
        if self._size == self.min_keys:
            self.threshold = max(self.floor, int(self._heap[0]) + 1)
        return self.threshold


def final_threshold(keys: Int64Array, salt: int, min_keys: int, floor: int) -> int:
    """The threshold a recorder ended with, from the keys it kept (the same ``min_keys``
    smallest distinct hashes are among them, whatever the order they came in)."""
    if min_keys <= 0:
        return floor
    hashes = np.unique(key_hashes(keys, salt))
    return threshold_of(hashes[:min_keys], min_keys, floor)


def keep_under(
    keys: Int64Array, bounds: Int64Array, salt: int, threshold: int
) -> tuple[Int64Array, Int64Array]:
    """The keys whose hash is under ``threshold``, batch by batch: (kept keys, their
    batches' bounds (b + 1,) int64); a batch may be left empty (its counts still count)."""
    mask = key_hashes(keys, salt) < np.uint64(threshold)
    lengths = np.diff(bounds)
    batch = np.repeat(np.arange(lengths.shape[0], dtype=np.int64), lengths)
    new = np.zeros_like(bounds)
    np.cumsum(np.bincount(batch[mask], minlength=lengths.shape[0]), out=new[1:])
    return keys[mask], new
