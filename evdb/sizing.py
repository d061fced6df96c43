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

import numpy as np

import evdb
from evdb._types import Int64Array
from evdb.admission import Bloom, Counter
from evdb.config import DiskConfig, HbmConfig, TableConfig
from evdb.errors import InvalidArgumentError
from evdb.sizing_kernels import one_thread
from evdb.sizing_lru import LruCurve, lru_curve, trace_accesses
from evdb.sizing_report import MIN_MINIATURE_ROWS, MIN_SAMPLED_KEYS, SizingReport
from evdb.trace import OPS, Trace
from evdb.trace_sample import FULL

__all__ = [
    "DEFAULT_TARGETS",
    "MINIATURE_ROWS",
    "MIN_MINIATURE_ROWS",
    "MIN_SAMPLED_KEYS",
    "SUBSAMPLE_KEYS",
    "LruCurve",
    "PolicyCurve",
    "SizingReport",
    "candidate_rows",
    "lru_curve",
    "miniature_config",
    "simulate",
    "size_table",
    "size_thresholds",
    "trace_accesses",
]

DEFAULT_TARGETS = (0.90, 0.95, 0.99)
ProgressFn = Callable[[int, int], None]
# A size is simulated on a subsample of the trace (its keys of hash under a lower threshold)
# when that still leaves its miniature this many rows: a large size needs no more, and the
# replay costs what the kept keys do (see size_thresholds).
MINIATURE_ROWS = 2048
# ... and keeps this many distinct keys (SHARDS' fixed-size default, FAST'15): at 1/4 of that a
# subsampled 80,000-row size missed by 1.9 points where the whole trace hit within 0.5.
SUBSAMPLE_KEYS = 8192


@dataclass(frozen=True)
class PolicyCurve:
    """Hit rates of evdb's own policy at candidate sizes of a tier, by miniature simulation.

    ``rows`` (k,) int64 the sizes asked for (of ``tier``), ``mini_rows`` (k,) int64 the
    miniature tables' sizes of that tier (rows x rate, at least 1), ``rate`` the rate each
    size's miniature was sampled at (a float, or (k,) float64: ``size_thresholds``), and per
    op ("pull", "lookup") the DRAM tier's hits and misses (k,) int64 summed over the replay;
    with an HBM tier, the HBM tier's too.
    """

    rows: Int64Array
    mini_rows: Int64Array
    hits: dict[str, Int64Array]
    misses: dict[str, Int64Array]
    rate: float | np.ndarray = 1.0
    counted: dict[str, int | None] = dataclasses.field(default_factory=dict)
    """Per op, the accesses the table counted unsampled (``Trace.counted_total``)."""
    tier: str = "dram"
    hbm_hits: dict[str, Int64Array] | None = None
    hbm_misses: dict[str, Int64Array] | None = None

    def hit_rate(self, op: str = "pull") -> np.ndarray:
        """Per size, the share of accesses a cache tier answered (DRAM, or HBM or DRAM where
        there is an HBM tier: what DRAM misses went below); NaN where the trace has no
        ``op`` call (SHARDS-adj where the trace knows the unsampled count, see the module's
        note)."""
        if self.hbm_hits is None:
            total = self.hits[op] + self.misses[op]
            return self._share(self.hits[op], total, self.misses[op], op)
        assert self.hbm_misses is not None
        total = self.hbm_hits[op] + self.hbm_misses[op]
        return self._share(total - self.misses[op], total, self.misses[op], op)

    def sized_hit_rate(self, op: str = "pull") -> np.ndarray:
        """The hit rate of the tier the sizes are of."""
        hbm = self.hbm_hit_rate(op) if self.tier == "hbm" else None
        return self.hit_rate(op) if hbm is None else hbm

    def hbm_hit_rate(self, op: str = "pull") -> np.ndarray | None:
        """Per size, the share of accesses the HBM tier answered (None: no HBM tier)."""
        if self.hbm_hits is None or self.hbm_misses is None:
            return None
        total = self.hbm_hits[op] + self.hbm_misses[op]
        return self._share(self.hbm_hits[op], total, self.hbm_misses[op], op)

    def dram_tier_hit_rate(self, op: str = "pull") -> np.ndarray:
        """Per size, the DRAM tier's own hit rate, of the accesses that reached it (the
        table's ``stats()["tiers"]["dram"]`` hits over hits and misses): under an HBM
        tier, (HBM-or-DRAM share - HBM share) / (1 - HBM share)."""
        both, hbm = self.hit_rate(op), self.hbm_hit_rate(op)
        if hbm is None:
            return both
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(hbm < 1.0, (both - hbm) / (1.0 - hbm), np.nan)

    def _share(
        self, hits: np.ndarray, total: np.ndarray, misses: np.ndarray, op: str
    ) -> np.ndarray:
        counted = self.counted.get(op)
        if counted is None or counted == 0:
            return np.where(total > 0, hits / np.maximum(total, 1), np.nan)
        return np.clip(1.0 - misses / self.rate / counted, 0.0, 1.0)

    def rows_for(self, target: float, op: str = "pull") -> int | None:
        """Fewest rows reaching ``target``, interpolated linearly between the simulated size
        below it and the first one that reaches it; None if none does. The rate is the
        sized tier's: ``hbm_hit_rate`` for ``tier="hbm"``, else ``hit_rate``."""
        rate = self.sized_hit_rate(op)
        ok = np.flatnonzero(rate >= target)
        if ok.size == 0:
            return None
        i = int(ok[0])
        if i == 0 or rate[i] == rate[i - 1]:
            return int(self.rows[i])
        lo, hi = float(self.rows[i - 1]), float(self.rows[i])
        frac = (target - rate[i - 1]) / (rate[i] - rate[i - 1])
        return math.ceil(float(lo + frac * (hi - lo)))


