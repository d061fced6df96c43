"""Victim scores and the TTL verdict, as pure functions of record fields.

Lowest score is evicted first. Expired rows score -inf so they go before any live row.
"""

from __future__ import annotations

import numpy as np

from evdb._types import BoolArray, Int64Array


def min_live_step(step: int, ttl_steps: int | None) -> int:
    """The oldest ``last_step`` still live at ``step``: live iff step - last_step <= ttl."""
    if ttl_steps is None or step - ttl_steps < -(2**63):
        return -(2**63)
    return step - ttl_steps


def is_expired(last_step: Int64Array, min_live: int) -> BoolArray:
    return last_step < min_live


def lfu_scores(
    freq: np.ndarray, last_step: Int64Array, step: int, half_life_steps: int
) -> np.ndarray:
    """LFU with ageing: pull count halved for every ``half_life_steps`` since the last touch
    (TFRA/HKV's "LFU" would never forget a once-hot key; DeepRec ages by step the same way)."""
    age = np.maximum(step - last_step, 0).astype(np.float64)
    return freq.astype(np.float64) * np.exp2(-age / half_life_steps)


def lru_scores(last_step: Int64Array) -> np.ndarray:
    """LRU: the least recently touched row goes first."""
    return last_step.astype(np.float64)
