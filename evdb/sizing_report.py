"""What ``evdb size`` reports: both curves, the rows for hit-rate targets, the hit rate at the
table's current size, and warnings where the sample is too small to answer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from evdb.sizing_lru import LruCurve

if TYPE_CHECKING:
    from evdb.sizing import PolicyCurve

__all__ = ["MIN_MINIATURE_ROWS", "MIN_SAMPLED_KEYS", "SizingReport"]

# Fewer sampled distinct keys than this and a miniature's answer rests on too few keys to
# trust (SHARDS' fixed-size variant keeps 8K; at 1K the ATC'17 miniatures were within ~1 point
# on the traces it measured). The report says so instead of hiding it.
MIN_SAMPLED_KEYS = 1000
# A miniature cache smaller than this answers with a spread of a point or more: how many of
# the keys near the cache's edge the sample kept decides how much of its few rows the rest
# gets. Zipf(1.1), 10M accesses, 5,000 rows against the unsampled simulation: ~290-row
# miniatures (min_keys=32,768), eight hash seeds from -2.27 to +0.63 points (sd 0.99);
# 1,000-row ones (rate 0.2), seven seeds from -1.36 to +0.30; 2,000-row ones (rate 0.4),
# -0.63 to +0.15. At 30M accesses a 193-row one was 2.72 low. (evdb.sizing.MINIATURE_ROWS)
MIN_MINIATURE_ROWS = 2048


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
        small_mini = None if self.policy is None else _small_miniatures(self.policy)
        if small_mini is not None and small_mini.any():
            assert self.policy is not None
            small = int(self.policy.rows[small_mini].max())
            out.append(
                f"sizes up to {small:,} rows were simulated with miniatures of fewer than "
                f"{MIN_MINIATURE_ROWS:,} rows: their hit rates may be off by a point or more "
                f"(record at a rate of at least {MIN_MINIATURE_ROWS / max(small, 1):.2g}, or "
                "with a larger min_keys, to size them)"
            )
        if self.distinct < MIN_SAMPLED_KEYS:
            need = min(1.0, MIN_SAMPLED_KEYS / max(self.lru.distinct_estimate, 1))
            out.append(
                f"only {self.distinct} distinct keys were sampled (fewer than "
                f"{MIN_SAMPLED_KEYS}): the curves may be off by several points; record at a "
                f"rate of at least {need:.2g} (or with min_keys of at least {MIN_SAMPLED_KEYS})"
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
            "tier": "dram" if policy is None else policy.tier,
            "current_dram_rows"
            if policy is None or policy.tier == "dram"
            else "current_hbm_rows": (self.current_rows),
            # the most the simulated sizes reach (the default grid goes up to every distinct
            # key): first accesses always miss, and admission and TTL turn keys away
            "highest_hit_rate": {
                "evdb": None if policy is None else _highest(policy.sized_hit_rate()),
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
            pull = policy.sized_hit_rate("pull")
            look = policy.sized_hit_rate("lookup")
            rates = np.broadcast_to(np.asarray(policy.rate, dtype=np.float64), pull.shape)
            hbm, dram = policy.hbm_hit_rate("pull"), policy.dram_tier_hit_rate("pull")
            small_mini = _small_miniatures(policy)
            out["curve"] = [
                {
                    f"{policy.tier}_rows": int(r),
                    "miniature_rows": int(m),
                    "miniature_rate": round(float(rates[i]), 8),
                    "evdb_hit_rate": _num(pull[i]),
                    "evdb_lookup_hit_rate": _num(look[i]),
                    "lru_hit_rate": _num(lru[i]),
                    "reliable": not bool(small_mini[i]),  # see MIN_MINIATURE_ROWS
                }
                | (
                    {}
                    if hbm is None
                    else {
                        "hbm_hit_rate": _num(hbm[i]),
                        "hbm_or_dram_hit_rate": _num(policy.hit_rate("pull")[i]),
                        "dram_tier_hit_rate": _num(dram[i]),
                    }
                )
                for i, (r, m) in enumerate(zip(policy.rows, policy.mini_rows, strict=True))
            ]
            if self.current_rows is not None:
                at = np.flatnonzero(policy.rows == self.current_rows)
                if at.size:
                    j = int(at[0])
                    out["current_hit_rate"] = {"dram": _num(dram[j])}
                    if hbm is not None:
                        out["current_hit_rate"]["hbm"] = _num(hbm[j])
        return out


def _small_miniatures(policy: PolicyCurve) -> np.ndarray:
    """Per size, whether its miniature is too small to trust (a sampled one under
    MIN_MINIATURE_ROWS rows; at rate 1 the miniature is the table itself)."""
    rates = np.broadcast_to(np.asarray(policy.rate, dtype=np.float64), policy.rows.shape)
    return (policy.mini_rows < MIN_MINIATURE_ROWS) & (rates < 1.0)


def _highest(rates: np.ndarray) -> float | None:
    return None if np.isnan(rates).all() else _num(float(np.nanmax(rates)))


def _num(x: float) -> float | None:
    return None if np.isnan(x) else round(float(x), 6)
