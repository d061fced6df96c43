"""The TTL verdict as a pure function of the step: the oldest ``last_step`` still live.

A row is expired when ``last_step < min_live_step(step, ttl_steps)``. The victim scores that
eviction ranks rows by (LFU with ageing, LRU; expired rows -inf) live with the eviction scan,
``evdb.kernels.reference.evict``, which the numba kernel matches.
"""

from __future__ import annotations


def min_live_step(step: int, ttl_steps: int | None) -> int:
    """The oldest ``last_step`` still live at ``step``: live iff step - last_step <= ttl."""
    if ttl_steps is None or step - ttl_steps < -(2**63):
        return -(2**63)
    return step - ttl_steps
