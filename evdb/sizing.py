"""How big should a table's DRAM tier be? Miss-ratio curves from a sampled key trace.

Two curves from one trace (``evdb.trace``):

- **evdb's own policy**, by scaled miniature simulation (Waldspurger et al., USENIX ATC'17):
  for each candidate size, a real evdb table with the trace's configuration (admission, TTL,
  eviction, disk tier) and ``dram_rows`` scaled by the sampling rate replays the sampled
  batches through ``pull`` at their steps, and its DRAM tier's own hit and miss counters
  (``stats()["tiers"]["dram"]``) give the hit rate. Spatial sampling keeps every access of a
  kept key, so admission counts, TTL ages and LFU frequencies are those of the full trace; a
  cache of ``rows * rate`` rows sees a ``rate`` share of the keys competing for it.
- **exact LRU**, from stack distances (Mattson et al. 1970), scaled by ``1 / rate`` (SHARDS,
  Waldspurger et al., FAST'15): the reference curve, and the histogram TorchRec's planner
  takes (``mrc_hist_counts``).

A hit is counted as the table counts it: once per distinct key of a pull (a batch's repeats of a
key are one access), so both curves deduplicate each batch first.

Hit rates are estimated as SHARDS-adj does (Waldspurger et al., FAST'15, section 4.3): the
sampled misses over the rate, divided by the accesses the table counted in all calls (which the
trace records unsampled), not by the sampled accesses over the rate. Misses come from the many
keys of the tail, which a 1% sample represents well; hits come mostly from a few hot keys, and
whether the sample kept a few more or fewer of them moved a Zipf(1.1) trace's plain estimate by
4 points at 20% sampling (tests/test_sizing.py), the adjusted one by under 1.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import evdb
from evdb._types import Int64Array
from evdb.admission import Bloom, Counter
from evdb.config import DiskConfig, TableConfig
from evdb.errors import InvalidArgumentError
from evdb.sizing_kernels import stack_distances
from evdb.trace import OPS, Trace

__all__ = [
    "DEFAULT_TARGETS",
    "LruCurve",
    "PolicyCurve",
    "SizingReport",
    "candidate_rows",
    "lru_curve",
    "miniature_config",
    "simulate",
    "size_table",
    "trace_accesses",
]

DEFAULT_TARGETS = (0.90, 0.95, 0.99)
ProgressFn = Callable[[int, int], None]
# Fewer sampled distinct keys than this and a miniature's answer rests on too few keys to
# trust (SHARDS' fixed-size variant keeps 8K; at 1K the ATC'17 miniatures were within ~1 point
# on the traces it measured). The report says so instead of hiding it.
MIN_SAMPLED_KEYS = 1000
# A miniature cache smaller than this answers with a spread of a few points: which of the hot
# keys the sample kept decides how much of its few rows the rest gets (Zipf(1.1), 2M accesses,
# 1%: 5,000 rows as a 50-row miniature, four seeds from -5.3 to +1.4 points; 20,000 rows as 200,
# within 0.9).
MIN_MINIATURE_ROWS = 200


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


@dataclass(frozen=True)
class PolicyCurve:
    """Hit rates of evdb's own policy at candidate DRAM sizes, by miniature simulation.

    ``rows`` (k,) int64 the sizes asked for, ``mini_rows`` (k,) int64 the miniature tables'
    ``dram_rows`` (rows x rate, at least 1), and per op ("pull", "lookup") the DRAM tier's
    hits and misses (k,) int64 summed over the replay.
    """

    rows: Int64Array
    mini_rows: Int64Array
    hits: dict[str, Int64Array]
    misses: dict[str, Int64Array]
    rate: float = 1.0
    counted: dict[str, int | None] = dataclasses.field(default_factory=dict)
    """Per op, the accesses the table counted unsampled (``Trace.counted_total``)."""

    def hit_rate(self, op: str = "pull") -> np.ndarray:
        """Per size; NaN where the trace has no ``op`` call (SHARDS-adj where the trace
        knows the unsampled count, see the module's note)."""
        total = self.hits[op] + self.misses[op]
        counted = self.counted.get(op)
        if counted is None or counted == 0:
            return np.where(total > 0, self.hits[op] / np.maximum(total, 1), np.nan)
        return np.clip(1.0 - self.misses[op] / self.rate / counted, 0.0, 1.0)

    def rows_for(self, target: float, op: str = "pull") -> int | None:
        """Fewest rows reaching ``target``, interpolated linearly between the simulated size
        below it and the first one that reaches it; None if none does."""
        rate = self.hit_rate(op)
        ok = np.flatnonzero(rate >= target)
        if ok.size == 0:
            return None
        i = int(ok[0])
        if i == 0 or rate[i] == rate[i - 1]:
            return int(self.rows[i])
        lo, hi = float(self.rows[i - 1]), float(self.rows[i])
        frac = (target - rate[i - 1]) / (rate[i] - rate[i - 1])
        return math.ceil(float(lo + frac * (hi - lo)))


def miniature_config(config: TableConfig, rows: int, rate: float) -> TableConfig:
    """The configuration of a miniature of ``config`` with a DRAM tier of ``rows`` full-scale
    rows: the same admission (its memory bounds scaled by ``rate``), TTL, eviction and disk
    tier; dim 1, zeros and SGD (a row's values do not steer any policy); no HBM tier (the
    DRAM tier is the one sized)."""
    mini = max(1, round(rows * rate))
    admission = config.admission
    if isinstance(admission, Counter):
        admission = dataclasses.replace(
            admission, max_pending=max(1, round(admission.max_pending * rate))
        )
    elif isinstance(admission, Bloom):
        admission = dataclasses.replace(
            admission, capacity=max(1, round(admission.capacity * rate))
        )
    return dataclasses.replace(
        config,
        dim=1,
        key_type="int64",
        initializer=evdb.init.Zeros(),
        optimizer=evdb.optim.SGD(),
        admission=admission,
        l2_threshold=None,
        keep_strings=False,
        default_value="init",
        hbm=None,
        disk=None if config.disk is None else DiskConfig(),
        dram=dataclasses.replace(config.dram, capacity_rows=mini, initial_rows=0),
    )


def _tier_counts(table: evdb.Table) -> tuple[int, int]:
    dram = table.stats()["tiers"]["dram"]
    return int(dram["hits"]), int(dram["misses"])


def _split_counts(table: evdb.Table) -> dict[str, tuple[int, int]] | None:
    """The DRAM tier's hits and misses per op, where its stats split them (else None)."""
    dram = table.stats()["tiers"]["dram"]
    if "pull_hits" not in dram:
        return None
    return {op: (int(dram[f"{op}_hits"]), int(dram[f"{op}_misses"])) for op in OPS}


def simulate(
    trace: Trace,
    rows: Sequence[int],
    *,
    config: TableConfig | None = None,
    push: bool = True,
    progress: ProgressFn | None = None,
) -> PolicyCurve:
    """Replay the trace through miniature evdb tables, one per size in ``rows``.

    Each batch is pulled (or looked up) at its recorded step in every miniature (see
    ``miniature_config``); ``config`` defaults to the one in the trace's header. With
    ``push`` (the default, as training does) each pull is pushed a zero gradient: a push
    unpins the batch and evicts down to the watermark at once, at the pull's step, which
    moves the victims (and the next batch's hits) against a pull that waits for the next
    pull to evict. Without a disk tier, a miniature is made at least as big as the trace's
    largest batch (a table without one refuses a pull of more distinct keys than rows).
    ``progress(done, total)`` is called with batches replayed.
    """
    conf = _config(trace, config)
    sizes = np.asarray(rows, dtype=np.int64)
    if sizes.ndim != 1 or sizes.size == 0 or (sizes < 1).any():
        raise InvalidArgumentError(f"rows must be a non-empty list of ints >= 1, got {rows!r}")
    minis = [miniature_config(conf, int(r), trace.header.rate) for r in sizes]
    if conf.disk is None and trace.n_batches:
        widest = int(np.diff(trace.bounds).max())
        minis = [
            dataclasses.replace(
                m,
                dram=dataclasses.replace(
                    m.dram, capacity_rows=max(widest, m.dram.capacity_rows or 1)
                ),
            )
            for m in minis
        ]
    hits = {op: np.zeros(sizes.shape[0], dtype=np.int64) for op in OPS}
    misses = {op: np.zeros(sizes.shape[0], dtype=np.int64) for op in OPS}
    work = tempfile.mkdtemp(prefix="evdb-size-")
    try:
        with evdb.open(work) as db:
            tables = [_create(db, f"mini{i}", m) for i, m in enumerate(minis)]
            split = _split_counts(tables[0]) is not None  # else: read where the op changes
            first = int(trace.steps[0]) if trace.n_batches else 0
            db.advance(max(first, 0))
            ops, steps, b = trace.ops.tolist(), trace.steps.tolist(), trace.bounds.tolist()
            run_op, before = -1, [(0, 0)] * len(tables)
            for i in range(trace.n_batches):
                if ops[i] != run_op and not split:  # counters read where the op changes
                    _add(tables, before, run_op, hits, misses)
                    before, run_op = [_tier_counts(t) for t in tables], ops[i]
                if steps[i] > db.step:
                    db.advance(steps[i] - db.step)
                keys = trace.keys[b[i] : b[i + 1]]
                if keys.shape[0] == 0:  # the call kept no key: nothing for a miniature
                    continue
                for t in tables:
                    if ops[i] == 0:
                        pulled = t.pull(keys)
                        if push:
                            t.push(pulled, np.zeros((pulled.keys.shape[0], 1), np.float32))
                    else:
                        t.lookup(keys)
                if progress is not None and (i % 64 == 63 or i == trace.n_batches - 1):
                    progress(i + 1, trace.n_batches)
            if split:
                for j, t in enumerate(tables):
                    for op, (h, m) in (_split_counts(t) or {}).items():
                        hits[op][j], misses[op][j] = h, m
            else:
                _add(tables, before, run_op, hits, misses)
            db.close(flush=False)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    mini_rows = np.array([m.dram.capacity_rows for m in minis], dtype=np.int64)
    counted = {op: trace.counted_total(op) for op in OPS}
    return PolicyCurve(sizes, mini_rows, hits, misses, trace.header.rate, counted)


def _add(
    tables: list[evdb.Table],
    before: list[tuple[int, int]],
    op: int,
    hits: dict[str, Int64Array],
    misses: dict[str, Int64Array],
) -> None:
    if op < 0:
        return
    for j, t in enumerate(tables):
        h, m = _tier_counts(t)
        hits[OPS[op]][j] += h - before[j][0]
        misses[OPS[op]][j] += m - before[j][1]


def _create(db: evdb.Database, name: str, c: TableConfig) -> evdb.Table:
    return db.create_table(
        name,
        dim=c.dim,
        initializer=c.initializer,
        admission=c.admission,
        optimizer=c.optimizer,
        ttl_steps=c.ttl_steps,
        dram=c.dram,
        disk=False if c.disk is None else c.disk,
    )


def _config(trace: Trace, config: TableConfig | None) -> TableConfig:
    if config is not None:
        if not isinstance(config, TableConfig):
            raise InvalidArgumentError(f"config must be a TableConfig, got {config!r}")
        return config
    if trace.header.config is None:
        raise InvalidArgumentError(
            "the trace names no table configuration (a user's key log): pass config="
            "TableConfig(...) (evdb size: --db PATH --table T)"
        )
    return TableConfig.from_dict(trace.header.config)


def candidate_rows(lru: LruCurve, *, extra: Sequence[int] = (), points: int = 12) -> list[int]:
    """Default sizes to simulate: ``points`` sizes spaced geometrically from 1/1000 of the
    distinct keys (at least 16 rows) to all of them, the LRU curve's rows for the default
    targets, and ``extra``."""
    top = max(lru.distinct_estimate, 16)
    grid = np.geomspace(max(16, top / 1000), top, points)
    lru_rows = [lru.rows_for(t) for t in DEFAULT_TARGETS]
    found = {round(x) for x in grid} | {r for r in lru_rows if r} | {int(r) for r in extra}
    return sorted(r for r in found if r >= 1)


@dataclass(frozen=True)
class SizingReport:
    """What ``evdb size`` prints: both curves, rows for the targets, the current size."""

    table: str
    rate: float
    accesses: int
    distinct: int
    batches: int
    targets: tuple[float, ...]
    current_rows: int | None
    lru: LruCurve
    policy: PolicyCurve | None

    @property
    def warnings(self) -> list[str]:
        out = []
        if self.policy is not None and (self.policy.mini_rows < MIN_MINIATURE_ROWS).any():
            small = int(self.policy.rows[self.policy.mini_rows < MIN_MINIATURE_ROWS].max())
            out.append(
                f"sizes up to {small:,} rows were simulated with miniatures of fewer than "
                f"{MIN_MINIATURE_ROWS} rows: their hit rates may be off by a few points "
                f"(record at a rate of at least {MIN_MINIATURE_ROWS / max(small, 1):.2g} to "
                "size them)"
            )
        if self.distinct < MIN_SAMPLED_KEYS:
            need = min(1.0, MIN_SAMPLED_KEYS / max(self.lru.distinct_estimate, 1))
            out.append(
                f"only {self.distinct} distinct keys were sampled (fewer than "
                f"{MIN_SAMPLED_KEYS}): the curves may be off by several points; record at a "
                f"rate of at least {need:.2g}"
            )
        return out

    def to_dict(self, n_bins: int = 100) -> dict[str, Any]:
        policy = self.policy
        out: dict[str, Any] = {
            "table": self.table,
            "rate": self.rate,
            "sampled_accesses": self.accesses,
            "sampled_distinct_keys": self.distinct,
            "estimated_accesses": round(self.accesses / self.rate),
            "estimated_distinct_keys": self.lru.distinct_estimate,
            "current_dram_rows": self.current_rows,
            # the most the simulated sizes reach (the default grid goes up to every distinct
            # key): first accesses always miss, and admission and TTL turn keys away
            "highest_hit_rate": {
                "evdb": None if policy is None else _highest(policy.hit_rate()),
                "lru": _num(float(self.lru.hit_rate([np.inf])[0])),
            },
            "targets": {
                f"{t:g}": {
                    "evdb_rows": None if policy is None else policy.rows_for(t),
                    "lru_rows": self.lru.rows_for(t),
                }
                for t in self.targets
            },
            "curve": [],
            "torchrec": self.lru.torchrec_stats(self.batches, n_bins),
            "warnings": self.warnings,
        }
        if policy is not None:
            lru = self.lru.hit_rate(policy.rows)
            pull = policy.hit_rate("pull")
            look = policy.hit_rate("lookup")
            out["curve"] = [
                {
                    "dram_rows": int(r),
                    "miniature_rows": int(m),
                    "evdb_hit_rate": _num(pull[i]),
                    "evdb_lookup_hit_rate": _num(look[i]),
                    "lru_hit_rate": _num(lru[i]),
                    "reliable": bool(m >= MIN_MINIATURE_ROWS),  # see MIN_MINIATURE_ROWS
                }
                for i, (r, m) in enumerate(zip(policy.rows, policy.mini_rows, strict=True))
            ]
            if self.current_rows is not None:
                at = np.flatnonzero(policy.rows == self.current_rows)
                if at.size:
                    out["current_hit_rate"] = {"dram": _num(pull[int(at[0])])}
        return out


def _highest(rates: np.ndarray) -> float | None:
    return None if np.isnan(rates).all() else _num(float(np.nanmax(rates)))


def _num(x: float) -> float | None:
    return None if np.isnan(x) else round(float(x), 6)


def size_table(
    trace: Trace,
    *,
    rows: Sequence[int] | None = None,
    targets: Sequence[float] = DEFAULT_TARGETS,
    config: TableConfig | None = None,
    simulate_policy: bool = True,
    progress: ProgressFn | None = None,
) -> SizingReport:
    """The whole analysis ``evdb size`` runs: the LRU curve, then (``simulate_policy``) the
    miniature simulation at ``rows`` (default ``candidate_rows``, plus the table's current
    ``dram_rows``)."""
    for t in targets:
        if not 0.0 < t <= 1.0:
            raise InvalidArgumentError(f"targets must be in (0, 1], got {t!r}")
    lru = lru_curve(trace)
    conf = None
    if simulate_policy or config is not None or trace.header.config is not None:
        conf = _config(trace, config)  # a user's log without config= can only get LRU
    current = None if conf is None else conf.dram.capacity_rows
    policy = None
    if simulate_policy:
        sizes = list(rows) if rows else candidate_rows(lru, extra=[current] if current else [])
        if rows and current:
            sizes = sorted({*sizes, current})
        policy = simulate(trace, sizes, config=conf, progress=progress)
    n_pull_batches = int(np.count_nonzero(trace.ops == OPS.index("pull")))
    return SizingReport(
        trace.header.table,
        trace.header.rate,
        lru.accesses,
        lru.distinct,
        n_pull_batches,
        tuple(targets),
        current,
        lru,
        policy,
    )
