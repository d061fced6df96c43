"""The one read both APIs make: ``Table.lookup`` plus whether each key has a row."""

from __future__ import annotations

from typing import Any

import numpy as np

import evdb

from .codec import ApiError
from .snapshots import Snapshot


def check_count(n: int, max_keys: int) -> None:
    if n > max_keys:
        raise ApiError(413, f"keys: {n} keys is more than the limit of {max_keys} per request")


def lookup_rows(
    snap: Snapshot,
    name: str,
    table: evdb.Table,
    keys: np.ndarray | list[str],
    offsets: Any = None,
    weights: Any = None,
    combiner: str | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(embeddings, found): exactly ``Table.lookup``'s answer (a missing key reads its
    initializer value), with rows read from disk cached in DRAM (``promote=True``: the
    serving working set stays hot), and found (n,) bool per key, from the same read."""
    found = np.empty(len(keys), dtype=bool)
    embeddings = snap.lookup(
        name, table, keys, offsets, weights, combiner, promote=True, found=found
    )
    return embeddings, found
