"""Database: directory, lock, step, the set of tables, errors."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import evdb
from evdb.storage import WORKING


def test_open_creates_the_directory_and_is_a_context_manager(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b"
    with evdb.open(path) as db:
        assert path.is_dir() and db.step == 0 and db.tables() == []
    with pytest.raises(evdb.DatabaseClosedError):
        db.create_table("t", dim=2)
    db.close()  # closing twice is fine


def test_step_advances_and_persists(tmp_path: Path) -> None:
    with evdb.open(tmp_path) as db:
        assert db.advance() == 1 and db.advance(n=9) == 10 and db.advance(0) == 10
        with pytest.raises(ValueError, match="n must be an int >= 0, got -1"):
            db.advance(-1)
    with evdb.open(tmp_path) as db:
        assert db.step == 10


def test_tables_are_created_listed_fetched_and_dropped(tmp_path: Path) -> None:
    with evdb.open(tmp_path) as db:
        db.create_table("b", dim=2)
        a = db.create_table("a", dim=3)
        assert db.tables() == ["a", "b"] and db.table("a") is a
        with pytest.raises(evdb.TableExistsError, match="table 'a' already exists"):
            db.create_table("a", dim=3)
        with pytest.raises(KeyError, match="no table 'zz'"):
            db.table("zz")
        db.drop_table("b")
        with pytest.raises(evdb.TableNotFoundError):
            db.drop_table("b")
    with evdb.open(tmp_path) as db:
        assert db.tables() == ["a"]
        assert not (tmp_path / "tables" / "b.npz").exists()
        db.create_table("b", dim=5)  # a dropped name can be reused
        assert db.table("b").dim == 5


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(name="", dim=2), "name must be 1-128 characters"),
        (dict(name="../x", dim=2), "name must be"),
        (dict(name="t", dim=0), r"dim must be an int in \[1, 65536\], got 0"),
        (dict(name="t", dim=2, key_type="uuid"), "key_type must be one of"),
        (dict(name="t", dim=2, ttl_steps=-1), "ttl_steps must be >= 0 or None, got -1"),
        (dict(name="t", dim=2, dram_rows=0), "dram.capacity_rows must be >= 1"),
        (dict(name="t", dim=2, l2_threshold=float("nan")), "l2_threshold must be a finite"),
        (dict(name="t", dim=2, default_value="zeros"), "default_value must be 'init' or a"),
        (dict(name="t", dim=2, initializer="normal"), "initializer must be a Initializer"),
        (dict(name="t", dim=2, optimizer=evdb.optim.SGD), "optimizer must be a Optimizer"),
    ],
)
def test_bad_table_config_is_rejected_and_creates_nothing(db, kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        db.create_table(**kwargs)
    assert db.tables() == []


def test_a_second_open_of_the_same_directory_fails_clearly(tmp_path: Path) -> None:
    with evdb.open(tmp_path):
        with pytest.raises(evdb.DatabaseLockedError, match="is open in another process"):
            evdb.open(tmp_path)
    with evdb.open(tmp_path):  # released on close
        pass


def test_a_directory_held_by_another_process_fails_clearly(tmp_path: Path) -> None:
    with evdb.open(tmp_path):
        pass
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        with pytest.raises(evdb.DatabaseLockedError, match="open in another process"):
            evdb.open(tmp_path)
    finally:
        holder.kill()
        holder.wait()
    with evdb.open(tmp_path):  # the dead holder's lock went with it
        pass


HOLD = """
import sys, time, evdb
db = evdb.open(sys.argv[1])
print("open", flush=True)
time.sleep(60)
"""


def test_a_damaged_manifest_fails_with_the_file_named(tmp_path: Path) -> None:
    with evdb.open(tmp_path) as db:
        db.create_table("t", dim=2).upsert([1], [[1.0, 2.0]])
    (tmp_path / "evdb.json").write_text("{not json")
    with pytest.raises(evdb.CorruptDataError, match=r"evdb\.json"):
        evdb.open(tmp_path)
    with evdb.open(tmp_path / "fresh"):  # and the lock of the failed open was released
        pass


def test_flush_writes_without_closing(tmp_path: Path) -> None:
    db = evdb.open(tmp_path)
    db.create_table("t", dim=2).upsert([1], [[1.0, 2.0]])
    db.flush()
    pointer = json.loads((tmp_path / "evdb.json").read_text())
    assert (tmp_path / "checkpoints" / pointer["checkpoint"] / "CURRENT").exists()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [pointer["checkpoint"]]
    db.table("t").upsert([2], [[3.0, 4.0]])
    db.close()
    with evdb.open(tmp_path) as db:
        np.testing.assert_array_equal(db.table("t").lookup([1, 2]), [[1.0, 2.0], [3.0, 4.0]])


def test_a_missing_checkpoint_fails_with_the_path_named(tmp_path: Path) -> None:
    with evdb.open(tmp_path) as db:
        db.create_table("t", dim=2).upsert([1], [[1.0, 2.0]])
    pointer = json.loads((tmp_path / "evdb.json").read_text())
    shutil.rmtree(tmp_path / "checkpoints" / pointer["checkpoint"])
    with pytest.raises(evdb.CorruptDataError, match=f"checkpoint .*{pointer['checkpoint']}"):
        evdb.open(tmp_path)


def test_a_checkpoint_left_by_an_unfinished_flush_is_ignored(tmp_path: Path) -> None:
    with evdb.open(tmp_path) as db:
        db.create_table("t", dim=2).upsert([1], [[1.0, 2.0]])
    stray = tmp_path / "checkpoints" / "9999999999"
    stray.mkdir()
    (stray / "CURRENT").write_text("half written")
    with evdb.open(tmp_path) as db:
        assert db.table("t").lookup([1]).tolist() == [[1.0, 2.0]]
    assert not stray.exists()


def test_a_dropped_table_stays_dropped_and_its_name_is_reusable(tmp_path: Path) -> None:
    with evdb.open(tmp_path) as db:
        db.create_table("t", dim=2).upsert([1], [[1.0, 2.0]])
        db.flush()
        db.drop_table("t")
        t = db.create_table("t", dim=3)
        assert len(t) == 0 and t.lookup([1]).shape == (1, 3)
        t.upsert([5], [[1.0, 1.0, 1.0]])
    with evdb.open(tmp_path) as db:
        assert db.table("t").dim == 3 and len(db.table("t")) == 1
        db.drop_table("t")
    with evdb.open(tmp_path) as db:
        assert db.tables() == []


def test_dram_rows_and_dram_config_are_exclusive(db) -> None:
    with pytest.raises(evdb.ConfigError, match="not both"):
        db.create_table("t", dim=2, dram_rows=5, dram=evdb.DramConfig(capacity_rows=5))


def test_a_read_only_open_sets_the_dram_cache_size(tmp_path: Path) -> None:
    """cache_rows: the serving cache. Every row still reads right; DRAM holds at most that
    many after reads that promote; a writer cannot ask for it."""
    rng = np.random.default_rng(0)
    keys = np.arange(300, dtype=np.int64)
    values = rng.normal(size=(300, 4)).astype(np.float32)
    with evdb.open(tmp_path / "db") as db:
        db.create_table("t", dim=4).upsert(keys, values)
        db.create_table("mem", dim=4, disk=False).upsert(keys, values)
    with evdb.open(tmp_path / "db", read_only=True, cache_rows=32) as db:
        t = db.table("t")
        assert t.config.dram.capacity_rows == 32
        for chunk in np.array_split(keys, 10):
            np.testing.assert_array_equal(t.lookup(chunk, promote=True), values[chunk])
        assert t.stats()["tiers"]["dram"]["rows"] <= 32
        assert db.table("mem").config.dram.capacity_rows is None  # no disk: left whole
        np.testing.assert_array_equal(db.table("mem").lookup(keys), values)
    with pytest.raises(evdb.ConfigError, match="cache_rows: only for read_only"):
        evdb.open(tmp_path / "db", cache_rows=32)
    with pytest.raises(evdb.ConfigError, match="cache_rows"):
        evdb.open(tmp_path / "db", read_only=True, cache_rows=0)


def test_reads_at_two_steps_in_two_threads_judge_their_own_ttl(tmp_path: Path) -> None:
    """Two server threads reading one read-only database at two publications' steps each
    judge TTL at their own step, passed explicitly (no per-thread state to set)."""
    import threading

    with evdb.open(tmp_path / "db") as db:
        db.create_table("t", dim=2, ttl_steps=3).upsert([5], [[1.0, 2.0]])  # last_step 0
    ro = evdb.open(tmp_path / "db", read_only=True)
    both_ready = threading.Barrier(2, timeout=30)
    seen: dict[int, bool] = {}

    def read(step: int) -> None:
        both_ready.wait()
        seen[step] = bool(ro.table("t").contains([5], step=step)[0])

    threads = [threading.Thread(target=read, args=(s,)) for s in (2, 10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert seen == {2: True, 10: False}  # live at step 2, expired at step 10
    assert ro.step == 0 and ro.table("t").contains([5]).tolist() == [True]
    ro.close()


def _rocksdb_option(store_dir: Path, name: str) -> str:
    """The value RocksDB wrote for an option in its newest OPTIONS file."""
    newest = max(store_dir.glob("OPTIONS-*"), key=lambda p: int(p.name.split("-")[1]))
    line = next(x for x in newest.read_text().splitlines() if x.strip().startswith(name + "="))
    return line.split("=", 1)[1].strip()


@pytest.mark.parametrize("mmap_reads", [False, True])
def test_mmap_reads_reach_rocksdb_and_read_the_same_rows(tmp_path: Path, mmap_reads) -> None:
    values = np.arange(2000, dtype=np.float32).reshape(500, 4)
    with evdb.open(tmp_path / "db", mmap_reads=mmap_reads) as db:
        t = db.create_table("t", dim=4, dram_rows=16)
        t.upsert(np.arange(500), values)
        assert t.stats()["tiers"]["rocksdb"]["rows"] > 400
        np.testing.assert_array_equal(t.lookup(np.arange(500)), values)
        working = tmp_path / "db" / WORKING  # the RocksDB working copy
        assert _rocksdb_option(working, "allow_mmap_reads") == str(mmap_reads).lower()
    with evdb.open(tmp_path / "db", read_only=True, mmap_reads=mmap_reads) as db:
        np.testing.assert_array_equal(db.table("t").lookup(np.arange(500)), values)


def test_mmap_reads_must_be_a_bool_and_nothing_is_created(tmp_path: Path) -> None:
    with pytest.raises(evdb.ConfigError, match="mmap_reads must be a bool, got 'yes'"):
        evdb.open(tmp_path / "db", mmap_reads="yes")
    assert not (tmp_path / "db").exists()


def test_opening_a_file_says_it_is_a_file_and_changes_nothing(tmp_path: Path) -> None:
    f = tmp_path / "a-file"
    f.write_bytes(b"not a database")
    for read_only in (False, True):
        with pytest.raises(evdb.InvalidArgumentError, match=r"path: .*a-file is a file; evdb.open"):
            evdb.open(f, read_only=read_only)
    assert f.read_bytes() == b"not a database" and sorted(tmp_path.iterdir()) == [f]


def test_opening_a_sharded_root_says_how_to_open_it(tmp_path: Path) -> None:
    from evdb.distributed.layout import LAYOUT  # what a sharded root holds

    root = tmp_path / "sharded"
    root.mkdir()
    (root / LAYOUT).write_text("{}")
    for read_only in (False, True):
        with pytest.raises(evdb.InvalidArgumentError) as caught:
            evdb.open(root, read_only=read_only)
        message = str(caught.value)
        assert "is a sharded database or checkpoint" in message
        assert "evdb.distributed.open(path)" in message and "shard-00000" in message
        assert "evdb reshard" in message and "--shards 1" in message
    assert sorted(p.name for p in root.iterdir()) == [LAYOUT]
