"""A bounded DRAM tier with no lower tier: eviction by score, the batch in flight, errors."""

from __future__ import annotations

import numpy as np
import pytest

import evdb


def test_table_stays_within_capacity_after_every_call(db) -> None:
    t = db.create_table("t", dim=2, disk=False, dram_rows=50)
    rng = np.random.default_rng(0)
    for _ in range(30):
        p = t.pull(rng.integers(0, 500, 40))
        assert len(t) <= 50
        t.push(p, np.zeros((p.keys.shape[0], 2)))
        t.upsert(rng.integers(0, 500, 10), np.ones((10, 2)))
        assert len(t) <= 50
        db.advance()
    s = t.stats()["tiers"]["dram"]
    assert s["evictions"] > 0 and s["rows"] == len(t)


def test_frequent_keys_survive_eviction(db) -> None:
    t = db.create_table("t", dim=2, disk=False, dram_rows=100)
    hot = np.arange(20)
    for _ in range(10):
        t.pull(hot)
    for start in range(1000, 2000, 50):  # a stream of one-off keys
        t.pull(np.arange(start, start + 50))
    assert t.contains(hot).all()


def test_rows_of_the_batch_in_flight_are_never_victims(db) -> None:
    t = db.create_table("t", dim=2, disk=False, dram_rows=100)
    t.upsert(np.arange(1000, 1100), np.ones((100, 2)))
    for _ in range(5):
        t.pull(np.arange(1000, 1100))  # make the resident rows hot
    batch = np.arange(60)  # cold, brand-new keys: the lowest scores in the table
    p = t.pull(batch)
    assert t.contains(batch).all()
    t.upsert(np.arange(5000, 5030), np.ones((30, 2)))  # forces more eviction
    assert t.contains(batch).all()  # still pinned until push
    t.push(p, np.ones((60, 2)))
    assert (t.lookup(batch) != t.config.initializer.values(batch, 2)).all()  # update landed
    t.upsert(np.arange(6000, 6040), np.ones((40, 2)))
    assert not t.contains(batch).all()  # after push they are ordinary (cold) rows again


def test_next_pull_releases_the_previous_batch(db) -> None:
    t = db.create_table("t", dim=2, disk=False, dram_rows=10)
    t.pull(np.arange(10))
    t.pull(np.arange(100, 110))  # needs every slot: the first batch must go
    assert t.contains(np.arange(100, 110)).all() and len(t) == 10


def test_a_batch_larger_than_capacity_raises_and_changes_nothing(db) -> None:
    t = db.create_table(
        "t", dim=2, disk=False, dram_rows=10, admission=evdb.admission.Counter(min_count=2)
    )
    t.pull(np.arange(5))
    before = (len(t), t.stats())
    with pytest.raises(evdb.CapacityError, match=r"11 distinct keys, more than dram_rows=10"):
        t.pull(np.arange(100, 111))
    with pytest.raises(ValueError, match="no lower tier"):
        t.upsert(np.arange(200, 211), np.ones((11, 2)))
    assert (len(t), t.stats()) == before
    assert not t.pull([100]).admitted[0]  # the failed pull counted nothing


def test_upsert_cannot_evict_the_batch_in_flight(db) -> None:
    t = db.create_table("t", dim=2, disk=False, dram_rows=10)
    t.pull(np.arange(8))
    with pytest.raises(evdb.CapacityError, match="plus 8 rows of the batch in flight need 13"):
        t.upsert(np.arange(100, 105), np.ones((5, 2)))
    t.upsert(np.arange(100, 102), np.ones((2, 2)))
    assert t.contains(np.arange(8)).all() and len(t) <= 10