def miniature_config(
    config: TableConfig, rows: int, rate: float, *, tier: str = "dram"
) -> TableConfig:
    """The configuration of a miniature of ``config`` whose ``tier`` ("dram" or "hbm") holds
    ``rows`` full-scale rows: the same admission (its memory bounds scaled by ``rate``), TTL,
    eviction and disk tier, the other cache tier at its own size scaled by ``rate``; dim 1,
    zeros and SGD (a row's values do not steer any policy); an HBM tier emulated on the CPU
    (its caching logic is the same code)."""
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
    dram_rows = config.dram.capacity_rows
    hbm = None
    if tier == "hbm":
        if config.hbm is None:
            raise InvalidArgumentError("tier='hbm' needs a table with an HBM tier (hbm_rows)")
        hbm = HbmConfig(mini, device="cpu")
        dram_rows = None if dram_rows is None else max(1, round(dram_rows * rate))
    elif tier == "dram":
        if config.hbm is not None:
            hbm = HbmConfig(max(1, round(config.hbm.capacity_rows * rate)), device="cpu")
        dram_rows = mini
    else:
        raise InvalidArgumentError(f"tier must be 'dram' or 'hbm', got {tier!r}")
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
        hbm=hbm,
        disk=None if config.disk is None else DiskConfig(),
        dram=dataclasses.replace(config.dram, capacity_rows=dram_rows, initial_rows=0),
    )


