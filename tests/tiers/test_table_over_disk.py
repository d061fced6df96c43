"""A table bigger than its DRAM tier: rows spill to RocksDB and come back, and no caller can
tell where a row is, except by speed (and by ``stats()``, ``resident``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import evdb
from evdb import DiskConfig


def spilled_table(db: evdb.Database, n: int = 500, cap: int = 20, **kw) -> evdb.Table:
    t = db.create_table("t", dim=4, dram_rows=cap, optimizer=evdb.optim.Adagrad(lr=0.1), **kw)
    t.upsert(np.arange(n), np.arange(4 * n, dtype=np.float32).reshape(n, 4))
    return t


def snapshot(t: evdb.Table, chunk_rows: int = 65536) -> dict[int, np.ndarray]:
    return {k: v for ks, vs in t.items(chunk_rows) for k, v in zip(ks.tolist(), vs, strict=True)}


def values(keys) -> np.ndarray:
    return (np.asarray(keys)[:, None] * 4 + np.arange(4)).astype(np.float32)


def test_rows_beyond_dram_live_on_disk_and_read_back_unchanged(db) -> None:
    t = spilled_table(db)
    tiers = t.stats()["tiers"]
    assert tiers["dram"]["rows"] <= 20 and tiers["rocksdb"]["rows"] >= 480
    assert len(t) == 500
    keys = np.array([499, 3, 250, 3, 7000])
    got = t.lookup(keys)
    np.testing.assert_array_equal(got[:4], values(keys[:4]))
    np.testing.assert_array_equal(got[4], t.config.initializer.values(keys[4:], 4)[0])
    assert t.contains(keys).tolist() == [True, True, True, True, False]
    items = snapshot(t, chunk_rows=64)
    assert sorted(items) == list(range(500))
    np.testing.assert_array_equal(np.stack([items[k] for k in range(500)]), values(range(500)))


def test_lookup_does_not_promote_unless_asked(db) -> None:
    t = spilled_table(db)
    cold = np.array([100, 101, 102])
    assert not t.resident(cold).any()
    t.lookup(cold)
    assert not t.resident(cold).any() and t.resident(cold, tier="rocksdb").all()
    dirty = t.stats()["tiers"]["dram"]["dirty_rows"]
    np.testing.assert_array_equal(t.lookup(cold, promote=True), values(cold))
    assert t.resident(cold).all()
    tiers = t.stats()["tiers"]
    assert tiers["dram"]["dirty_rows"] <= dirty  # cached clean (victims may have gone down)
    assert tiers["dram"]["promotions"] == 3


def test_bag_lookup_combines_rows_from_both_tiers(db) -> None:
    t = spilled_table(db)
    keys = np.array([1, 400, 2, 401, 9999])
    got = t.lookup(keys, offsets=[0, 2, 4], combiner="sum")
    rows = t.lookup(keys)
    np.testing.assert_allclose(got, [rows[0] + rows[1], rows[2] + rows[3], rows[4]], rtol=1e-6)


def test_training_promotes_updates_and_writes_back_without_losing_an_update(db) -> None:
    t = spilled_table(db, n=300, cap=10)
    rng = np.random.default_rng(1)
    want = values(range(300)).astype(np.float64)
    accum = np.full((300, 4), 0.1)  # Adagrad's initial accumulator
    for _ in range(30):
        keys = rng.integers(0, 300, 40)
        p = t.pull(keys)
        g = rng.standard_normal((p.keys.shape[0], 4)).astype(np.float32)
        t.push(p, g)
        accum[p.keys] += g.astype(np.float64) ** 2
        want[p.keys] -= 0.1 * g / np.sqrt(accum[p.keys])
        assert t.stats()["tiers"]["dram"]["rows"] <= 10  # back to capacity after each push
    np.testing.assert_allclose(t.lookup(np.arange(300)), want, rtol=1e-5, atol=1e-5)
    s = t.stats()["tiers"]
    assert s["dram"]["promotions"] > 0 and s["dram"]["written_back"] > 0
    assert len(t) == 300


def test_a_batch_larger_than_dram_stays_resident_until_its_push(db) -> None:
    t = db.create_table("t", dim=2, dram_rows=8)
    p = t.pull(np.arange(50))
    assert (
        p.admitted.all() and t.stats()["tiers"]["dram"]["rows"] == 50
    )  # pinned: over capacity for now
    t.push(p, np.ones((50, 2)))
    assert t.stats()["tiers"]["dram"]["rows"] <= 8 and len(t) == 50
    np.testing.assert_allclose(
        t.lookup(np.arange(50)), t.config.initializer.values(np.arange(50), 2) - 0.01, rtol=1e-6
    )


def test_delete_and_len_are_exact_across_tiers(db) -> None:
    t = spilled_table(db, n=100, cap=5)
    assert t.delete([0, 50, 99, 5000]) == 3
    assert len(t) == 97 and not t.contains([0, 50, 99]).any()
    t.upsert([50], [[1.0, 1.0, 1.0, 1.0]])
    assert len(t) == 98


def test_compact_applies_ttl_and_l2_to_rows_only_on_disk(db) -> None:
    t = db.create_table("t", dim=2, dram_rows=4, ttl_steps=5, l2_threshold=0.5)
    t.upsert(np.arange(40), np.ones((40, 2)))  # old rows, mostly on disk now
    t.upsert([100, 101], [[0.1, 0.1], [1.0, 1.0]])
    db.advance(3)
    t.upsert(np.arange(40, 50), np.ones((10, 2)))
    t.upsert([102], [[0.01, 0.0]])  # weak, recent
    db.advance(3)  # rows of step 0 have expired; rows of step 3 have not
    assert len(t) == 11
    got = t.compact()
    assert got == {"expired": 42, "l2": 1, "admission_forgotten": 0}
    assert (
        len(t) == 10
        and t.stats()["tiers"]["rocksdb"]["rows"] + t.stats()["tiers"]["dram"]["rows"] >= 10
    )
    assert sorted(k for ks, _ in t.items() for k in ks.tolist()) == list(range(40, 50))


def test_expired_rows_on_disk_read_as_missing_and_start_afresh(db) -> None:
    t = db.create_table("t", dim=2, dram_rows=2, ttl_steps=2)
    t.upsert(np.arange(10), np.ones((10, 2)))
    db.advance(3)
    assert len(t) == 0 and not t.contains(np.arange(10)).any()
    p = t.pull([7])
    np.testing.assert_array_equal(p.rows, t.config.initializer.values(np.array([7]), 2))
    assert t.stats()["expired_on_pull"] == 1 and len(t) == 1


def test_stats_report_every_tier(db) -> None:
    t = spilled_table(db)
    t.pull(np.arange(100, 110))
    tiers = t.stats()["tiers"]
    assert set(tiers) == {"dram", "rocksdb"}
    for s in tiers.values():
        assert {
            "rows",
            "dirty_rows",
            "bytes",
            "hits",
            "misses",
            "promotions",
            "evictions",
        } <= s.keys()
        assert "written_back" in s
    assert tiers["dram"]["dirty_rows"] > 0 and tiers["rocksdb"]["hits"] >= 10


def test_flush_leaves_no_dirty_row_and_reopen_sees_everything(tmp_path: Path) -> None:
    with evdb.open(tmp_path) as db:
        t = spilled_table(db, n=200, cap=10)
        p = t.pull([1, 2, 150])
        t.push(p, np.ones((3, 4)))
        db.flush()
        assert t.stats()["tiers"]["dram"]["dirty_rows"] == 0
        before = {k: v.tobytes() for k, v in snapshot(t).items()}
        found, recs = t.read_records(np.arange(200))
    with evdb.open(tmp_path) as db:
        t = db.table("t")
        assert len(t) == 200
        after = {k: v.tobytes() for k, v in snapshot(t).items()}
        assert after == before
        found2, recs2 = t.read_records(np.arange(200))
        assert found.all() and found2.all()
        for field in ("values", "slots", "freq", "last_step", "version"):
            np.testing.assert_array_equal(getattr(recs2, field), getattr(recs, field))


def test_float16_disk_halves_value_bytes_and_rounds_spilled_rows(db) -> None:
    t = db.create_table("t", dim=8, dram_rows=2, disk=DiskConfig(dtype="float16"))
    v = np.random.default_rng(0).standard_normal((50, 8)).astype(np.float32)
    t.upsert(np.arange(50), v)
    got = t.lookup(np.arange(50))
    on_disk = ~t.resident(np.arange(50))
    np.testing.assert_array_equal(got[on_disk], v[on_disk].astype(np.float16))
    np.testing.assert_array_equal(got[~on_disk], v[~on_disk])  # cached rows are exact
    assert t.stats()["tiers"]["rocksdb"]["dtype"] == "float16"


def test_disk_config_is_validated_and_persisted(tmp_path: Path) -> None:
    with evdb.open(tmp_path) as db:
        with pytest.raises(evdb.ConfigError, match=r"disk\.compression must be"):
            db.create_table("t", dim=2, disk=DiskConfig(compression="brotli"))
        with pytest.raises(evdb.ConfigError, match="disk must be True, False or a DiskConfig"):
            db.create_table("t", dim=2, disk="yes")
        db.create_table("t", dim=2, disk=DiskConfig(dtype="float16", compression="none"))
        db.create_table("u", dim=2, disk=False)
    with evdb.open(tmp_path) as db:
        assert db.table("t").config.disk == DiskConfig(dtype="float16", compression="none")
        assert db.table("u").config.disk is None


def test_a_zipf_workload_mostly_hits_dram(db) -> None:
    """DRAM for 5% of 100,000 keys; Zipf(1.1) batches. Loose bound: the hot set fits."""
    n_keys = 100_000
    t = db.create_table("t", dim=4, dram_rows=n_keys // 20)
    rng = np.random.default_rng(0)
    scramble = rng.permutation(n_keys)

    def batch() -> np.ndarray:
        z = rng.zipf(1.1, 8192)
        return scramble[(z[z <= n_keys] - 1)]

    for _ in range(30):  # warm-up
        t.push(p := t.pull(batch()), np.zeros((p.keys.shape[0], 4)))
        db.advance()
    before = dict(t.stats()["tiers"]["dram"])
    for _ in range(20):
        t.push(p := t.pull(batch()), np.zeros((p.keys.shape[0], 4)))
        db.advance()
    after = t.stats()["tiers"]["dram"]
    hits, misses = after["hits"] - before["hits"], after["misses"] - before["misses"]
    assert hits / (hits + misses) > 0.5


@pytest.mark.parametrize("disk", [True, False])
def test_a_push_reaches_a_row_recreated_and_spilled_since_its_pull(db, disk) -> None:
    """Found by the tiered state machine: the row a batch pulled is deleted, re-created by
    upsert and evicted to disk before the push; the push must still reach it, as it does
    when every row is in DRAM."""
    t = db.create_table("t", dim=2, dram_rows=None if not disk else 2, disk=disk)
    p = t.pull([1])
    t.delete([1])
    t.upsert([1, 2, 3, 4], np.zeros((4, 2)))
    if disk:
        assert not t.resident(np.array([1]))[0]  # on disk only
    t.push(p, np.ones((1, 2)))
    np.testing.assert_allclose(t.lookup([1]), [[-0.01, -0.01]])


def test_a_push_after_its_rows_expired_counts_rows_exactly(db) -> None:
    """Found by the tiered state machine's thorough profile: a pinned row that expired before
    its push (which had to look rows up again) was 'promoted' over itself from its expired
    copy below, and that copy was then counted away twice."""
    t = db.create_table("t", dim=2, dram_rows=2, ttl_steps=2)
    t.upsert([1], [[1.0, 1.0]])
    db.flush()  # row 1 now has a clean copy on disk
    p = t.pull([1])
    t.upsert([5, 6, 7], np.ones((3, 2)))  # evictions: the push must look its rows up again
    db.advance(3)  # row 1 expires
    t.push(p, np.ones((1, 2)))
    t.compact()
    t.upsert([9], [[1.0, 1.0]])
    rows = sum(ks.shape[0] for ks, _ in t.items())
    assert len(t) == rows == 1  # every row of step 0 expired; 9 is new


def test_rows_written_down_in_key_order_keep_their_own_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Write-back sorts victims and flushed rows by key (RocksDB inserts a sorted batch
    faster): with keys whose row order is not key order (shuffled, both signs), spilled
    victims and several flush chunks, every key still reads back its own values."""
    from evdb.tiers import chain

    monkeypatch.setattr(chain, "_FLUSH_CHUNK", 7)
    rng = np.random.default_rng(5)
    keys = rng.choice(np.arange(-(2**62), 2**62, 2**50, dtype=np.int64), 300, replace=False)
    vals = rng.standard_normal((300, 4)).astype(np.float32)
    model = {}
    with evdb.open(tmp_path) as db:
        t = db.create_table("t", dim=4, dram_rows=40)
        for part in np.array_split(rng.permutation(300), 15):  # evictions between upserts
            t.upsert(keys[part], vals[part])
            model.update(zip(keys[part].tolist(), vals[part], strict=True))
        again = rng.permutation(300)[:120]  # rows on disk come back, change, spill again
        vals[again] += 1
        t.upsert(keys[again], vals[again])
        model.update(zip(keys[again].tolist(), vals[again], strict=True))
        assert t.stats()["tiers"]["dram"]["written_back"] > 0
        want = {k: v.tobytes() for k, v in model.items()}
        assert {k: v.tobytes() for k, v in snapshot(t).items()} == want
        db.flush()
        assert {k: v.tobytes() for k, v in snapshot(t).items()} == want
    with evdb.open(tmp_path) as db:
        assert {k: v.tobytes() for k, v in snapshot(db.table("t")).items()} == want


