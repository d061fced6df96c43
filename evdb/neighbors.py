"""``Table.neighbors``: exact top-k nearest neighbours of a key or a vector over every live row.

The scan streams through the tiers a chunk at a time, so a table larger than memory works and
memory stays at a few chunks: the cached rows are scored in place on the top tier's slab (a
block of rows per matmul, no gather), then the rows only on disk come up ``chunk_rows`` at a
time from the chain's scan. Each chunk costs one numpy matmul and one ``argpartition``; the
chunk's candidates (every row scoring at least the chunk's k-th best, so ties survive) merge
into the running top-k, which is ordered by score and then by key.

``Table`` keeps the public method and its documentation; :func:`neighbors` is its body and
:func:`neighbors_reference` the plain specification the tests compare it against.

Examples
--------
>>> import tempfile, evdb
>>> with evdb.open(tempfile.mkdtemp()) as db:
...     t = db.create_table("w", dim=2, key_type="str", keep_strings=True, disk=False)
...     t.upsert(["cat", "dog", "car"], [[1.0, 0.1], [0.9, 0.2], [0.0, 1.0]])
...     keys, scores = t.neighbors("cat", k=2, as_strings=True)   # "cat" itself is left out
...     keys, [round(float(s), 3) for s in scores]
(['dog', 'car'], [0.993, 0.1])
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from evdb._types import Float32Array, Int64Array
from evdb.errors import InvalidArgumentError
from evdb.keys import normalize_keys

if TYPE_CHECKING:
    from evdb.config import TableConfig
    from evdb.table_scans import TableScans as Table


class Queryable(Protocol):
    """What a neighbours query needs of a table: its key type and width, and a lookup (a
    ``Table``, a view of one, or a sharded table, whose lookup is collective)."""

    @property
    def config(self) -> TableConfig: ...
    @property
    def dim(self) -> int: ...
    def lookup(self, keys: Any) -> Float32Array: ...


__all__ = [
    "METRICS",
    "Queryable",
    "check_query",
    "neighbors",
    "neighbors_reference",
    "top_k",
]

METRICS = ("cosine", "dot", "l2")


def _check_k(k: Any) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise InvalidArgumentError(f"k must be an int >= 1, got {k!r}")
    return int(k)


def _check_metric(metric: Any) -> str:
    if metric not in METRICS:
        raise InvalidArgumentError(f"metric must be one of {METRICS}, got {metric!r}")
    return str(metric)


def _is_key(query: Any) -> bool:
    """A scalar (int or str) is a key; anything else is taken for a vector."""
    return isinstance(query, (int, np.integer, str, bytes)) and not isinstance(query, bool)


def query_vector(table: Queryable, query: Any) -> tuple[Float32Array, int | None]:
    """The (dim,) float32 query and the key to leave out of the answer (the query key itself,
    as gensim's ``most_similar`` leaves out the word), or None for a vector query."""
    if _is_key(query):
        key = normalize_keys([query], table.config.key_type, arg="query")
        return table.lookup(key)[0], int(key[0])
    if isinstance(query, bool) or query is None:
        raise InvalidArgumentError(f"query must be a key or a vector, got {query!r}")
    try:
        vec = np.asarray(query, dtype=np.float64)
    except (TypeError, ValueError):
        raise InvalidArgumentError(
            f"query must be a key or a vector of {table.dim} floats, got {type(query).__name__}"
        ) from None
    if vec.shape != (table.dim,):
        raise InvalidArgumentError(
            f"query: a vector must have shape ({table.dim},), got {vec.shape}"
        )
    bad = np.flatnonzero(~np.isfinite(vec))
    if bad.size:
        raise InvalidArgumentError(f"query[{bad[0]}] is not finite: {vec[bad[0]]!r}")
    # rows are float32: a larger component would become inf and every score inf or NaN
    bad = np.flatnonzero(np.abs(vec) > np.finfo(np.float32).max)
    if bad.size:
        raise InvalidArgumentError(f"query[{bad[0]}] is outside float32's range: {vec[bad[0]]!r}")
    return vec.astype(np.float32), None


def _prepare(
    table: Queryable, query: Any, k: Any, metric: Any
) -> tuple[Float32Array, int | None, int, str]:
    """Every argument checked before any row is read (bad input changes nothing)."""
    k = _check_k(k)
    metric = _check_metric(metric)
    q, exclude = query_vector(table, query)
    if metric == "cosine" and not np.any(q):
        raise InvalidArgumentError("query: a zero vector has no cosine similarity")
    return q, exclude, k, metric


class _TopK:
    """The best k (score, key) pairs seen so far: higher score first, then lower key."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.scores = np.empty(0, dtype=np.float32)
        self.keys = np.empty(0, dtype=np.int64)

    def offer(self, scores: Float32Array, keys: Int64Array) -> None:
        k = self.k
        if self.keys.shape[0] == k:  # only rows at least as good as the current k-th count
            keep = scores >= self.scores[-1]
            if not keep.any():
                return
            scores, keys = scores[keep], keys[keep]
        if scores.shape[0] > k:  # every row tied with the chunk's k-th survives
            kth = np.partition(scores, scores.shape[0] - k)[scores.shape[0] - k]
            keep = scores >= kth
            scores, keys = scores[keep], keys[keep]
        scores = np.concatenate([self.scores, scores])
        keys = np.concatenate([self.keys, keys])
        order = np.lexsort((keys, -scores))[:k]
        self.scores, self.keys = scores[order], keys[order]


def _score(values: Float32Array, q: Float32Array, q_norm: float, metric: str) -> Float32Array:
    """(m,) float32 scores, higher is nearer: cosine, dot, or minus the squared L2 distance.
    A row of norm 0 has cosine 0."""
    dots: Float32Array = values @ q
    if metric == "dot":
        return dots
    sq: Float32Array = np.einsum("ij,ij->i", values, values)
    if metric == "l2":
        dots *= 2
        dots -= sq
        dots -= np.float32(q_norm * q_norm)
        return dots
    # in place: each temporary of a block is another pass over it
    np.sqrt(sq, out=sq)
    sq *= np.float32(q_norm)
    sq[sq == 0] = np.inf
    dots /= sq
    return dots


def check_query(
    table: Queryable, query: Any, k: Any = 10, metric: Any = "cosine"
) -> tuple[Float32Array, int | None, int, str]:
    """The arguments of a neighbours query, checked before any row is read: the (dim,)
    float32 query vector, the query key to leave out of the answer (None for a vector), k
    and the metric. Raises what ``Table.neighbors`` raises for bad input."""
    return _prepare(table, query, k, metric)


def top_k(
    chunks: Iterable[tuple[Float32Array, Int64Array]],
    q: Float32Array,
    k: int,
    metric: str,
    exclude: int | None = None,
) -> tuple[Int64Array, Float32Array]:
    """The k rows of ``chunks`` nearest to ``q`` (keys, scores: similarity, or the distance for
    l2), ties by key, leaving out the key ``exclude``; arguments as :func:`check_query` gives
    them. What ``Table.neighbors`` runs over ``Table.live_values``, and what a caller with rows
    of its own (a server's overlay of newer rows) runs over its merged chunks."""
    q_norm = float(np.linalg.norm(q.astype(np.float64)))
    top = _TopK(k + (exclude is not None))  # one spare: the query key may be among them
    for values, keys in chunks:
        top.offer(_score(values, q, q_norm, metric), keys)
    keys_out, scores = top.keys, top.scores
    if exclude is not None:
        mine = keys_out != exclude
        keys_out, scores = keys_out[mine][:k], scores[mine][:k]
    if metric == "l2":  # the distance itself, from minus its square
        scores = np.sqrt(np.maximum(-scores, 0)).astype(np.float32)
    return keys_out, scores


def neighbors(
    table: Table,
    query: Any,
    k: Any = 10,
    metric: Any = "cosine",
    as_strings: bool = False,
    step: int | None = None,
) -> tuple[Any, Float32Array]:
    """``Table.neighbors`` (see there)."""
    q, exclude, k, metric = _prepare(table, query, k, metric)
    if as_strings and not table.keeps_strings:
        table.strings([])  # raises, naming how to create a table that keeps them
    keys, scores = top_k(table.live_values(step=step), q, k, metric, exclude)
    return (table.strings(keys) if as_strings else keys), scores


def neighbors_reference(
    table: Table, query: Any, k: Any = 10, metric: Any = "cosine"
) -> tuple[Int64Array, Float32Array]:
    """The specification: every live row (``Table.items``) scored one at a time in float64,
    sorted by score, then by key. Slow and obvious; tests compare :func:`neighbors` to it."""
    q32, exclude, k, metric = _prepare(table, query, k, metric)
    q = q32.astype(np.float64)
    pairs: list[tuple[float, int]] = []
    for keys, values in table.items():
        for key, row in zip(keys.tolist(), values.astype(np.float64), strict=True):
            if key == exclude:
                continue
            if metric == "dot":
                s = float(row @ q)
            elif metric == "l2":
                s = -float(np.sqrt(((row - q) ** 2).sum()))
            else:
                norm = float(np.linalg.norm(row))
                s = 0.0 if norm == 0 else float(row @ q) / (norm * float(np.linalg.norm(q)))
            pairs.append((-s, key))
    pairs.sort()
    best = pairs[:k]
    scores = np.array([-s for s, _ in best], dtype=np.float64)
    if metric == "l2":
        scores = -scores
    return np.array([key for _, key in best], dtype=np.int64), scores.astype(np.float32)
