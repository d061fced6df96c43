"""A full disk during training, flush, close, checkpoint, publish and export (issue 26, item 4).

Each test fills a small tmpfs (``small_disk``), meets the error, frees the space and carries
on in the same process, then counts the rows lost against a model of every change evdb
acknowledged: it must be 0. The error must be an ``evdb.StorageError``: an OSError naming the
path and ENOSPC, never a bare ``Exception`` or a ``CorruptDataError``.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import evdb
import evdb.tiers.store
import evdb.tiers.store_log
import evdb.tiers.store_options
from evdb.errors import StorageError
from tests.faults.conftest import Disk

DIM = 8
KEYS = 30_000  # the key universe; DRAM holds DRAM_ROWS of them, the rest spill to RocksDB
DRAM_ROWS = 1_000
BATCH = 500
LR = 0.5


@pytest.fixture(autouse=True)
def small_memtables(monkeypatch: pytest.MonkeyPatch) -> None:
    """64 KiB memtables instead of 16 MiB: RocksDB writes its files (and meets the full
    disk) after a few batches instead of thousands. The write log (the keys a recovery
    copies) is merged into distinct keys every 2,000 keys instead of 262,144, so the tests
    also check that merging keeps every key."""
    monkeypatch.setattr(evdb.tiers.store_options, "WRITE_BUFFER_BYTES", 64 << 10)
    monkeypatch.setattr(evdb.tiers.store_log, "_LOG_COMPACT", 2_000)


class Model:
    """What evdb acknowledged, per key: NaN where no row was written."""

    def __init__(self) -> None:
        self.values = np.full((KEYS, DIM), np.nan, dtype=np.float32)
        self.rng = np.random.default_rng(26)
        self.pending: tuple[np.ndarray, np.ndarray] | None = None  # keys, values if applied

    def step(self, t: evdb.Table, i: int) -> None:
        """One training step (pull + push) or, every third, an upsert; the model changes
        only once evdb returned."""
        keys = self.rng.integers(0, KEYS, BATCH)
        if i % 3 == 2:
            values = self.rng.standard_normal((BATCH, DIM)).astype(np.float32)
            keys, first = np.unique(keys, return_index=True)
            self.pending = keys, values[first]
            t.upsert(keys, values[first])
            self.values[keys] = values[first]
            self.pending = None
            return
        pulled = t.pull(keys)  # (changes no value)
        grads = np.ones((pulled.keys.shape[0], DIM), dtype=np.float32)
        self.pending = pulled.keys, pulled.rows - np.float32(LR) * grads
        t.push(pulled, grads)
        self.values[pulled.keys] = self.pending[1]
        self.pending = None

    def settle(self, t: evdb.Table, error: StorageError) -> None:
        """After a step that raised: its rows read back all as it would have left them
        (applied whole) when the error says it was applied, else all as before (not at
        all); never part."""
        if self.pending is None:
            return
        keys, after = self.pending
        got = t.lookup(keys)
        if "itself was applied" in str(error):
            assert np.isclose(got, after).all(), "said applied, but not applied whole"
            self.values[keys] = after
        else:
            known = ~np.isnan(self.values[keys, 0])
            assert np.isclose(got[known], self.values[keys][known]).all(), "applied unsaid"
        self.pending = None

    def train_until_error(self, t: evdb.Table, steps: int = 400) -> StorageError:
        for i in range(steps):
            try:
                self.step(t, i)
            except StorageError as e:
                return e
        raise AssertionError(f"{steps} steps on a full disk raised nothing")

    def rows_lost(self, t: evdb.Table) -> int:
        """Acknowledged rows that read back otherwise (or are missing)."""
        keys = np.flatnonzero(~np.isnan(self.values[:, 0]))
        got = t.lookup(keys)
        assert t.contains(keys).all(), "acknowledged rows are missing"
        return int(np.count_nonzero(~np.isclose(got, self.values[keys]).all(axis=1)))


@pytest.fixture()
def trained(small_disk: Disk) -> Iterator[tuple[evdb.Database, Model]]:
    db = evdb.open(small_disk.root / "db")
    db.create_table("t", dim=DIM, dram_rows=DRAM_ROWS, optimizer=evdb.optim.SGD(lr=LR))
    model = Model()
    for i in range(30):  # rows on disk already, and a flush behind them
        model.step(db.table("t"), i)
    db.flush()
    for i in range(30, 45):  # and changes since, in DRAM and in RocksDB's memtables
        model.step(db.table("t"), i)
    yield db, model
    small_disk.free()
    db.close(flush=False)


def assert_names_the_disk(e: BaseException, where: Path) -> None:
    assert isinstance(e, evdb.EvdbError) and isinstance(e, OSError), type(e).__mro__
    assert e.errno == errno.ENOSPC, e
    assert str(where) in str(e), e


def reopened_rows_lost(path: Path, model: Model) -> int:
    with evdb.open(path) as db:  # the same process: the LOCK was let go
        return model.rows_lost(db.table("t"))


def test_training_on_a_full_disk_raises_storage_error_and_resumes_after_space_is_freed(
    small_disk: Disk, trained: tuple[evdb.Database, Model]
) -> None:
    db, model = trained
    t = db.table("t")
    small_disk.fill()
    e = model.train_until_error(t)
    assert_names_the_disk(e, small_disk.root / "db")
    small_disk.free()
    model.settle(t, e)
    for i in range(10):  # the same Database trains on, then flushes and closes
        model.step(t, i)
    db.flush()
    db.close()
    assert reopened_rows_lost(small_disk.root / "db", model) == 0


def test_an_upsert_whose_eviction_fails_says_it_was_applied_and_keeps_it(
    small_disk: Disk, trained: tuple[evdb.Database, Model]
) -> None:
    db, model = trained
    t = db.table("t")
    small_disk.fill()
    rng = np.random.default_rng(7)
    for _ in range(200):  # new keys only: nothing is read from disk, only victims written
        keys = np.unique(rng.integers(KEYS, 2 * KEYS, BATCH))
        values = rng.standard_normal((keys.shape[0], DIM)).astype(np.float32)
        try:
            t.upsert(keys, values)
        except StorageError as e:
            error = e
            break
    else:
        raise AssertionError("200 upserts on a full disk raised nothing")
    assert_names_the_disk(error, small_disk.root / "db")
    assert "the upsert itself was applied" in str(error)
    np.testing.assert_array_equal(t.lookup(keys), values)  # applied whole, in memory
    small_disk.free()
    db.close()  # writes it down
    with evdb.open(small_disk.root / "db") as again:
        np.testing.assert_array_equal(again.table("t").lookup(keys), values)
        assert model.rows_lost(again.table("t")) == 0


def test_a_write_log_kept_small_by_memtable_flushes_still_loses_nothing(
    small_disk: Disk, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The write log is emptied by flushing a family's memtables once it holds
    ``_LOG_FLUSH_KEYS`` keys (its memory stays bounded between the database's flushes); a
    recovery then starts from those flushed files, and must still lose nothing."""
    monkeypatch.setattr(evdb.tiers.store_log, "_LOG_FLUSH_KEYS", 3_000)
    flushes = []
    real = evdb.tiers.store.RocksStore._flush_family

    def counted(store: evdb.tiers.store.RocksStore, name: str) -> None:
        real(store, name)
        flushes.append(name)

    monkeypatch.setattr(evdb.tiers.store.RocksStore, "_flush_family", counted)
    db = evdb.open(small_disk.root / "db")
    t = db.create_table("t", dim=DIM, dram_rows=DRAM_ROWS, optimizer=evdb.optim.SGD(lr=LR))
    model = Model()
    for i in range(60):  # no flush of the database: only the log's own
        model.step(t, i)
    assert flushes, "the write log never flushed its family"
    small_disk.fill()
    e = model.train_until_error(t)
    small_disk.free()
    model.settle(t, e)
    db.close()
    assert reopened_rows_lost(small_disk.root / "db", model) == 0


