"""The reads of a sharded table that need more than a route to each key's owner: exact
neighbours over every shard, and the original strings kept at each key's owner.

Both are collective (every rank calls them with the same arguments) and use only the table's
public surface: its shard (``local``), its placement and its exchange.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from evdb._types import Float32Array, Int64Array
from evdb.keys import normalize_keys
from evdb.neighbors import check_query, top_k

if TYPE_CHECKING:
    from evdb.distributed.table import ShardedTable

__all__ = ["neighbors", "strings"]


def neighbors(
    table: ShardedTable,
    query: Any,
    k: Any = 10,
    metric: Any = "cosine",
    as_strings: bool = False,
    step: int | None = None,
) -> tuple[Any, Float32Array]:
    """``Table.neighbors`` over every shard: each rank scores its own live rows (the query
    key's row is looked up at its owner), the ranks' k best are gathered, and every rank
    returns the same k nearest: highest similarity first, or lowest l2 distance; ties by
    key, as one table orders them."""
    q, exclude, k, metric = check_query(table, query, k, metric)
    mine = top_k(table.local.live_values(step=step), q, k, metric, exclude)
    x = table.exchange
    parts = x.gather_objects((mine[0], mine[1]), "neighbors", table.name)
    keys = np.concatenate([p[0] for p in parts])
    scores = np.concatenate([p[1] for p in parts]).astype(np.float32)
    first = scores if metric == "l2" else -scores  # nearest first
    order = np.lexsort((keys, first))[:k]
    keys, scores = keys[order], scores[order]
    return (strings(table, keys) if as_strings else keys), scores


def strings(table: ShardedTable, keys: Any) -> list[str | None]:
    """``Table.strings`` over every shard: each key's original string, as its owner keeps
    it (None where unknown)."""
    if not table.local.keeps_strings:
        table.local.strings([])  # raises, naming how to create a table that keeps them
    k: Int64Array = normalize_keys(keys, table.config.key_type, arg="keys")
    x = table.exchange
    asked = x.gather_objects(k, "strings", table.name)
    answers = []
    for theirs in asked:  # what this rank owns of every rank's keys
        owned = np.flatnonzero(table.placement.owners(theirs, x.size) == x.rank)
        answers.append((owned, table.local.strings(theirs[owned])))
    replies = x.gather_objects(answers, "strings", table.name)
    out: list[str | None] = [None] * k.shape[0]
    for reply in replies:  # every owner's answer to this rank's keys
        at, found = reply[x.rank]
        for i, s in zip(at.tolist(), found, strict=True):
            out[i] = s
    return out
