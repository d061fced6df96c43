"""A table's time to live, by global step: which rows are live at a step.

A row is live at ``step`` while ``step - last_step <= ttl_steps`` (DeepRec's
``GlobalStepEvict``, TFRA's step-based TTL): the floor ``min_live(step)`` only rises with the
step, so an expired row stays expired. ``Table``, publications and the server read the same
verdict through one ``Ttl``; the victim scores that rank expired rows first live with the
eviction scan (``evdb.kernels.reference.evict``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from evdb._types import BoolArray, Int64Array

__all__ = ["NEVER", "Ttl", "min_live_step"]

NEVER = -(2**63)  # the floor of a table without a TTL: every last_step is live


def min_live_step(step: int, ttl_steps: int | None) -> int:
    """The oldest ``last_step`` still live at ``step``: live iff step - last_step <= ttl."""
    if ttl_steps is None or step - ttl_steps < NEVER:
        return NEVER
    return step - ttl_steps


@dataclass(frozen=True)
class Ttl:
    """The TTL of one table (``steps=None``: rows never expire)."""

    steps: int | None

    @property
    def expires(self) -> bool:
        return self.steps is not None

    def min_live(self, step: int) -> int:
        """The oldest ``last_step`` live at ``step``."""
        return min_live_step(step, self.steps)

    def live(self, last_step: Int64Array, step: int) -> BoolArray:
        """Which of the rows stamped ``last_step`` are live at ``step``."""
        if self.steps is None:
            return np.ones(last_step.shape[0], dtype=bool)
        return last_step >= self.min_live(step)