def test_prefetch_changes_no_result_and_serves_the_next_pull(tmp_path: Path) -> None:
    """Two spilling tables fed the same steps (pulls, pushes, deletes, upserts, TTL expiry),
    one told some next batches ahead: every pull, lookup and final row is the same."""
    rng = np.random.default_rng(7)
    steps = 40
    batches = [rng.integers(0, 400, 64) for _ in range(steps + 1)]
    grads = rng.standard_normal((steps, 64, 4)).astype(np.float32)
    tables = []
    for name in ("plain", "ahead"):
        db = evdb.open(tmp_path / name)
        t = db.create_table(
            "t", dim=4, dram_rows=48, ttl_steps=25, optimizer=evdb.optim.Adagrad(lr=0.1)
        )
        tables.append((db, t))
    for i in range(steps):
        got = []
        for db, t in tables:
            if t is tables[1][1] and i == 0:
                t.prefetch(batches[0])
            p = t.pull(batches[i])
            if t is tables[1][1] and i % 3 == 0:  # a read ahead lives on for 3 steps,
                t.prefetch(batches[i + 1])  # while its rows are written back and read again
            t.push(p, grads[i, : p.keys.shape[0]])
            if i % 7 == 3:  # remove and rewrite rows the read ahead may hold
                t.delete(batches[i + 1][:5])
                t.upsert(batches[i + 1][5:9], np.full((4, 4), float(i), np.float32))
            db.advance()
            got.append((p.keys, p.rows.copy(), t.lookup(batches[i + 1])))
        for a, b in zip(got[0], got[1], strict=True):
            np.testing.assert_array_equal(a, b)
    (db0, plain), (db1, ahead) = tables
    rows, rows_ahead = snapshot(plain), snapshot(ahead)
    assert sorted(rows) == sorted(rows_ahead)
    for k, v in rows.items():
        np.testing.assert_array_equal(v, rows_ahead[k])
    disk = ahead.stats()["tiers"]["rocksdb"]
    assert disk["read_ahead_used"] > 100  # the pulls and lookups took rows read ahead
    assert plain.stats()["tiers"]["rocksdb"]["read_ahead_used"] == 0
    db0.close()
    db1.close()