def test_flush_on_a_full_disk_raises_and_leaves_no_partial_checkpoint(
    small_disk: Disk, trained: tuple[evdb.Database, Model]
) -> None:
    db, model = trained
    path = small_disk.root / "db"
    before = sorted(os.listdir(path / "checkpoints"))
    small_disk.fill()
    with pytest.raises(StorageError) as caught:
        db.flush()
    assert_names_the_disk(caught.value, path)
    assert sorted(os.listdir(path / "checkpoints")) == before
    assert not (path / "evdb.json.tmp").exists()
    with pytest.raises(StorageError):  # still full: raises again, changes nothing
        db.flush()
    small_disk.free()
    db.flush()
    model.step(db.table("t"), 0)
    db.close()
    assert reopened_rows_lost(path, model) == 0


def test_close_on_a_full_disk_raises_and_stays_open_until_space_is_freed(
    small_disk: Disk, trained: tuple[evdb.Database, Model]
) -> None:
    db, model = trained
    path = small_disk.root / "db"
    small_disk.fill()
    with pytest.raises(StorageError) as caught:
        db.close()
    assert_names_the_disk(caught.value, path)
    assert model.rows_lost(db.table("t")) == 0  # open, with every change
    with pytest.raises(evdb.DatabaseLockedError):
        evdb.open(path)
    small_disk.free()
    db.close()
    assert reopened_rows_lost(path, model) == 0


