"""The RocksDB tier: the shared contract, key order, float16 storage."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from evdb.tiers.keyfilter import KeyFilter
from evdb.tiers.rocks import RocksStore, RocksTier, decode_keys, encode_keys

from .contract import DIM, SLOTS, TierContract, records


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RocksStore]:
    s = RocksStore(tmp_path / "rocks", {})
    yield s
    s.close()


class TestRocksTier(TierContract):
    @pytest.fixture
    def tier(self, store: RocksStore) -> RocksTier:
        return RocksTier(store, "t.x", DIM, SLOTS)


int64s = st.integers(-(2**63), 2**63 - 1)


@given(st.lists(int64s, min_size=1, max_size=50))
def test_byte_order_of_encoded_keys_is_numeric_order(keys: list[int]) -> None:
    arr = np.array(keys, dtype=np.int64)
    encoded = encode_keys(arr)
    assert all(len(e) == 8 for e in encoded)
    assert sorted(encoded) == encode_keys(np.sort(arr))
    np.testing.assert_array_equal(decode_keys(b"".join(encoded)), arr)


def test_scan_comes_back_in_key_order_and_survives_removal_between_chunks(
    store: RocksStore,
) -> None:
    tier = RocksTier(store, "t.x", DIM, SLOTS)
    keys = np.random.default_rng(0).permutation(np.arange(-300, 300, dtype=np.int64))
    tier.put(keys, records(600))
    seen = []
    for chunk, _ in tier.scan(chunk_rows=64):
        seen.append(chunk)
        tier.remove(chunk[::2])  # removing rows already yielded does not disturb the scan
    assert np.concatenate(seen).tolist() == list(range(-300, 300))
    assert len(tier) == 300


def test_float16_storage_rounds_values_and_keeps_slots_exact(store: RocksStore) -> None:
    tier = RocksTier(store, "t.h", DIM, SLOTS, dtype="float16")
    recs = records(20)
    recs.values[0, 0] = 1e6  # beyond float16's range: stored as inf, and counted
    tier.put(np.arange(20, dtype=np.int64), recs)
    _, got = tier.get(np.arange(20, dtype=np.int64))
    np.testing.assert_array_equal(got.values[1:], recs.values[1:].astype(np.float16))
    assert np.isinf(got.values[0, 0])
    np.testing.assert_array_equal(got.slots, recs.slots)  # optimizer state stays float32
    np.testing.assert_array_equal(got.last_step, recs.last_step)
    assert tier.stats()["f16_overflow"] == 1


def test_known_presence_spares_the_read_and_keeps_len_exact(store: RocksStore) -> None:
    tier = RocksTier(store, "t.x", DIM, SLOTS)
    tier.put(np.arange(10, dtype=np.int64), records(10))
    reads = tier.stats()["hits"] + tier.stats()["misses"]
    tier.put(np.arange(5, 15, dtype=np.int64), records(10), existed=np.arange(5, 15) < 10)
    assert tier.stats()["hits"] + tier.stats()["misses"] == reads and len(tier) == 15
    tier.remove(np.array([0, 1], np.int64), present=np.ones(2, dtype=bool))
    assert len(tier) == 13 and tier.get(np.array([0, 2], np.int64))[0].tolist() == [False, True]


def test_key_filter_grows_without_false_negatives_and_round_trips() -> None:
    f = KeyFilter()
    rng = np.random.default_rng(3)
    added = rng.integers(-(2**63), 2**63 - 1, 300_000, dtype=np.int64, endpoint=True)
    for chunk in np.array_split(added, 7):
        f.add(chunk)
    assert len(f.stages) > 1  # the first stage holds 65,536 keys
    assert f.may_contain(added).all()
    others = rng.integers(-(2**63), 2**63 - 1, 200_000, dtype=np.int64, endpoint=True)
    assert f.may_contain(others).mean() < 0.01
    assert f.nbytes < 3 * added.shape[0]  # under 3 bytes per key, the last stage half full
    g = KeyFilter()
    g.load_arrays(f.to_arrays())
    np.testing.assert_array_equal(g.may_contain(others), f.may_contain(others))


def test_a_key_never_written_costs_no_read(store: RocksStore) -> None:
    tier = RocksTier(store, "t.x", DIM, SLOTS)
    tier.put(np.arange(100, dtype=np.int64), records(100))
    found, _ = tier.get(np.arange(50, 5050, dtype=np.int64))
    assert found.sum() == 50
    assert tier.stats()["filtered"] > 4900  # ruled out in memory (a few false positives)
    fresh = RocksTier(store, "t.x", DIM, SLOTS)
    fresh.load_arrays(tier.to_arrays())
    assert len(fresh) == 100 and fresh.get(np.arange(100, dtype=np.int64))[0].all()
