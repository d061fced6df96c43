"""``StepCounts``: how many rows of a tier have each ``last_step``, so that a chain counts the
live rows below its cache without a scan (``evdb.tiers.chain``)."""

from __future__ import annotations

import numpy as np

from evdb._types import Int64Array

__all__ = ["StepCounts"]


class StepCounts:
    """How many rows of a tier have each ``last_step``, to count live rows without a scan.

    Without a TTL every row is live and one total suffices. With one, rows whose step fell
    below the live floor stay expired for good (the floor only rises), so they are merged into
    one bucket: the map never holds more than ``ttl_steps + 2`` entries.
    """

    def __init__(self, track_steps: bool) -> None:
        self.track_steps = track_steps
        self.counts: dict[int, int] = {}
        self.floor = -(2**63)

    def _buckets(self, steps: Int64Array) -> tuple[Int64Array, Int64Array]:
        if not self.track_steps:
            return np.zeros(1, dtype=np.int64), np.array([steps.shape[0]], dtype=np.int64)
        below = steps < self.floor
        if below.any():
            steps = np.where(below, self.floor - 1, steps)
        return np.unique(steps, return_counts=True)

    def add(self, steps: Int64Array, sign: int = 1) -> None:
        if steps.shape[0] == 0:
            return
        for step, n in zip(*self._buckets(steps), strict=True):  # distinct steps: a few
            total = self.counts.get(int(step), 0) + sign * int(n)
            if total:
                self.counts[int(step)] = total
            else:
                del self.counts[int(step)]

    def sub(self, steps: Int64Array) -> None:
        self.add(steps, -1)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def live(self, min_live: int) -> int:
        """Rows with last_step >= min_live. A pure read: readers at any step (a view at a
        publication's step) may ask at once; only ``raise_floor`` merges buckets."""
        if not self.track_steps:
            return self.total
        return sum(n for s, n in self.counts.items() if s >= min_live)

    def raise_floor(self, min_live: int) -> None:
        """The live floor of the table's own step rose to ``min_live`` (it never falls): the
        buckets below it are expired for good and merge into one, so the map holds at most
        ``ttl_steps + 2`` entries. Writers call it, holding the table alone."""
        if not self.track_steps or min_live <= self.floor:
            return
        self.floor = min_live
        old = [s for s in self.counts if s < min_live]
        merged = sum(self.counts.pop(s) for s in old)
        if merged:
            self.counts[min_live - 1] = merged

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {
            "steps": np.array(list(self.counts), dtype=np.int64),
            "counts": np.array(list(self.counts.values()), dtype=np.int64),
            "floor": np.array([self.floor], dtype=np.int64),
        }

    def load_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        self.counts = dict(zip(arrays["steps"].tolist(), arrays["counts"].tolist(), strict=True))
        self.floor = int(arrays["floor"][0])