@pytest.mark.parametrize("hbm", [False, True])
def test_reads_count_the_keys_each_level_answered(db, hbm: bool) -> None:
    """stats()["reads"]: per operation, the keys each tier held when asked, and those no tier
    held; a pull counts its distinct keys, a lookup its positions at the top."""
    kw = {"hbm_rows": 5, "device": "cpu"} if hbm else {}
    t = spilled_table(db, **kw)
    top = "hbm" if hbm else "dram"
    levels = ["hbm", "dram"] if hbm else ["dram"]
    before = t.stats()["reads"]
    cached = np.flatnonzero(t.resident(np.arange(500)))[:3]
    in_memory = t.resident(np.arange(500)) | t.resident(np.arange(500), tier="dram")
    cold = np.flatnonzero(~in_memory)[:4]
    new = np.array([1000, 1001])
    p = t.pull(np.concatenate([cached, cold, new, cached]))
    t.push(p, np.zeros((9, 4), np.float32))
    reads = t.stats()["reads"]
    pulled = {k: reads["pull"][k] - before["pull"].get(k, 0) for k in reads["pull"]}
    assert pulled[top] == 3 and pulled["rocksdb"] == 4 and pulled["not_found"] == 2
    assert sum(pulled.values()) == 9  # each distinct key once, at the level that had it
    assert list(reads["pull"]) == [*levels, "rocksdb", "not_found"]
    t.lookup(np.concatenate([cached, cached, [5000]]))
    looked = t.stats()["reads"]["lookup"]
    assert looked[top] - before["lookup"][top] == 6 and looked["not_found"] == 1
    tiers = t.stats()["tiers"][top]
    assert tiers["lookup_hits"] == looked[top] and tiers["pull_hits"] == reads["pull"][top]
    assert tiers["hits"] == tiers["pull_hits"] + tiers["lookup_hits"]
