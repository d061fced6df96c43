"""The DRAM tier: the tier and cache-role contracts, eviction and pinning; the same cache over
the reference kernels passes the role's contract too (the tier is parameterised by its kernel
backend, as an HBM tier is by the gpu one)."""

from __future__ import annotations

import numpy as np
import pytest

from evdb.config import DramConfig
from evdb.kernels import backend
from evdb.tiers.base import CacheTier
from evdb.tiers.cache import ColumnCache
from evdb.tiers.dram import dram_tier

from .cache_contract import CacheContract, Factory
from .contract import DIM, SLOTS, records


class TestDramTier(CacheContract):
    @pytest.fixture
    def make(self) -> Factory:
        return lambda capacity_rows=None: dram_tier(
            DIM, SLOTS, DramConfig(capacity_rows=capacity_rows)
        )

    @pytest.fixture
    def cache(self, make: Factory) -> CacheTier:
        return make()


class TestCacheOnReferenceKernels(CacheContract):
    """The cache over the plain-numpy specification of every kernel it runs."""

    @pytest.fixture
    def make(self) -> Factory:
        return lambda capacity_rows=None: ColumnCache(
            DIM,
            SLOTS,
            DramConfig(capacity_rows=capacity_rows),
            name="dram",
            device="cpu",
            xp=np,
            kernels=backend("reference"),
        )

    @pytest.fixture
    def cache(self, make: Factory) -> CacheTier:
        return make()


def evict(
    tier: CacheTier, step: int, min_live_step: int, protect: np.ndarray | None = None
) -> None:
    """What a chain with nothing below does: remove the victims for good."""
    victims, expired = tier.choose_victims(step, min_live_step, protect)
    tier.remove_rows(victims)
    tier.count_evictions(expired)


def filled(capacity: int, n: int, eviction: str = "lfu") -> ColumnCache:
    tier = dram_tier(DIM, SLOTS, DramConfig(capacity_rows=capacity, eviction=eviction))
    recs = records(n)
    recs.freq[:] = np.arange(n, dtype=np.uint32)  # key i has frequency i
    recs.last_step[:] = 0
    tier.put(np.arange(n, dtype=np.int64), recs)
    return tier


def test_eviction_drops_the_lowest_frequency_rows_to_the_low_watermark() -> None:
    tier = filled(100, 120)
    evict(tier, 0, -(2**63))
    assert len(tier) == 95  # (1 - 0.05) * capacity
    found, _ = tier.get(np.arange(120, dtype=np.int64))
    assert (~found).nonzero()[0].tolist() == list(range(25))
    assert tier.stats()["evictions"] == 25


def test_lfu_ages_with_steps_and_lru_uses_last_step() -> None:
    tier = filled(10, 12)
    tier.last_step[tier.locate(np.array([11], np.int64))] = -100_000  # hot long ago
    evict(tier, 0, -(2**63))
    assert not tier.get(np.array([11], np.int64))[0][0]
    lru = filled(10, 12, eviction="lru")
    lru.last_step[lru.locate(np.arange(12, dtype=np.int64))] = np.arange(12)[::-1]
    evict(lru, 20, -(2**63))
    assert lru.get(np.arange(12, dtype=np.int64))[0].nonzero()[0].tolist() == list(range(9))


def test_pinned_and_protected_rows_are_never_victims() -> None:
    tier = filled(100, 120)
    tier.pin(tier.locate(np.arange(10, dtype=np.int64)))  # the coldest rows
    evict(tier, 0, -(2**63), protect=tier.locate(np.arange(10, 20, dtype=np.int64)))
    found, _ = tier.get(np.arange(120, dtype=np.int64))
    assert found[:20].all()
    assert len(tier) == 95


