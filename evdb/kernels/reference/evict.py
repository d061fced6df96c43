"""Reference victim candidates of a cache tier's eviction: which rows may be evicted, and
their scores, in one pass over the row columns."""

from __future__ import annotations

import numpy as np


def victim_candidates(
    is_live: np.ndarray,
    is_pinned: np.ndarray,
    is_protected: np.ndarray,
    freq: np.ndarray,
    last_step: np.ndarray,
    step: int,
    half_life_steps: int,
    min_live_step: int,
    lfu: bool,
    out_rows: np.ndarray,
    out_scores: np.ndarray,
    out_expired: np.ndarray,
) -> int:
    """The rows that may be victims, in row order, with their scores.

    Inputs are the tier's columns over rows [0, high): is_live, is_pinned, is_protected (h,)
    bool, freq (h,) uint32, last_step (h,) int64. A row is a candidate when it is live and
    not protected, and either not pinned or expired (``last_step < min_live_step``). Its score
    (lowest evicted first) is ``-inf`` when expired, else ``freq * 2 ** (-age /
    half_life_steps)`` with ``age = max(step - last_step, 0)`` (``lfu``: the pull
    count halved every ``half_life_steps`` since the last touch, as DeepRec ages it; TFRA's and
    HKV's LFU never forget a once-hot key) or ``last_step`` (LRU), as float64. Writes candidate
    rows (int64), scores (float64) and expired flags (bool) into the first m entries of the
    out arrays (at least h long); returns m.
    """
    expired = last_step < min_live_step
    ok = is_live & ~is_protected & (~is_pinned | expired)
    rows = np.flatnonzero(ok)
    last = last_step[rows]
    if lfu:
        age = np.maximum(step - last, 0).astype(np.float64)
        scores = freq[rows].astype(np.float64) * np.exp2(-age / half_life_steps)
    else:
        scores = last.astype(np.float64)
    scores[expired[rows]] = -np.inf
    m = rows.shape[0]
    out_rows[:m] = rows
    out_scores[:m] = scores
    out_expired[:m] = expired[rows]
    return int(m)
