"""The RocksDB tier: the shared contract, key order, float16 storage."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from evdb.tiers.keyfilter import KeyFilter
from evdb.tiers.rocks import RocksTier, decode_keys, encode_keys
from evdb.tiers.store import RocksStore

from .contract import DIM, SLOTS, TierContract, assert_same, records


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


# -- read ahead -------------------------------------------------------------------------------
def _stored(store: RocksStore, n: int = 200) -> RocksTier:
    tier = RocksTier(store, "t.x", DIM, SLOTS)
    tier.put(np.arange(n, dtype=np.int64), records(n))
    return tier


def test_a_get_after_prefetch_takes_the_rows_read_ahead_and_reads_the_rest(
    store: RocksStore,
) -> None:
    tier = _stored(store)
    ahead = np.arange(150, 250, dtype=np.int64)  # 50 stored, 50 never written (filtered)
    tier.prefetch(ahead)
    assert tier.stats()["read_ahead"] <= 55  # only keys the filter lets through are read
    keys = np.random.default_rng(1).permutation(np.arange(100, 250, dtype=np.int64))
    found, got = tier.get(keys)
    assert found.tolist() == (keys < 200).tolist()
    assert_same(got, records(200).take(keys[found]))  # in the order of keys
    # 150..199 came from the read ahead, 100..149 were read now
    assert tier.stats()["read_ahead_used"] == tier.stats()["read_ahead"] >= 50
    assert tier.stats()["hits"] == 100


def test_rows_written_or_removed_after_prefetch_are_read_again(store: RocksStore) -> None:
    tier = _stored(store)
    keys = np.arange(0, 40, dtype=np.int64)
    tier.prefetch(keys)
    assert tier._ahead is not None
    tier._ahead.future.result()  # the read is done, and has not been collected yet
    newer = records(10, seed=9)
    stored = np.ones(10, dtype=bool)  # (told, so that the writes themselves read nothing)
    tier.put(keys[:10], newer, existed=stored)
    tier.remove(keys[10:20], present=stored)
    found, got = tier.get(keys)
    assert found.tolist() == [True] * 10 + [False] * 10 + [True] * 20
    assert_same(got.take(np.arange(10)), newer)
    assert_same(got.take(np.arange(10, 30)), records(200).take(keys[20:]))
    # once collected, a write drops the key from the read ahead at once
    newest = records(10, seed=10)
    tier.put(keys[20:30], newest)
    tier.put(keys[10:12], records(2, seed=11))
    found, got = tier.get(keys)
    assert found.sum() == 32
    assert_same(got.take(np.arange(12, 22)), newest)
    assert_same(got.take(np.arange(10, 12)), records(2, seed=11))


def test_a_write_while_the_read_ahead_waits_to_run_wins(store: RocksStore) -> None:
    tier = _stored(store)
    gate = threading.Event()
    store.read_later(lambda: gate.wait(30))  # the reader is busy: the read ahead waits
    keys = np.arange(50, 60, dtype=np.int64)
    tier.prefetch(keys)
    newer = records(10, seed=5)
    tier.put(keys, newer, existed=np.ones(10, dtype=bool))  # (a read would wait for the gate)
    gate.set()
    found, got = tier.get(keys)
    assert found.all()
    assert_same(got, newer)


def test_a_read_ahead_that_failed_is_read_again(
    store: RocksStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = _stored(store)

    def failing(read: object) -> Future[object]:
        f: Future[object] = Future()
        f.set_exception(OSError("disk went away"))
        return f

    monkeypatch.setattr(store, "read_later", failing)
    keys = np.arange(0, 30, dtype=np.int64)
    tier.prefetch(keys)
    found, got = tier.get(keys)
    assert found.all() and tier.stats()["read_ahead_used"] == 0
    assert_same(got, records(200).take(keys))


def test_closing_or_dropping_waits_for_the_read_ahead(tmp_path: Path) -> None:
    store = RocksStore(tmp_path / "rocks", {})
    tier = RocksTier(store, "t.x", DIM, SLOTS)
    tier.put(np.arange(100, dtype=np.int64), records(100))
    gate = threading.Event()
    store.read_later(lambda: gate.wait(30))
    tier.prefetch(np.arange(100, dtype=np.int64))
    pending = tier._ahead
    assert pending is not None and not pending.future.done()
    threading.Timer(0.05, gate.set).start()
    store.drop_column_family("t.x")  # waits for the read: it never sees a dropped family
    assert pending.future.done() and len(pending.future.result()) == 100
    other = RocksTier(store, "t.y", DIM, SLOTS)
    other.put(np.arange(10, dtype=np.int64), records(10))
    other.prefetch(np.arange(10, dtype=np.int64))
    store.close()
    assert other._ahead is not None and other._ahead.future.done()


def test_rows_evicted_unchanged_are_not_written_again(tmp_path: Path) -> None:
    """Write-back writes dirty rows only: rows read up from disk (a promoting lookup, a pull
    not followed by a push of them) and evicted unchanged cost RocksDB no write; rows
    pushed are written once when evicted."""
    import evdb

    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("t", dim=4, dram_rows=50, optimizer=evdb.optim.SGD(lr=0.1))
        t.upsert(np.arange(1000), np.ones((1000, 4), np.float32))  # most rows spill
        db.flush()
        tier = t._chain.backing
        assert isinstance(tier, RocksTier)
        written: list[np.ndarray] = []
        put = tier.put
        tier.put = lambda keys, *a, **kw: (written.append(keys.copy()), put(keys, *a, **kw))[1]  # type: ignore[method-assign]
        read_up = np.arange(100, 130)
        assert not t.resident(read_up).any()
        t.lookup(read_up, promote=True)
        pulled_only = np.arange(200, 230)
        t.pull(pulled_only)  # promoted for training, never pushed
        pushed = np.arange(300, 310)
        p = t.pull(pushed)
        t.push(p, np.ones((p.keys.shape[0], 4), np.float32))
        t.upsert(np.arange(5000, 5500), np.zeros((500, 4), np.float32))  # evictions
        unchanged = np.concatenate([read_up, pulled_only])
        evicted = unchanged[~t.resident(unchanged)]
        assert evicted.shape[0] >= 30
        db.flush()  # writes what is dirty: the pushed rows, wherever they are
        out = np.concatenate(written)
        assert not np.isin(out, evicted).any()
        assert np.isin(pushed, out).all()
        np.testing.assert_allclose(t.lookup(pushed), np.full((10, 4), 0.9, np.float32))
