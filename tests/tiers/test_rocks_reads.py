"""The RocksDB tier's read path: one sorted multi-get and one vectorised decode, checked
against a plain dict of what was written; damage named; databases written with the options
of earlier versions read back."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pytest
import rocksdict

from evdb.errors import CorruptDataError, StorageError
from evdb.records import FIELDS, RecordBatch
from evdb.tiers import rocks as rocks_module
from evdb.tiers import store, store_options
from evdb.tiers.rocks import RocksTier, encode_keys
from evdb.tiers.store import RocksStore

from .contract import DIM, SLOTS, assert_same, records


@pytest.fixture
def rocks(tmp_path: Path) -> Iterator[RocksStore]:
    s = RocksStore(tmp_path / "rocks", {})
    yield s
    s.close()


def reference_get(written: dict[int, int], rows: RecordBatch, keys: np.ndarray) -> RecordBatch:
    """What a get must return: the record last written for each key found, in input order."""
    at = [written[k] for k in keys.tolist() if k in written]
    return RecordBatch(*(getattr(rows, f)[at] for f in FIELDS))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("read_ahead", [False, True])
def test_get_matches_a_dict_of_what_was_written(
    rocks: RocksStore, seed: int, read_ahead: bool
) -> None:
    rng = np.random.default_rng(seed)
    tier = RocksTier(rocks, "t.x", DIM, SLOTS)
    rows = records(600, seed=seed)
    written: dict[int, int] = {}
    for start in range(0, 600, 200):  # three writes, some keys overwritten, some removed
        keys = rng.choice(np.arange(-400, 400, dtype=np.int64), 200, replace=False)
        tier.put(keys, rows.take(np.arange(start, start + 200)))
        written.update(zip(keys.tolist(), range(start, start + 200), strict=True))
        if start == 200:
            rocks.checkpoint(rocks.path.with_name(f"ckpt-{seed}"))  # some rows in files
    gone = np.array(sorted(written)[::7], dtype=np.int64)
    tier.remove(gone)
    for k in gone.tolist():
        del written[k]
    for _ in range(3):
        keys = rng.integers(-500, 500, 300).astype(np.int64)  # repeats, misses, any order
        if read_ahead:
            tier.prefetch(keys[: rng.integers(0, 300)])
        found, got = tier.get(keys)
        assert found.tolist() == [k in written for k in keys.tolist()]
        assert_same(got, reference_get(written, rows, keys))


def _written_tier(rocks: RocksStore, n: int) -> tuple[RocksTier, RecordBatch]:
    tier = RocksTier(rocks, "t.x", DIM, SLOTS)
    rows = records(n, seed=3)
    tier.put(np.arange(n, dtype=np.int64) * 3, rows)
    rocks.checkpoint(rocks.path.with_name("ckpt"))  # in files, not only the memtable
    return tier, rows


@pytest.mark.parametrize("reader", ["free", "busy"])
def test_a_split_multi_get_reads_what_one_multi_get_reads(
    rocks: RocksStore, monkeypatch: pytest.MonkeyPatch, reader: str
) -> None:
    """Two halves read at once (the second on the reader thread, or here after the first
    when the reader is busy) give the records of one multi-get, in input order."""
    monkeypatch.setattr(rocks_module, "_MANY_CORES", True)
    monkeypatch.setattr(rocks_module, "SPLIT_KEYS", 16)
    tier, rows = _written_tier(rocks, 500)
    gate = threading.Event()
    if reader == "busy":  # (a split half queued behind this is read on the calling thread)
        rocks.read_later(lambda: gate.wait(30))
    try:
        rng = np.random.default_rng(1)
        for n in (15, 16, 17, 301):
            keys = rng.integers(-20, 1600, n).astype(np.int64)  # misses, repeats, any order
            found, got = tier.get(keys)
            assert found.tolist() == [k % 3 == 0 and 0 <= k < 1500 for k in keys.tolist()]
            assert_same(got, rows.take(keys[found] // 3))
    finally:
        gate.set()


def test_a_split_half_that_fails_on_the_reader_is_named(
    rocks: RocksStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rocks_module, "_MANY_CORES", True)
    monkeypatch.setattr(rocks_module, "SPLIT_KEYS", 16)
    tier, _ = _written_tier(rocks, 100)

    def failing(read: object) -> Future[object]:
        f: Future[object] = Future()
        f.set_running_or_notify_cancel()  # (started: it cannot be taken back)
        f.set_exception(Exception("IO error: Input/output error while reading"))
        return f

    monkeypatch.setattr(rocks, "read_later", failing)
    with pytest.raises(StorageError, match=r"read of 't\.x'.*Input/output error"):
        tier.get(np.arange(100, dtype=np.int64) * 3)


def test_a_record_of_the_wrong_size_is_named_as_damage(rocks: RocksStore) -> None:
    tier = RocksTier(rocks, "t.x", DIM, SLOTS)
    tier.put(np.arange(3, dtype=np.int64), records(3))
    rocks.write_rows("t.x", encode_keys(np.array([1], np.int64)), [b"short"])
    with pytest.raises(
        CorruptDataError, match=r"column family 't\.x': 3 records read are 103 bytes"
    ):
        tier.get(np.arange(3, dtype=np.int64))
    found, _ = tier.get(np.array([0, 2], np.int64))  # the others still read
    assert found.all()


def previous_rocks_options(
    compression: store_options.Compression = "lz4", cache: object = None, mmap_reads: bool = False
) -> rocksdict.Options:
    """The options evdb opened RocksDB with at git 0dffac6 (level compaction, 4 KiB blocks,
    a filter on every level; smaller memtables here, for more files): a store written with
    them must read back under whatever options evdb opens RocksDB with now."""
    opts = rocksdict.Options(raw_mode=True)
    opts.set_allow_mmap_reads(mmap_reads)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    opts.set_compression_type(rocksdict.DBCompressionType.none())
    opts.set_write_buffer_size(1 << 20)
    opts.set_max_write_buffer_number(2)
    opts.set_level_zero_file_num_compaction_trigger(8)
    table = rocksdict.BlockBasedOptions()
    table.set_bloom_filter(10, False)
    if cache is not None:
        table.set_block_cache(cache)
    opts.set_block_based_table_factory(table)
    return opts


def test_a_store_written_with_the_previous_options_reads_back_and_keeps_writing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "rocks"
    rows = records(3000, seed=5)
    keys = np.random.default_rng(5).permutation(3000).astype(np.int64) * 7919
    with monkeypatch.context() as m:
        m.setattr(store_options, "rocks_options", previous_rocks_options)
        m.setattr(store, "rocks_options", previous_rocks_options)
        old = RocksStore(path, {})
        tier = RocksTier(old, "t.x", DIM, SLOTS)
        for part in np.array_split(np.arange(3000), 6):  # files in several levels and L0
            tier.put(keys[part], rows.take(part))
            old.checkpoint(tmp_path / f"ckpt-{part[0]}")
            if part[0] == 0:
                old.compact_range("t.x")
        arrays = tier.to_arrays()
        old.close()
    new = RocksStore(path, {"t.x": "none"})
    try:
        tier = RocksTier(new, "t.x", DIM, SLOTS)
        tier.load_arrays(arrays)
        found, got = tier.get(keys[::-1])
        assert found.all()
        assert_same(got, rows.take(np.arange(3000)[::-1]))
        tier.put(keys[:10], rows.take(np.arange(10, 20)), existed=np.ones(10, bool))
        new.compact_range("t.x")  # the new options rewrite the old files
        assert_same(tier.get(keys[:20])[1], rows.take(np.r_[10:20, 10:20]))
    finally:
        new.close()


def test_a_damaged_block_on_disk_is_a_corrupt_data_error_naming_the_store(tmp_path: Path) -> None:
    import evdb

    rng = np.random.default_rng(0)
    keys = np.arange(20_000)
    values = rng.standard_normal((keys.size, 8)).astype(np.float32)
    with evdb.open(tmp_path / "db") as db:
        db.create_table("t", dim=8, dram_rows=64).upsert(keys, values)
    sst = max((tmp_path / "db" / "rocksdb").glob("*.sst"), key=lambda p: p.stat().st_size)
    with open(sst, "r+b") as f:  # one byte flipped in the middle of the data blocks
        f.seek(sst.stat().st_size // 3)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    with evdb.open(tmp_path / "db") as db:
        with pytest.raises(CorruptDataError, match=r"rocksdb: read of .*Corruption"):
            db.table("t").lookup(keys)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("distinct", [True, False])
def test_lookup_of_rows_on_disk_matches_a_dict_of_what_was_written(
    tmp_path: Path, seed: int, distinct: bool
) -> None:
    """Keys in any order, some on disk, some in DRAM, some expired, some never written:
    each reads its row or its initializer value, and ``found`` says which."""
    import evdb

    rng = np.random.default_rng(seed)
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("t", dim=5, dram_rows=30, ttl_steps=4)
        old = rng.choice(4000, 300, replace=False)
        t.upsert(old, rng.normal(size=(300, 5)).astype(np.float32))
        db.advance(3)
        fresh = rng.choice(np.arange(4000, 8000), 600, replace=False)  # most go to disk
        fresh_rows = rng.normal(size=(600, 5)).astype(np.float32)
        t.upsert(fresh, fresh_rows)
        db.advance(2)  # the old rows have expired
        model = dict(zip(fresh.tolist(), fresh_rows, strict=True))
        pool = np.concatenate([old, fresh, np.arange(9000, 9100)])
        keys = rng.choice(pool, 500, replace=not distinct)
        found = np.empty(500, dtype=bool)
        got = t.lookup(keys, found=found)
        assert not t.resident(keys).all() and found.any() and not found.all()
        assert found.tolist() == [k in model for k in keys.tolist()]
        want = t.config.initializer.values(keys, 5)
        want[found] = np.stack([model[k] for k in keys[found].tolist()])
        np.testing.assert_array_equal(got, want)
