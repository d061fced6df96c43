"""``Deduper``: a batch's distinct keys, through the dedup kernels and their reused scratch.

The kernels (``unique_inverse``, ``unique_rows``) need an empty open-addressing index twice the
batch size and, for pulls, a mark per DRAM row; both are kept between calls (the kernels leave
them empty), because a fresh 134 MB index cost 50 ms of page faults per 2M keys. A pull that
a key trace records deduplicates and samples in one pass (the ``unique_sampled`` kernel),
through the same scratch.
"""

from __future__ import annotations

import numpy as np

from evdb._types import Int64Array
from evdb.kernels import backend

cpu = backend("cpu")  # bound once: a call costs one attribute lookup

__all__ = ["Deduper"]

_SMALL_SCRATCH = 1024  # slots of the index kept after a bulk call


class Deduper:
    """Distinct keys in first-occurrence order, their inverse and counts."""

    def __init__(self) -> None:
        self.scratch = np.full((_SMALL_SCRATCH, 2), -1, dtype=np.int64)
        self.mark = np.full(0, -1, dtype=np.int32)  # unique_rows' marks, one per slab row

    @property
    def nbytes(self) -> int:
        return int(self.scratch.nbytes + self.mark.nbytes)

    def _fit(self, n: int) -> None:
        """Make the index big enough for n keys (load <= 0.5)."""
        cap = self.scratch.shape[0]
        if cap < 2 * n:
            while cap < 2 * n:
                cap *= 2
            self.scratch = np.full((cap, 2), -1, dtype=np.int64)

    def unique(
        self, keys: Int64Array, *, keep: bool = False
    ) -> tuple[Int64Array, Int64Array, Int64Array]:
        """For the bulk calls (upsert, delete): the index drops back to 16 KiB afterwards, so
        a bulk load leaves no memory behind; ``keep``: a small pull's, kept for the next."""
        n = keys.shape[0]
        uniq = np.empty(n, dtype=np.int64)
        inverse = np.empty(n, dtype=np.int64)
        counts = np.zeros(n, dtype=np.int64)
        self._fit(n)
        u = cpu.unique_inverse(keys, self.scratch, uniq, inverse, counts)
        if not keep and self.scratch.shape[0] > _SMALL_SCRATCH:
            self.scratch = np.full((_SMALL_SCRATCH, 2), -1, dtype=np.int64)
        return uniq[:u], inverse, counts[:u]

    def unique_rows(
        self, keys: Int64Array, rows_of_keys: Int64Array, n_rows: int
    ) -> tuple[Int64Array, Int64Array, Int64Array, Int64Array]:
        """For pulls: like ``unique``, plus the row of each distinct key (-1 = none), given
        each key's row (``rows_of_keys``, one probe per key): keys with a row deduplicate by
        row number through ``mark`` instead of hashing. The index is kept for the next batch."""
        n = keys.shape[0]
        if self.mark.shape[0] < n_rows:
            self.mark = np.full(max(n_rows, 2 * self.mark.shape[0]), -1, dtype=np.int32)
        self._fit(n)
        uniq = np.empty(n, dtype=np.int64)
        inverse = np.empty(n, dtype=np.int64)
        counts = np.zeros(n, dtype=np.int64)
        rows = np.empty(n, dtype=np.int64)
        u = cpu.unique_rows(
            keys, rows_of_keys, self.mark, self.scratch, uniq, inverse, counts, rows
        )
        return uniq[:u], inverse, counts[:u], rows[:u]

    def unique_sampled(
        self, keys: Int64Array, salt: np.uint64, threshold: np.uint64
    ) -> tuple[Int64Array, Int64Array, Int64Array, Int64Array, np.ndarray]:
        """For a recorded pull of up to ``DEDUP_FIRST_KEYS`` keys: ``unique(keys, keep=True)``,
        plus the keys a key trace keeps (salted hash under ``threshold``: ``evdb.trace``), in
        order with their repeats, and the 53-bit hashes of the distinct ones kept."""
        n = keys.shape[0]
        self._fit(n)
        uniq = np.empty(n, dtype=np.int64)
        inverse = np.empty(n, dtype=np.int64)
        counts = np.empty(n, dtype=np.int64)
        kept, hashes = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.uint64)
        u, k, m = cpu.unique_sampled(
            keys, salt, threshold, self.scratch, uniq, inverse, counts, kept, hashes
        )
        # a small kept part is copied, so the trace's buffer does not hold all n keys
        kept = kept[:k].copy() if k < n // 2 else kept[:k]
        return uniq[:u], inverse, counts[:u], kept, hashes[:m]