def size_thresholds(trace: Trace, rows: Sequence[int], distinct: int | None = None) -> Int64Array:
    """Per size, the hash threshold of the subsample its miniature replays: the trace's own
    (``rate * 2**53``), halved while that leaves the miniature ``MINIATURE_ROWS`` rows and
    ``SUBSAMPLE_KEYS`` of the trace's ``distinct`` keys (default: counted), and stays at or
    above the rate the recorder was asked for (``TraceHeader.floor_rate``; a fixed-rate
    trace is never subsampled). A large size needs no more keys than that, and a small one
    keeps all the trace has."""
    top = round(trace.header.rate * FULL)
    floor = round((trace.header.floor_rate or trace.header.rate) * FULL)
    if distinct is None:
        distinct = int(np.unique(trace.keys).shape[0]) if floor < top else 0
    out = []
    for r in rows:
        t = top
        while (
            t // 2 >= floor
            and (t // 2) * int(r) >= MINIATURE_ROWS * FULL
            and distinct * (t // 2) >= SUBSAMPLE_KEYS * top
        ):
            t //= 2
        out.append(t)
    return np.array(out, dtype=np.int64)


def simulate(
    trace: Trace,
    rows: Sequence[int],
    *,
    config: TableConfig | None = None,
    tier: str = "dram",
    push: bool = True,
    progress: ProgressFn | None = None,
) -> PolicyCurve:
    """Replay the trace through miniature evdb tables, one per size in ``rows`` of ``tier``
    ("dram", or "hbm" for a table with an HBM tier).

    Each batch is pulled (or looked up) at its recorded step in every miniature (see
    ``miniature_config``), of the subsample ``size_thresholds`` picks for its size;
    ``config`` defaults to the one in the trace's header. With ``push`` (the default, as
    training does) each pull is pushed a zero gradient: a push unpins the batch and evicts
    down to the watermark at once, at the pull's step, which moves the victims (and the next
    batch's hits) against a pull that waits for the next pull to evict. Without a disk tier,
    a miniature's DRAM is made at least as big as the trace's largest batch (a table without
    one refuses a pull of more distinct keys than rows). ``progress(done, total)`` is called
    with batches replayed.
    """
    conf = _config(trace, config)
    sizes = np.asarray(rows, dtype=np.int64)
    if sizes.ndim != 1 or sizes.size == 0 or (sizes < 1).any():
        raise InvalidArgumentError(f"rows must be a non-empty list of ints >= 1, got {rows!r}")
    thresholds = size_thresholds(trace, sizes.tolist())
    groups = sorted(set(thresholds.tolist()), reverse=True)
    mini_rows = np.zeros(sizes.shape[0], dtype=np.int64)
    counts = {
        f"{tier_name}_{kind}": {op: np.zeros(sizes.shape[0], dtype=np.int64) for op in OPS}
        for tier_name in ("dram", "hbm")
        for kind in ("hits", "misses")
    }
    for g, threshold in enumerate(groups):
        at = np.flatnonzero(thresholds == threshold)
        sub = trace if threshold == round(trace.header.rate * FULL) else trace.subsample(threshold)
        minis = [miniature_config(conf, int(sizes[j]), threshold / FULL, tier=tier) for j in at]
        minis = [_fit_batches(m, sub) for m in minis]
        mini_rows[at] = [
            m.hbm.capacity_rows if tier == "hbm" and m.hbm else (m.dram.capacity_rows or 0)
            for m in minis
        ]

        def step(i: int, total: int, base: int = g * trace.n_batches) -> None:
            if progress is not None:
                progress(base + i, len(groups) * total)

        for name, per_op in _replay(sub, minis, push, step).items():
            for op, values in per_op.items():
                counts[name][op][at] = values
    rates = thresholds / FULL
    has_hbm = conf.hbm is not None
    return PolicyCurve(
        sizes,
        mini_rows,
        counts["dram_hits"],
        counts["dram_misses"],
        rates,
        {op: trace.counted_total(op) for op in OPS},
        tier=tier,
        hbm_hits=counts["hbm_hits"] if has_hbm else None,
        hbm_misses=counts["hbm_misses"] if has_hbm else None,
    )


def _fit_batches(mini: TableConfig, trace: Trace) -> TableConfig:
    """Without a disk tier, a bounded DRAM at least as big as the widest batch."""
    if mini.disk is not None or mini.dram.capacity_rows is None or not trace.n_batches:
        return mini
    widest = int(np.diff(trace.bounds).max())
    rows = max(widest, mini.dram.capacity_rows)
    return dataclasses.replace(mini, dram=dataclasses.replace(mini.dram, capacity_rows=rows))


def _replay(
    trace: Trace, minis: list[TableConfig], push: bool, progress: ProgressFn
) -> dict[str, dict[str, Int64Array]]:
    """Replay the trace through one table per config; per counter ("dram_hits",
    "dram_misses", "hbm_hits", "hbm_misses") and op, (len(minis),) int64."""
    work = tempfile.mkdtemp(prefix="evdb-size-")
    try:
        with evdb.open(work) as db, one_thread():
            tables = [_create(db, f"mini{i}", m) for i, m in enumerate(minis)]
            first = int(trace.steps[0]) if trace.n_batches else 0
            db.advance(max(first, 0))
            ops, steps, b = trace.ops.tolist(), trace.steps.tolist(), trace.bounds.tolist()
            for i in range(trace.n_batches):
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
                if i % 64 == 63 or i == trace.n_batches - 1:
                    progress(i + 1, trace.n_batches)
            out = {
                f"{tier}_{kind}": {op: np.zeros(len(tables), dtype=np.int64) for op in OPS}
                for tier in ("dram", "hbm")
                for kind in ("hits", "misses")
            }
            for j, t in enumerate(tables):
                tiers = t.stats()["tiers"]
                for tier in ("dram", "hbm"):
                    if tier in tiers:
                        for op in OPS:
                            out[f"{tier}_hits"][op][j] = int(tiers[tier][f"{op}_hits"])
                            out[f"{tier}_misses"][op][j] = int(tiers[tier][f"{op}_misses"])
            db.close(flush=False)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def _create(db: evdb.Database, name: str, c: TableConfig) -> evdb.Table:
    return db.create_table(
        name,
        dim=c.dim,
        initializer=c.initializer,
        admission=c.admission,
        optimizer=c.optimizer,
        ttl_steps=c.ttl_steps,
        dram=c.dram,
        hbm=c.hbm,
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


def candidate_rows(
    lru: LruCurve, *, extra: Sequence[int] = (), points: int = 12, limit: int | None = None
) -> list[int]:
    """Default sizes to simulate: ``points`` sizes spaced geometrically from 1/1000 of the
    distinct keys (at least 16 rows) to all of them, or to ``limit`` rows where that is
    fewer (an HBM tier above its DRAM tier's size), the LRU curve's rows for the default
    targets (at most ``limit``), and ``extra``."""
    top = max(lru.distinct_estimate, 16)
    if limit is not None:
        top = max(1, min(top, limit))
    grid = np.geomspace(max(16, top / 1000), top, points) if top >= 16 else np.array([top])
    lru_rows = [lru.rows_for(t) for t in DEFAULT_TARGETS]
    found = {round(x) for x in grid} | {r for r in lru_rows if r and r <= top}
    return sorted(r for r in found | {int(r) for r in extra} if r >= 1)


def size_table(
    trace: Trace,
    *,
    rows: Sequence[int] | None = None,
    targets: Sequence[float] = DEFAULT_TARGETS,
    config: TableConfig | None = None,
    simulate_policy: bool = True,
    tier: str = "dram",
    progress: ProgressFn | None = None,
) -> SizingReport:
    """The whole analysis ``evdb size`` runs: the LRU curve, then (``simulate_policy``) the
    miniature simulation at ``rows`` of ``tier`` (default ``candidate_rows``, plus the
    table's current size of that tier)."""
    for t in targets:
        if not 0.0 < t <= 1.0:
            raise InvalidArgumentError(f"targets must be in (0, 1], got {t!r}")
    lru = lru_curve(trace)
    conf = None
    if simulate_policy or config is not None or trace.header.config is not None:
        conf = _config(trace, config)  # a user's log without config= can only get LRU
    current = None if conf is None else conf.dram.capacity_rows
    if tier == "hbm":
        if conf is None or conf.hbm is None:
            raise InvalidArgumentError("tier='hbm' needs a table with an HBM tier (hbm_rows)")
        current = conf.hbm.capacity_rows
    policy = None
    if simulate_policy:
        # an HBM tier's default grid stops at the DRAM tier's size (HBM caches DRAM's rows)
        limit = conf.dram.capacity_rows if tier == "hbm" and conf is not None else None
        extra = [current] if current else []
        sizes = list(rows) if rows else candidate_rows(lru, extra=extra, limit=limit)
        if rows and current:
            sizes = sorted({*sizes, current})
        policy = simulate(trace, sizes, config=conf, tier=tier, progress=progress)
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