def test_expired_rows_go_first_and_are_counted_apart() -> None:
    tier = filled(100, 110)
    hot_but_old = np.arange(100, 110, dtype=np.int64)
    tier.last_step[tier.locate(hot_but_old)] = -50
    evict(tier, 0, -10)
    assert not tier.get(hot_but_old)[0].any()
    assert tier.stats()["expired_evictions"] == 10
    assert tier.stats()["evictions"] == 5


@pytest.mark.parametrize("eviction", ["lfu", "lru"])
@pytest.mark.parametrize("seed", range(4))
def test_victims_are_the_lowest_scores_of_the_rows_allowed(eviction: str, seed: int) -> None:
    """choose_victims against a brute-force model: exactly len - watermark victims (or every
    candidate, if fewer), none pinned unless expired, none protected, no freed row, expired
    rows first, and no candidate left with a lower score than a victim."""
    rng = np.random.default_rng(seed)
    n, cap = 3000, 2000
    tier = dram_tier(DIM, SLOTS, DramConfig(capacity_rows=cap, eviction=eviction))
    recs = records(n)
    recs.freq[:] = rng.integers(0, 50, n).astype(np.uint32)
    recs.last_step[:] = rng.integers(0, 400, n)
    keys = rng.permutation(10 * n)[:n].astype(np.int64)
    tier.put(keys, recs)
    tier.remove(keys[rng.random(n) < 0.1])  # freed rows in the middle of the slab
    live = tier.live_rows()
    tier.pin(live[rng.random(live.shape[0]) < (0.2 if seed < 3 else 0.99)])
    protect = live[rng.random(live.shape[0]) < 0.1]
    protect = protect[~tier.is_pinned[protect]]
    step, min_live = 450, 60

    victims, expired = tier.choose_victims(step, min_live, protect)

    dead = tier.last_step < min_live
    allowed = tier.is_live & (~tier.is_pinned | dead)
    allowed[protect] = False
    candidates = np.flatnonzero(allowed[: tier.alloc.high_water])
    want = min(len(tier) - int(cap * 0.95), candidates.shape[0])
    assert victims.shape[0] == want == np.unique(victims).shape[0]
    assert allowed[victims].all()
    np.testing.assert_array_equal(expired, dead[victims])
    if eviction == "lfu":
        age = np.maximum(step - tier.last_step, 0)
        score = tier.freq * np.exp2(-age / tier.config.half_life_steps)
    else:
        score = tier.last_step.astype(np.float64)
    score[dead] = -np.inf
    rest = np.setdiff1d(candidates, victims)
    if rest.shape[0] and victims.shape[0]:
        assert score[victims].max() <= score[rest].min()
    tier.remove_rows(victims)  # what the chain does next: the tier stays consistent
    assert len(tier) == live.shape[0] - want


def test_an_empty_tier_states_no_bytes_a_row_and_a_filled_one_its_bytes_over_rows() -> None:
    # An empty tier's index bytes over no row are not what a row costs: None, not a number
    tier = dram_tier(DIM, SLOTS, DramConfig(capacity_rows=None))
    empty = tier.stats()
    assert empty["bytes_per_row"] is None and empty["bytes_per_row_by_component"] is None
    tier.put(np.arange(10, dtype=np.int64), records(10))
    s = tier.stats()
    assert s["bytes_per_row"] == pytest.approx(s["bytes"] / 10)
    assert sum(s["bytes_per_row_by_component"].values()) == pytest.approx(s["bytes_per_row"])


def test_sharded_stats_keep_bytes_a_row_per_shard_instead_of_summing_them() -> None:
    from evdb.distributed.table import _merge_stats

    tiers = [dram_tier(DIM, SLOTS, DramConfig(capacity_rows=None)) for _ in range(2)]
    tiers[0].put(np.arange(10, dtype=np.int64), records(10))  # the other shard stays empty
    merged = _merge_stats([{"tiers": {"dram": t.stats()}} for t in tiers])["tiers"]["dram"]
    assert merged["rows"] == 10
    assert "bytes_per_row" not in merged and "bytes_per_row_by_component" not in merged