def test_close_without_flush_lets_go_of_a_full_disk(
    small_disk: Disk, trained: tuple[evdb.Database, Model]
) -> None:
    db, _ = trained
    path = small_disk.root / "db"
    small_disk.fill()
    with pytest.raises(StorageError):
        db.close()
    db.close(flush=False)  # drops the changes since the last flush, as a crash would
    small_disk.free()
    with evdb.open(path) as again:
        assert again.tables() == ["t"]


def test_checkpoint_on_a_full_disk_leaves_no_checkpoint(
    small_disk: Disk, trained: tuple[evdb.Database, Model]
) -> None:
    db, model = trained
    dest = small_disk.root / "ckpt"
    db.flush()
    small_disk.fill()
    with pytest.raises(StorageError) as caught:
        db.checkpoint(dest)
    assert_names_the_disk(caught.value, small_disk.root)
    assert sorted(p.name for p in small_disk.root.iterdir()) == ["db", "filler"]
    small_disk.free()
    db.checkpoint(dest)
    evdb.verify(dest)
    model.step(db.table("t"), 0)
    db.close()
    assert reopened_rows_lost(small_disk.root / "db", model) == 0


def test_publish_on_a_full_disk_leaves_no_publication(
    small_disk: Disk, trained: tuple[evdb.Database, Model]
) -> None:
    db, model = trained
    root = small_disk.root / "pub"
    first = db.publish(root)
    model.step(db.table("t"), 0)
    db.flush()
    before = sorted(os.listdir(root))
    small_disk.fill()
    with pytest.raises(StorageError) as caught:
        db.publish(root, full=True)
    assert_names_the_disk(caught.value, small_disk.root)
    assert sorted(os.listdir(root)) == before  # no publication, whole or part
    assert evdb.publish.read_head(root)["seq"] == first["seq"]  # type: ignore[index]
    small_disk.free()
    second = db.publish(root)
    assert second["seq"] == first["seq"] + 1
    db.close()
    assert reopened_rows_lost(small_disk.root / "db", model) == 0


@pytest.mark.parametrize("format", ["npz", "safetensors", "parquet", "serving"])
def test_export_to_a_full_disk_raises_storage_error_and_leaves_nothing(
    small_disk: Disk, tmp_path: Path, format: str
) -> None:
    if format == "parquet":
        pytest.importorskip("pyarrow")
    with evdb.open(tmp_path / "db") as db:
        db.create_table("t", dim=DIM, dram_rows=DRAM_ROWS)
        keys = np.arange(20_000)  # random values: parquet compresses, and must not fit
        values = np.random.default_rng(0).standard_normal((keys.shape[0], DIM))
        db.table("t").upsert(keys, values.astype(np.float32))
    dest = small_disk.root / "out"
    small_disk.fill(leave=256 << 10)  # room to start, not to finish
    with pytest.raises(StorageError) as caught:
        evdb.export(tmp_path / "db", dest, format=format)
    assert_names_the_disk(caught.value, dest)
    assert sorted(p.name for p in small_disk.root.iterdir()) == ["filler"]
    small_disk.free()
    assert evdb.export(tmp_path / "db", dest, format=format)["tables"]["t"]["rows"] == 20_000


@pytest.mark.parametrize("format", ["npz", "serving"])  # serving exited 3, "data corrupt"
def test_cli_export_to_a_full_disk_exits_5_with_one_line(
    small_disk: Disk, tmp_path: Path, format: str
) -> None:
    from click.testing import CliRunner

    from evdb.tools.cli import cli

    with evdb.open(tmp_path / "db") as db:
        db.create_table("t", dim=DIM).upsert(np.arange(20_000), np.ones((20_000, DIM)))
    small_disk.fill(leave=64 << 10)
    done = CliRunner().invoke(
        cli, ["export", str(tmp_path / "db"), str(small_disk.root / "out"), "--format", format]
    )
    assert done.exit_code == 5, done.output
    lines = done.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("evdb: error: "), done.output
    assert "No space left on device" in lines[0] and str(small_disk.root) in lines[0]
