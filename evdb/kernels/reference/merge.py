"""Reference merge of two sorted row sets, the newer winning: how a server folds publication
deltas into the rows it overlays on a snapshot (``evdb.api.follow``)."""

from __future__ import annotations

import numpy as np


def merge_newest(
    a_keys: np.ndarray,
    a_values: np.ndarray,
    a_steps: np.ndarray,
    a_removed: np.ndarray,
    b_keys: np.ndarray,
    b_values: np.ndarray,
    b_steps: np.ndarray,
    b_removed: np.ndarray,
    out_keys: np.ndarray,
    out_values: np.ndarray,
    out_steps: np.ndarray,
    out_removed: np.ndarray,
) -> int:
    """Rows of a (older) and b (newer), each with keys (n,) int64 sorted and distinct, values
    (n, dim) float32, steps (n,) int64 and removed (n,) bool: write the union into the first
    rows of the out arrays (at least len(a) + len(b) long), sorted by key, b's row where both
    have a key; returns how many rows were written."""
    keys = np.concatenate([a_keys, b_keys])
    newer = np.concatenate([np.zeros(a_keys.shape[0], bool), np.ones(b_keys.shape[0], bool)])
    order = np.lexsort((newer, keys))  # by key, then older before newer
    keys = keys[order]
    last = np.ones(keys.shape[0], dtype=bool)
    last[:-1] = keys[1:] != keys[:-1]  # the newest entry of each key
    pick = order[last]
    m = pick.shape[0]
    out_keys[:m] = keys[last]
    out_values[:m] = np.concatenate([a_values, b_values])[pick]
    out_steps[:m] = np.concatenate([a_steps, b_steps])[pick]
    out_removed[:m] = np.concatenate([a_removed, b_removed])[pick]
    return int(m)
