"""``ChainTier``: a DRAM-over-RocksDB chain seen as one tier (the backing of the HBM tier). The
shared contract for each shape of chain, then what the cache above relies on: reads in key
order from both levels, exact ``len``, nothing dropped on its own, flush to the bottom,
removal-safe scans and persistence."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from evdb.config import DramConfig, HbmConfig
from evdb.errors import ConfigError
from evdb.tiers.chain import ChainTier, TierChain, stack
from evdb.tiers.dram import dram_tier
from evdb.tiers.hbm import hbm_tier
from evdb.tiers.rocks import RocksTier
from evdb.tiers.store import RocksStore

from .contract import DIM, SLOTS, TierContract, assert_same, records


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RocksStore]:
    s = RocksStore(tmp_path / "rocks", {})
    yield s
    s.close()


def chain_tier(store: RocksStore | None, cap: int | None = 8, spill: bool = True) -> ChainTier:
    rocks = None if store is None else RocksTier(store, "t.x", DIM, SLOTS)
    dram = dram_tier(DIM, SLOTS, DramConfig(capacity_rows=cap))
    return ChainTier(TierChain(dram, rocks, spill=spill, track_steps=False), step=lambda: 0)


def rocks_of(tier: ChainTier) -> RocksTier:
    assert isinstance(tier.chain.backing, RocksTier)
    return tier.chain.backing


class TestSpillingChainTier(TierContract):
    """DRAM of 8 rows over RocksDB: almost every row of the contract lives on disk."""

    @pytest.fixture
    def tier(self, store: RocksStore) -> ChainTier:
        return chain_tier(store)


class TestDramOnlyChainTier(TierContract):
    """An unbounded DRAM tier that persists into RocksDB at flush (disk=False)."""

    @pytest.fixture
    def tier(self, store: RocksStore) -> ChainTier:
        return chain_tier(store, cap=None, spill=False)


class TestBareChainTier(TierContract):
    @pytest.fixture
    def tier(self) -> ChainTier:
        return chain_tier(None, cap=None, spill=False)


def test_put_beyond_the_cache_writes_victims_down_and_get_reads_both_levels(
    store: RocksStore,
) -> None:
    tier = chain_tier(store, cap=10)
    keys = np.arange(100, dtype=np.int64) * 7 - 300
    recs = records(100)
    tier.put(keys, recs)
    assert len(tier.chain.cache) <= 10 and len(rocks_of(tier)) >= 90
    assert len(tier) == 100 and not tier.is_empty()
    order = np.random.default_rng(1).permutation(100)
    ask = np.concatenate([keys[order], [10**15]])
    found, got = tier.get_for(ask, "lookup")  # get, counted as a lookup's reads
    assert found.tolist() == [True] * 100 + [False]
    assert_same(got, recs.take(order))  # in the order asked, whichever level held each row
    s = tier.levels()
    assert list(s) == ["dram", "rocksdb"]
    assert s["dram"]["lookup_hits"] + s["dram"]["lookup_misses"] == 101
    assert s["dram"]["pull_hits"] + s["dram"]["pull_misses"] == 0
    reads = tier.chain.read_counts()["lookup"]
    assert reads["dram"] + reads["rocksdb"] == 100 and reads["not_found"] == 1
    assert s["dram"]["written_back"] >= 90


def test_rows_are_kept_until_removed_even_when_their_step_is_long_past(store: RocksStore) -> None:
    tier = chain_tier(store, cap=4)
    tier.step = lambda: 10**9  # every row's last_step is far behind: all would be expired
    tier.put(np.arange(50, dtype=np.int64), records(50))
    assert len(tier) == 50 and tier.get(np.arange(50, dtype=np.int64))[0].all()
    assert tier.chain.cache.expired_evictions == 0  # victims went down, none was dropped


def test_put_trusts_existed_for_keys_below_and_keeps_len_exact(store: RocksStore) -> None:
    tier = chain_tier(store, cap=4)
    keys = np.arange(40, dtype=np.int64)
    tier.put(keys, records(40))
    rocks_reads = rocks_of(tier).counters["hits"] + rocks_of(tier).counters["misses"]
    again = np.arange(20, 60, dtype=np.int64)  # 20 stored (in DRAM or on disk), 20 new
    tier.put(again, records(40, seed=5), existed=again < 40)
    assert rocks_of(tier).counters["hits"] + rocks_of(tier).counters["misses"] == rocks_reads
    assert len(tier) == 60
    tier.put(np.arange(50, 70, dtype=np.int64), records(20, seed=6))  # existed unknown: read
    assert len(tier) == 70
    _, got = tier.get(np.array([25], np.int64))
    np.testing.assert_array_equal(got.values[0], records(40, seed=5).values[5])


def test_remove_reaches_every_level(store: RocksStore) -> None:
    tier = chain_tier(store, cap=6)
    keys = np.arange(30, dtype=np.int64)
    tier.put(keys, records(30))
    cached = tier.chain.cache.row_keys[tier.chain.cache.live_rows()]
    gone = np.concatenate([cached[:3], [29, 28, 1000]])
    gone = np.unique(gone)
    present = tier.remove(gone)
    assert present.tolist() == [int(k) < 30 for k in gone]
    assert len(tier) == 30 - int(present.sum())
    assert not tier.get(gone)[0].any()
    rocks = rocks_of(tier)
    assert sum(k.shape[0] for k in rocks.scan_keys(100)) == len(rocks)  # its count is exact


def test_scan_survives_removal_of_the_rows_it_yielded(store: RocksStore) -> None:
    tier = chain_tier(store, cap=16)
    keys = np.arange(-200, 200, dtype=np.int64)
    tier.put(keys, records(400))
    seen = []
    for part, recs in tier.scan(chunk_rows=7):
        assert part.shape[0] == len(recs)
        seen.append(part)
        tier.remove(part[::2], present=np.ones(part[::2].shape[0], dtype=bool))
    got = np.concatenate(seen)
    assert sorted(got.tolist()) == keys.tolist()  # each row once
    assert len(tier) == 400 - sum((p.shape[0] + 1) // 2 for p in seen)


def test_a_flush_above_reaches_the_bottom(store: RocksStore) -> None:
    hbm = hbm_tier(DIM, SLOTS, HbmConfig(capacity_rows=5, device="cpu"), DramConfig())
    dram = dram_tier(DIM, SLOTS, DramConfig(capacity_rows=12))
    top = stack(
        [hbm, dram], RocksTier(store, "t.x", DIM, SLOTS), spill=True, track_steps=True, step=int
    )
    keys = np.arange(60, dtype=np.int64)
    recs = records(60)
    recs.last_step[:] = 0
    top.create(keys, recs)  # 60 dirty rows in a 5-row cache
    top.evict(step=0, min_live=-(2**63))
    below = top.backing
    assert isinstance(below, ChainTier)
    assert len(hbm) <= 5 and len(dram) <= 12
    assert top.live_rows(-(2**63)) == 60
    top.flush()
    assert hbm.dirty_rows().size == 0 and dram.dirty_rows().size == 0
    assert len(rocks_of(below)) == 60  # every row on disk
    assert list(top.stats()) == ["hbm", "dram", "rocksdb"]
    found, got = rocks_of(below).get(keys)
    assert found.all()
    assert_same(got, recs)


def test_state_round_trips_through_to_arrays(store: RocksStore) -> None:
    tier = chain_tier(store, cap=5)
    tier.put(np.arange(30, dtype=np.int64), records(30))
    tier.flush()
    arrays = tier.to_arrays()
    fresh = chain_tier(store, cap=5)
    fresh.load_arrays(arrays)
    assert len(fresh) == 30 and fresh.chain.cache.evictions == tier.chain.cache.evictions
    assert_same(fresh.get(np.arange(30, dtype=np.int64))[1], records(30))
    dram_only = chain_tier(store, cap=None, spill=False)  # without spilling: loaded into DRAM
    dram_only.load_arrays(arrays)
    assert len(dram_only.chain.cache) == 30 and len(dram_only) == 30


def test_chains_that_would_lose_rows_are_refused(store: RocksStore) -> None:
    dram = dram_tier(DIM, SLOTS, DramConfig(capacity_rows=4))
    with pytest.raises(ConfigError, match="without steps"):
        ChainTier(TierChain(dram, None, spill=False, track_steps=True), step=int)
    with pytest.raises(ConfigError, match="does not spill"):
        ChainTier(TierChain(dram, None, spill=False, track_steps=False), step=int)
