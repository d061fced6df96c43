"""The one read both APIs make: ``lookup`` plus whether each key has a row."""

from __future__ import annotations

from typing import Any

import numpy as np

from evdb.view import ReadableTable

from .codec import ApiError


def check_count(n: int, max_keys: int) -> None:
    if n > max_keys:
        raise ApiError(413, f"keys: {n} keys is more than the limit of {max_keys} per request")


def lookup_rows(
    table: ReadableTable,
    keys: np.ndarray | list[str],
    offsets: Any = None,
    weights: Any = None,
    combiner: str | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(embeddings, found): exactly ``Table.lookup``'s answer (a missing key reads its
    initializer value), with rows read from disk cached in DRAM (``promote=True``: the
    serving working set stays hot), and found (n,) bool per key, from the same read."""
    found = np.empty(len(keys), dtype=bool)
    embeddings = table.lookup(keys, offsets, weights, combiner, promote=True, found=found)
    return embeddings, found
