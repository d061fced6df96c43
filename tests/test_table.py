"""Table semantics from the core-engine issue, one behaviour per test."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import evdb

EDGE = np.array([0, -1, 1, 2**63 - 1, -(2**63)], dtype=np.int64)


def snapshot(t: evdb.Table) -> dict[int, bytes]:
    return {
        k: v.tobytes() for keys, vals in t.items() for k, v in zip(keys.tolist(), vals, strict=True)
    }


def test_every_int64_is_a_valid_key(db) -> None:
    t = db.create_table("t", dim=3)
    values = np.arange(15, dtype=np.float32).reshape(5, 3)
    t.upsert(EDGE, values)
    np.testing.assert_array_equal(t.lookup(EDGE[::-1]), values[::-1])
    assert t.contains(EDGE).all() and len(t) == 5
    assert t.delete(EDGE[:2]) == 2
    assert t.contains(EDGE).tolist() == [False, False, True, True, True]


def test_lookup_of_a_missing_key_reads_its_initializer_and_stores_nothing(db) -> None:
    t = db.create_table("t", dim=6, initializer=evdb.init.Uniform(-1, 1, seed=3))
    got = t.lookup([10, 11, 10])
    np.testing.assert_array_equal(
        got, evdb.init.Uniform(-1, 1, seed=3).values(np.array([10, 11, 10], np.int64), 6)
    )
    assert len(t) == 0 and not t.contains([10]).any()


def test_constant_default_value(db) -> None:
    t = db.create_table(
        "t", dim=2, default_value=-3.0, admission=evdb.admission.Counter(min_count=2)
    )
    assert t.lookup([1]).tolist() == [[-3.0, -3.0]]
    p = t.pull([1])
    assert p.rows.tolist() == [[-3.0, -3.0]] and not p.admitted[0]
    # an admitted row still starts from its initializer, not the constant
    p = t.pull([1])
    np.testing.assert_array_equal(p.rows, t.config.initializer.values(p.keys, 2))


def test_lookup_accepts_and_fills_out(db) -> None:
    t = db.create_table("t", dim=4)
    t.upsert([1, 2], np.ones((2, 4)))
    out = np.full((3, 4), np.nan, np.float32)
    assert t.lookup([2, 1, 9], out=out) is out
    assert np.isfinite(out).all()
    with pytest.raises(
        ValueError, match=r"out must be a C-contiguous float32 array of shape \(3, 4\)"
    ):
        t.lookup([2, 1, 9], out=np.empty((3, 5), np.float32))


def test_pull_returns_unique_keys_inverse_and_rows(db) -> None:
    t = db.create_table("t", dim=2)
    t.upsert([4], [[1.0, 2.0]])
    p = t.pull([7, 4, 7, 4, 4])
    assert p.keys.tolist() == [7, 4]
    assert p.inverse.tolist() == [0, 1, 0, 1, 1]
    assert p.counts.tolist() == [2, 3]
    assert p.rows[1].tolist() == [1.0, 2.0]
    assert p.admitted.all()
    assert t.read_records(p.keys)[1].freq.tolist() == [2, 3]


def test_a_new_row_counts_the_pulls_that_admitted_it(db) -> None:
    t = db.create_table("t", dim=2, admission=evdb.admission.Counter(min_count=3))
    t.pull([5, 5])
    t.pull([5])
    assert t.read_records(np.array([5]))[1].freq.tolist() == [3]


def test_pull_with_counts_counts_each_key_that_many_times(db) -> None:
    """counts= (what a shard's owner passes): a key given once with count c is admitted and
    stamped exactly as c occurrences would be; positions (combine, per-position push) stay
    the keys given."""
    counter = evdb.admission.Counter(min_count=4)
    a = db.create_table("a", dim=2, admission=counter)
    b = db.create_table("b", dim=2, admission=counter)
    pa = a.pull([5, 6, 5, 5])
    pb = b.pull([5, 6, 5], counts=[2, 1, 1])
    assert pb.keys.tolist() == [5, 6] and pb.counts.tolist() == [2, 1]
    assert pa.admitted.tolist() == pb.admitted.tolist() == [False, False]
    a.pull([5, 6])
    pb = b.pull([6, 5], counts=[1, 1])
    assert pb.admitted.tolist() == [False, True]  # 5 reached 4 occurrences, 6 has 2
    assert b.read_records(np.array([5]))[1].freq.tolist() == [4]
    assert len(a) == len(b) == 1
    before = b.stats()
    for bad, message in (
        ([1, 0], r"counts\[1\] = 0"),
        ([1], r"shape \(2,\)"),
        ([1.0, 2.0], "integer"),
    ):
        with pytest.raises(evdb.EvdbError, match=message):
            b.pull([7, 8], counts=bad)
    assert b.stats() == before


def test_ttl_expires_strictly_after_ttl_steps(db) -> None:
    t = db.create_table("t", dim=2, ttl_steps=5)
    t.upsert([1], [[9.0, 9.0]])
    db.advance(5)
    assert t.contains([1]).tolist() == [True] and len(t) == 1  # age 5 == ttl: still live
    db.advance(1)
    assert t.contains([1]).tolist() == [False] and len(t) == 0  # age 6 > ttl: expired
    np.testing.assert_array_equal(t.lookup([1]), t.config.initializer.values(np.array([1]), 2))
    assert [k for k, _ in t.items()] == [] or all(k.size == 0 for k, _ in t.items())


def test_pull_and_upsert_refresh_last_step(db) -> None:
    t = db.create_table("t", dim=2, ttl_steps=3)
    t.upsert([1, 2], np.ones((2, 2)))
    db.advance(3)
    t.pull([1])
    t.upsert([2], np.ones((1, 2)))
    db.advance(3)
    assert t.contains([1, 2]).all()


def test_an_expired_row_is_pulled_afresh(db) -> None:
    t = db.create_table("t", dim=3, ttl_steps=2, admission=evdb.admission.Counter(min_count=2))
    t.pull([5, 5])  # admitted
    key = np.array([5], np.int64)
    t.upsert(key, np.full((1, 3), 7.0))
    db.advance(3)
    p = t.pull(key)  # expired: admission count starts from zero again
    assert not p.admitted[0]
    np.testing.assert_array_equal(p.rows, t.config.initializer.values(key, 3))
    p = t.pull(key)
    assert p.admitted[0]
    np.testing.assert_array_equal(p.rows, t.config.initializer.values(key, 3))
    assert t.read_records(key)[1].freq[0] == 2  # pulls since the restart, not 1 + 2
    assert t.stats()["expired_on_pull"] == 1


def test_compact_reclaims_expired_and_weak_rows_and_counts_them(db) -> None:
    t = db.create_table("t", dim=2, ttl_steps=10, l2_threshold=0.5)
    t.upsert([1, 2, 3], [[0.1, 0.1], [3.0, 4.0], [0.0, 0.0]])
    db.advance(5)
    t.upsert([4, 5], [[1.0, 0.0], [0.3, 0.3]])
    db.advance(6)  # keys 1-3 are 11 steps old: expired; 4, 5 are 6 steps old
    assert len(t) == 2
    assert t.compact() == {"expired": 3, "l2": 1, "admission_forgotten": 0}
    assert t.contains([4, 5]).tolist() == [True, False]
    assert t.stats()["tiers"]["dram"]["rows"] == 1
    assert t.compact() == {"expired": 0, "l2": 0, "admission_forgotten": 0}


def test_upsert_last_value_wins_and_keeps_slots_and_freq(db) -> None:
    t = db.create_table("t", dim=2)
    t.pull([3, 3, 3])
    t.upsert([3, 3], [[1.0, 1.0], [2.0, 2.0]])
    assert t.lookup([3]).tolist() == [[2.0, 2.0]]
    assert t.read_records(np.array([3]))[1].freq[0] == 3


def test_push_applies_sgd_per_key_and_per_position(db) -> None:
    t = db.create_table("t", dim=2, optimizer=evdb.optim.SGD(lr=0.5))
    t.upsert([1, 2], [[1.0, 1.0], [2.0, 2.0]])
    p = t.pull([2, 1, 2])
    t.push(p, [[1.0, 0.0], [0.0, 2.0]])
    assert t.lookup([1, 2]).tolist() == [[1.0, 0.0], [1.5, 2.0]]
    p = t.pull([2, 1, 2])
    t.push(p, np.ones((3, 2)), per_position=True)  # key 2 appears twice: summed
    assert t.lookup([1, 2]).tolist() == [[0.5, -0.5], [0.5, 1.0]]


def test_push_drops_gradients_of_keys_not_admitted(db) -> None:
    t = db.create_table("t", dim=2, admission=evdb.admission.Counter(min_count=2))
    p = t.pull([1, 2, 2])
    t.push(p, np.ones((2, 2)))
    assert len(t) == 1 and t.stats()["dropped_gradients"] == 1


def test_non_finite_gradients_raise_and_change_nothing(db) -> None:
    t = db.create_table("t", dim=2)
    p = t.pull([1, 2])
    before = snapshot(t)
    grads = np.ones((2, 2))
    grads[1, 0] = np.inf
    with pytest.raises(ValueError, match=r"grads\[1, 0\] = inf is not finite"):
        t.push(p, grads)
    with pytest.raises(ValueError, match=r"grads must have shape \(2, 2\)"):
        t.push(p, np.ones((3, 2)))
    other = db.create_table("u", dim=2)
    with pytest.raises(ValueError, match=r"pulled must be what 'u'\.pull"):
        other.push(p, np.ones((2, 2)))
    assert snapshot(t) == before


def test_huge_finite_values_are_accepted(db) -> None:
    # Their float32 sum overflows to inf: the fast finiteness check must not reject them.
    t = db.create_table("t", dim=2)
    t.upsert([1, 2], [[3e38, 3e38], [3e38, 3e38]])
    assert t.lookup([1]).tolist() == [[np.float32(3e38)] * 2]
    with pytest.raises(ValueError, match=r"values\[0, 1\] = 1e\+39 is not finite as float32"):
        t.upsert([3], [[1.0, 1e39]])


@pytest.mark.parametrize(
    "call,error,message",
    [
        (lambda t: t.upsert(["a"], [[1.0, 1.0]]), TypeError, r"keys\[0\] is str 'a'"),
        (lambda t: t.upsert([[1, 2]], [[1.0, 1.0]]), ValueError, "keys must be 1-D"),
        (lambda t: t.upsert([1, 2], [[1.0, 1.0]]), ValueError, r"values must have shape \(2, 2\)"),
        (lambda t: t.upsert([1], [["x", "y"]]), TypeError, "values must be a float array"),
        (
            lambda t: t.upsert([1, 2], [[1.0, 1.0], [1.0, np.nan]]),
            ValueError,
            r"values\[1, 1\] = nan is not finite",
        ),
        (lambda t: t.lookup([1, 2.5]), TypeError, r"keys\[1\] is float 2.5"),
        (lambda t: t.pull(np.zeros((2, 2), np.int64)), ValueError, "keys must be 1-D"),
        (lambda t: t.delete(["k"]), TypeError, r"keys\[0\]"),
        (lambda t: list(t.items(chunk_rows=0)), ValueError, "chunk_rows must be an int >= 1"),
    ],
)
def test_bad_input_names_the_argument_and_changes_nothing(db, call, error, message) -> None:
    t = db.create_table("t", dim=2, admission=evdb.admission.Counter(min_count=2))
    t.upsert([1, 2], [[1.0, 2.0], [3.0, 4.0]])
    t.pull([7])
    before, stats = snapshot(t), t.stats()
    with pytest.raises(error, match=message):
        call(t)
    assert snapshot(t) == before and t.stats() == stats


def test_items_yields_live_rows_in_chunks(db) -> None:
    t = db.create_table("t", dim=3, ttl_steps=1)
    t.upsert(np.arange(10), np.zeros((10, 3)))
    db.advance(2)
    t.upsert(np.arange(100, 250), np.ones((150, 3)))
    chunks = list(t.items(chunk_rows=64))
    assert all(k.shape[0] <= 64 for k, _ in chunks)
    keys = np.concatenate([k for k, _ in chunks])
    assert sorted(keys.tolist()) == list(range(100, 250))
    assert all((v == 1.0).all() for _, v in chunks)


def test_delete_counts_live_rows_and_recreates_fresh(db) -> None:
    t = db.create_table("t", dim=2)
    t.upsert([1, 2], np.ones((2, 2)))
    t.pull([1, 1])
    assert t.delete([1, 1, 3]) == 1
    p = t.pull([1])
    np.testing.assert_array_equal(p.rows, t.config.initializer.values(np.array([1]), 2))
    assert t.read_records(np.array([1]))[1].freq[0] == 1


def test_string_keys(db) -> None:
    t = db.create_table("words", dim=2, key_type="str")
    t.upsert(["cat", "dog", "हि"], [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
    assert t.lookup(["हि", "cat"]).tolist() == [[3.0, 3.0], [1.0, 1.0]]
    assert t.contains(["dog", "emu"]).tolist() == [True, False]
    assert t.pull(["emu", "emu"]).keys.tolist() == evdb.hash_strings(["emu"]).tolist()


def test_stats_report_rows_tiers_and_admission(db) -> None:
    t = db.create_table("t", dim=2, dram_rows=100, admission=evdb.admission.Counter(min_count=2))
    t.pull([1, 1, 2])
    s = t.stats()
    assert s["rows"] == 1
    assert s["tiers"]["dram"]["rows"] == 1 and s["tiers"]["dram"]["capacity"] == 100
    assert s["tiers"]["dram"]["evictions"] == 0
    assert s["admission"]["policy"] == "counter" and s["admission"]["pending"] == 1


def test_rows_and_config_survive_close_and_reopen(tmp_path: Path) -> None:
    config = dict(
        dim=4,
        initializer=evdb.init.TruncatedNormal(0.0, 0.1, seed=5),
        admission=evdb.admission.Counter(min_count=2, max_pending=99),
        ttl_steps=7,
        l2_threshold=0.01,
        default_value="init",
        dram_rows=1000,
        optimizer=evdb.optim.SGD(lr=0.25),
    )
    with evdb.open(tmp_path) as db:
        t = db.create_table("t", **config)
        t.pull([1, 1, 2, 3, 3])
        t.upsert([-(2**63)], np.full((1, 4), 0.5))
        db.advance(4)
        before, stats, cfg = snapshot(t), t.stats(), t.config
        freq = t.read_records([1, 3])[1].freq.tolist()
    with evdb.open(tmp_path) as db:
        t = db.table("t")
        assert db.step == 4
        assert t.config == cfg
        after = t.stats()
        tiers = after.pop("tiers"), stats.pop("tiers")  # rows now wait on disk: compare counts
        assert after["reads"]["pull"]["not_found"] == 3  # the read counts persist too
        assert tiers[0]["dram"]["pinned"] == 0  # the batch in flight ended with close
        assert tiers[0]["dram"]["evictions"] == tiers[1]["dram"]["evictions"]
        assert tiers[0]["rocksdb"]["rows"] == 3 and tiers[0]["dram"]["rows"] == 0
        assert snapshot(t) == before and after == stats
        assert t.read_records([1, 3])[1].freq.tolist() == freq
        db.advance(4)  # rows were last touched at step 0: now expired, after the reopen too
        assert len(t) == 0


def test_dedup_scratch_is_kept_for_pulls_and_dropped_after_bulk_calls(db) -> None:
    t = db.create_table("t", dim=2)
    small = t.stats()["scratch_bytes"]
    t.upsert(np.arange(50_000), np.zeros((50_000, 2)))
    assert t.stats()["scratch_bytes"] == small  # a bulk load leaves no scratch behind
    t.pull(np.arange(50_000))
    assert t.stats()["scratch_bytes"] >= 2 * 50_000 * 16  # the training loop keeps it


@pytest.mark.parametrize("seed", range(4))
def test_lookup_found_is_contains_from_the_same_read(tmp_path: Path, seed: int) -> None:
    """Rows in DRAM, rows only on disk, expired rows and absent keys, plain and in bags:
    ``found`` equals ``contains`` and the values equal a lookup without it."""
    rng = np.random.default_rng(seed)
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("t", dim=3, dram_rows=40, ttl_steps=5)
        old = rng.choice(1000, 60, replace=False)
        t.upsert(old, rng.normal(size=(60, 3)).astype(np.float32))
        db.advance(4)
        fresh = rng.choice(np.arange(1000, 2000), 150, replace=False)  # most spill to disk
        t.upsert(fresh, rng.normal(size=(150, 3)).astype(np.float32))
        db.advance(3)  # the first rows have expired
        keys = rng.choice(np.concatenate([old, fresh, np.arange(5000, 5020)]), 120)
        want_found = t.contains(keys)
        assert want_found.any() and not want_found.all()
        for promote in (False, True):
            found = np.empty(keys.shape[0], dtype=bool)
            values = t.lookup(keys, promote=promote, found=found)
            np.testing.assert_array_equal(found, want_found)
            np.testing.assert_array_equal(values, t.lookup(keys))
        offsets = np.sort(rng.choice(keys.shape[0], 9, replace=False))
        offsets[0] = 0
        found = np.zeros(keys.shape[0], dtype=bool)
        bags = t.lookup(keys, offsets, combiner="sum", found=found)
        np.testing.assert_array_equal(found, want_found)
        np.testing.assert_array_equal(bags, t.lookup(keys, offsets, combiner="sum"))
        with pytest.raises(evdb.InvalidArgumentError, match="found must be a bool array"):
            t.lookup(keys, found=np.zeros(3, dtype=bool))


def test_initial_rows_makes_room_up_front_and_persists(tmp_path: Path) -> None:
    """dram.initial_rows (init_capacity): the index is sized at creation, so growing to that
    many rows rehashes nothing; it is kept across reopen and validated."""
    with evdb.open(tmp_path / "db") as db:
        plain = db.create_table("plain", dim=4)
        t = db.create_table("t", dim=4, dram=evdb.DramConfig(initial_rows=20_000))
        before = t.stats()["tiers"]["dram"]["index_bytes"]
        assert before > 16 * plain.stats()["tiers"]["dram"]["index_bytes"]
        keys = np.arange(20_000, dtype=np.int64)
        for chunk in np.array_split(keys, 10):
            t.upsert(chunk, np.ones((chunk.shape[0], 4), np.float32))
        assert t.stats()["tiers"]["dram"]["index_bytes"] == before  # no rehash on the way
        assert len(t) == 20_000 and t.contains(keys).all()
    with evdb.open(tmp_path / "db") as db:
        assert db.table("t").config.dram.initial_rows == 20_000
    for bad in (-1, None, 2.0, True):
        with pytest.raises(evdb.ConfigError, match=r"dram\.initial_rows"):
            evdb.DramConfig(initial_rows=bad)


def test_a_traced_table_records_its_pulls_and_lookups_once(db, tmp_path) -> None:
    from evdb.trace import KeyRecorder, read_trace

    t = db.create_table("t", dim=2, dram_rows=4)  # bags over rows on disk: a nested read
    t.upsert(np.arange(10), np.ones((10, 2), np.float32))
    with KeyRecorder.for_table(t, tmp_path / "t.trace", rate=1.0) as rec:
        t.trace(rec)
        t.push(t.pull([3, 1, 3]), np.zeros((2, 2), np.float32))
        db.advance()
        t.lookup([9, 8, 7, 9], offsets=[0, 2])
        t.trace(None)
        t.lookup([5])  # not recorded
    got = list(read_trace(tmp_path / "t.trace", table=t).batches())
    assert [(op, step, keys.tolist()) for op, step, keys in got] == [
        ("pull", 0, [3, 1, 3]),
        ("lookup", 1, [9, 8, 7, 9]),
    ]
    with pytest.raises(evdb.InvalidArgumentError, match="recorder must be"):
        t.trace("t.trace")
