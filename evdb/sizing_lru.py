"""The exact LRU curve of a sampled key trace, from stack distances (Mattson et al. 1970),
scaled by ``1 / rate`` (SHARDS, Waldspurger et al., FAST'15): ``evdb size``'s reference curve
beside evdb's own policy (``evdb.sizing``), and the histogram TorchRec's planner takes
(``mrc_hist_counts``). A hit is counted as a table counts it: once per distinct key of a pull,
so a batch's repeats are dropped first. Hit rates are SHARDS-adj estimates (``evdb.sizing``'s
note).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from evdb._types import Int64Array
from evdb.sizing_kernels import stack_distances
from evdb.trace import OPS, Trace

__all__ = ["LruCurve", "lru_curve", "trace_accesses"]


def trace_accesses(trace: Trace, ops: Sequence[str] = ("pull",)) -> tuple[Int64Array, Int64Array]:
    """The accesses the curves count: keys (m,) int64 of the batches whose op is in ``ops``,
    each batch's repeats dropped (first occurrences, in order), and their batch numbers
    (m,) int64."""
    codes = [OPS.index(op) for op in ops]
    lengths = np.diff(trace.bounds)
    batch = np.repeat(np.arange(trace.n_batches, dtype=np.int64), lengths)
    keep = np.isin(trace.ops, codes)[batch]
    keys, batch = trace.keys[keep], batch[keep]
    if keys.size == 0:
        return keys, batch
    order = np.lexsort((keys, batch))
    first = np.ones(order.shape[0], dtype=bool)
    first[1:] = (keys[order[1:]] != keys[order[:-1]]) | (batch[order[1:]] != batch[order[:-1]])
    pos = np.sort(order[first])
    return keys[pos], batch[pos]


@dataclass(frozen=True)
class LruCurve:
    """The exact LRU hit-rate curve of a (sampled) trace, scaled to the full key space.

    ``distances`` (f,) float64, sorted: each reuse's stack distance divided by the sampling
    rate (first accesses, which miss at any size, are left out but counted in ``accesses``).
    """

    rate: float
    distances: np.ndarray
    accesses: int
    distinct: int
    counted: int | None = None
    """Accesses the table counted, unsampled (``Trace.counted_total``); None: unknown, and
    hit rates are the sampled ones."""

    def _misses_over(self, hits: np.ndarray) -> np.ndarray:
        """Hit rates from sampled hit counts (see the module's note on SHARDS-adj)."""
        if self.counted is None:
            return hits / max(self.accesses, 1)
        misses = (self.accesses - hits) / self.rate
        return np.clip(1.0 - misses / max(self.counted, 1), 0.0, 1.0)

    @property
    def distinct_estimate(self) -> int:
        """Distinct keys of the full trace (the sampled ones over the rate)."""
        return round(self.distinct / self.rate)

    def hit_rate(self, rows: Any) -> np.ndarray:
        """Hit rate of an LRU cache of ``rows`` (array-like of ints): distance < rows."""
        r = np.asarray(rows, dtype=np.float64)
        return self._misses_over(np.searchsorted(self.distances, r, side="left"))

    def rows_for(self, target: float) -> int | None:
        """Fewest rows whose LRU hit rate reaches ``target``; None if cold misses alone
        keep it below."""
        if self.counted is None:
            need = math.ceil(target * self.accesses - 1e-9)
        else:  # sampled misses at most (1 - target) * counted * rate
            need = math.ceil(self.accesses - (1 - target) * self.counted * self.rate - 1e-9)
        if need <= 0:
            return 0
        if need > self.distances.shape[0]:
            return None
        return math.floor(float(self.distances[need - 1])) + 1

    def mrc_hist_counts(self, n_bins: int = 100, height: int | None = None) -> Int64Array:
        """TorchRec's ``CacheStatistics`` histogram (``EmbeddingOffloadStats``): n_bins bins
        of LRU stack distance from 0 to ``height`` rows (the table's height; default, the
        distinct keys): bin i counts the reuses an LRU cache of load factor (i+1)/n_bins
        serves and one of i/n_bins may not, scaled to the full trace. First accesses are not
        in it (TorchRec rescales the cumulative counts to 1); the accesses a sample holds too
        few or too many of are added to bin 0, as SHARDS-adj does."""
        h = self.distinct_estimate if height is None else height
        bins = np.linspace(0, max(h, 1), n_bins + 1)
        counts, _ = np.histogram(np.minimum(self.distances, bins[-1]), bins=bins)
        full = counts / self.rate
        if self.counted is not None:
            full[0] = max(0.0, full[0] + self.counted - self.accesses / self.rate)
        return np.round(full).astype(np.int64)

    def torchrec_stats(self, n_batches: int, n_bins: int = 100) -> dict[str, Any]:
        """The arguments of TorchRec's ``EmbeddingOffloadStats(cacheability,
        expected_lookups, mrc_hist_counts, height)``; ``n_batches`` is how many batches the
        accesses came in (expected_lookups is distinct ids per batch)."""
        hist = self.mrc_hist_counts(n_bins)
        cum = np.cumsum(hist) / max(int(hist.sum()), 1)
        return {
            "cacheability": float(np.mean(1.0 - cum)),  # area under the miss-ratio curve
            "expected_lookups": round(self.accesses / self.rate / max(n_batches, 1)),
            "mrc_hist_counts": hist.tolist(),
            "height": self.distinct_estimate,
        }


def lru_curve(trace: Trace, ops: Sequence[str] = ("pull",)) -> LruCurve:
    """The exact LRU curve of the trace's ``ops`` batches (see ``LruCurve``)."""
    keys, _ = trace_accesses(trace, ops)
    uniq, ids = np.unique(keys, return_inverse=True)
    d = stack_distances(ids.astype(np.int64), uniq.shape[0])
    reuse = np.sort(d[d >= 0]).astype(np.float64) / trace.header.rate
    counted = trace.counted_total("pull") if tuple(ops) == ("pull",) else None
    return LruCurve(trace.header.rate, reuse, int(keys.shape[0]), int(uniq.shape[0]), counted)
