"""Admission: counter and Bloom filters, through the table and as pure rules."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import evdb
from evdb.admission import from_dict
from evdb.errors import ConfigError


def test_counter_admits_on_the_pull_that_reaches_min_count(db) -> None:
    t = db.create_table("t", dim=4, admission=evdb.admission.Counter(min_count=3))
    p = t.pull([5, 6])
    assert p.admitted.tolist() == [False, False] and len(t) == 0
    np.testing.assert_array_equal(p.rows, t.config.initializer.values(p.keys, 4))
    p = t.pull([5, 6, 6])  # 5 -> 2, 6 -> 3: every occurrence in a batch counts
    assert dict(zip(p.keys.tolist(), p.admitted.tolist(), strict=True)) == {5: False, 6: True}
    assert t.contains([5, 6]).tolist() == [False, True]
    assert t.pull([5]).admitted.tolist() == [True]
    assert len(t) == 2
    assert t.stats()["admission"]["pending"] == 0


def test_a_single_batch_can_admit_a_key(db) -> None:
    t = db.create_table("t", dim=2, admission=evdb.admission.Counter(min_count=3))
    assert t.pull([9, 9, 9, 8]).admitted.tolist() == [True, False]


def test_lookup_never_counts_toward_admission(db) -> None:
    t = db.create_table("t", dim=2, admission=evdb.admission.Counter(min_count=2))
    for _ in range(5):
        t.lookup([1, 1, 1])
    assert t.pull([1]).admitted.tolist() == [False]


def test_admitted_row_starts_from_the_value_it_read_before(db) -> None:
    t = db.create_table("t", dim=8, admission=evdb.admission.Counter(min_count=2))
    before = t.lookup([77])
    assert not t.pull([77]).admitted[0]
    p = t.pull([77])
    assert p.admitted[0]
    np.testing.assert_array_equal(p.rows, before)
    np.testing.assert_array_equal(t.lookup([77]), before)


def test_counter_memory_stays_bounded_under_keys_that_never_repeat(db) -> None:
    t = db.create_table("t", dim=2, admission=evdb.admission.Counter(min_count=2, max_pending=5000))
    sizes = []
    for step in range(40):
        t.pull(np.arange(step * 1000, (step + 1) * 1000, dtype=np.int64))  # never repeats
        db.advance()
        sizes.append(t.stats()["admission"]["bytes"])
        assert t.stats()["admission"]["pending"] <= 5000
    assert len(t) == 0
    assert sizes[-1] == sizes[10]  # memory stopped growing once the bound was reached
    assert t.stats()["admission"]["forgotten"] >= 40 * 1000 - 5000


def test_counter_forgets_the_stalest_counts_first(db) -> None:
    t = db.create_table("t", dim=2, admission=evdb.admission.Counter(min_count=3, max_pending=10))
    t.pull([1, 1])  # key 1 at count 2, old
    db.advance()
    t.pull(np.arange(100, 109))  # 9 newer keys: 10 pending, at the bound
    db.advance()
    t.pull(np.arange(200, 205))  # over the bound: shed to 9, stalest (key 1) goes first
    assert t.pull([1]).admitted.tolist() == [False]  # its count restarted


def test_compact_forgets_pending_counts_older_than_the_ttl(db) -> None:
    t = db.create_table("t", dim=2, ttl_steps=3, admission=evdb.admission.Counter(min_count=2))
    t.pull([1])
    db.advance(4)
    t.pull([2])
    assert t.compact()["admission_forgotten"] == 1
    assert t.pull([1]).admitted.tolist() == [False]
    assert t.pull([2]).admitted.tolist() == [True]


def test_bloom_never_admits_late_and_rarely_early(db) -> None:
    capacity, rate = 20_000, 0.01
    t = db.create_table(
        "t",
        dim=2,
        admission=evdb.admission.Bloom(min_count=3, capacity=capacity, error_rate=rate),
    )
    keys = np.arange(capacity, dtype=np.int64) * 7919 + 11
    t.pull(np.repeat(keys, 2))  # every key at count 2: below min_count
    fresh = -np.arange(1, 2001, dtype=np.int64)
    early = t.pull(fresh).admitted.mean()  # count 1, admitted only through collisions
    assert early < 2 * rate
    p = t.pull(keys)  # count 3: never late
    assert p.admitted.all()


def test_bloom_is_sized_from_capacity_and_error_rate() -> None:
    b = evdb.admission.Bloom(capacity=1_000_000, error_rate=0.01)
    assert 9_500_000 < b.width < 9_700_000  # 9.59 counters per key
    assert b.n_hashes == 7


@pytest.mark.parametrize(
    "policy",
    [evdb.admission.Counter(min_count=3), evdb.admission.Bloom(min_count=3, capacity=1000)],
    ids=["counter", "bloom"],
)
def test_admission_progress_survives_reopen(tmp_path: Path, policy) -> None:
    with evdb.open(tmp_path) as db:
        t = db.create_table("t", dim=2, admission=policy)
        t.pull([1, 2, 2])
    with evdb.open(tmp_path) as db:
        p = db.table("t").pull([1, 2])
        assert p.admitted.tolist() == [False, True]
        assert db.table("t").pull([1]).admitted.tolist() == [True]


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda: evdb.admission.Counter(min_count=0), r"Counter.min_count must be in \[1"),
        (lambda: evdb.admission.Bloom(min_count=256), r"Bloom.min_count must be in \[1, 255\]"),
        (lambda: evdb.admission.Bloom(error_rate=1.5), "error_rate must be a float in"),
        (lambda: evdb.admission.Counter(max_pending=True), "max_pending must be an int"),
        (lambda: from_dict({"kind": "lottery"}), "unknown kind 'lottery'"),
    ],
)
def test_bad_admission_config_is_rejected(make, message) -> None:
    with pytest.raises(ConfigError, match=message):
        make()


def test_policy_is_a_pure_rule_on_counts() -> None:
    rule = evdb.admission.Counter(min_count=3)
    assert rule.admit(np.array([0, 2, 3, 9])).tolist() == [False, False, True, True]
    assert from_dict(rule.to_dict()) == rule
