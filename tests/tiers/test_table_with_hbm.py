"""A table with an HBM tier on top: HBM over DRAM over RocksDB behaves exactly like a table
with every row in DRAM, and ``stats()`` shows each level. Creating a tier on a CUDA device
where there is none says clearly why it cannot.

The table tests run on each ``hbm_device`` (``HBM_DEVICES``):

* ``cpu``: emulated HBM (numpy columns, the cpu kernels);
* ``0-cuda``: device 0 on the cupy stand-in (tests/cuda_cpu): cupy arrays, pinned staging,
  the mixing checks, and ``backend("gpu")``, the real CUDA sources built and run on the CPU
  (``tests.cuda_cpu.rawmodule``);
* ``0-numba`` (only with ``EVDB_DEVICE_KERNELS=cuda,numba``): device 0 on the stand-in with
  the cpu kernels behind the device arrays (``tests.cuda_cpu.adapter``).

With ``EVDB_REAL_CUPY=1`` (bench/gpu_check.sh) ``0-cuda`` runs on a real GPU.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import evdb
from evdb.config import HbmConfig, TableConfig
from evdb.io.export import export
from evdb.kernels import backend
from tests.cuda_cpu.device_kernels import KERNEL_SETS, use_kernels

DIM = 4
HBM, DRAM = 8, 24
HBM_DEVICES = ["cpu", *(f"0-{k}" for k in KERNEL_SETS)]
_DEVICE: dict[str, str | int] = {
    "hbm": "cpu"
}  # the device make() puts the HBM tier on (hbm_device)


@pytest.fixture(params=HBM_DEVICES)
def hbm_device(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str | int:
    """Where this test's HBM tier lives (see the module docstring)."""
    if request.param == "cpu":
        device: str | int = "cpu"
    else:
        cupy = request.getfixturevalue("standin_cupy")
        use_kernels(request.param.removeprefix("0-"), cupy, monkeypatch)
        device = 0
    monkeypatch.setitem(_DEVICE, "hbm", device)
    return device


def make(db: evdb.Database, name: str = "t", **kw) -> evdb.Table:
    opts = {"hbm_rows": HBM, "device": _DEVICE["hbm"], "dram_rows": DRAM, **kw}
    return db.create_table(name, dim=DIM, optimizer=evdb.optim.Adagrad(lr=0.1), **opts)


def rows_in(t: evdb.Table, level: str) -> int:
    """Rows the level ("hbm", "dram") holds, as stats() reports it."""
    return int(t.stats()["tiers"][level]["rows"])


def snapshot(t: evdb.Table) -> dict[int, np.ndarray]:
    return {k: v for ks, vs in t.items(16) for k, v in zip(ks.tolist(), vs, strict=True)}


def records_of(t: evdb.Table, keys: np.ndarray) -> tuple[np.ndarray, ...]:
    found, recs = t.read_records(keys)
    return found, recs.values, recs.slots, recs.freq, recs.last_step


def train(db: evdb.Database, tables: list[evdb.Table], steps: int, seed: int = 0) -> None:
    """The same Zipf-like pulls, pushes, upserts and deletes on every table."""
    rng = np.random.default_rng(seed)
    for step in range(steps):
        keys = (rng.zipf(1.3, 40) % 300).astype(np.int64)
        grads = rng.standard_normal((40, DIM)).astype(np.float32)
        for t in tables:
            p = t.pull(keys)
            t.push(p, grads, per_position=True)
        if step % 7 == 3:
            up = rng.integers(0, 400, 10)
            vals = rng.standard_normal((10, DIM)).astype(np.float32)
            gone = rng.integers(0, 300, 5)
            for t in tables:
                t.upsert(up, vals)
                t.delete(gone)
        db.advance(1)


def assert_same_tables(a: evdb.Table, b: evdb.Table) -> None:
    assert len(a) == len(b)
    sa, sb = snapshot(a), snapshot(b)
    assert sorted(sa) == sorted(sb)
    keys = np.array([*sorted(sa), 10**9], dtype=np.int64)
    for x, y in zip(records_of(a, keys), records_of(b, keys), strict=True):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(a.lookup(keys), b.lookup(keys))
    np.testing.assert_array_equal(a.contains(keys), b.contains(keys))


def test_three_levels_hold_the_rows_and_stats_show_each(
    db: evdb.Database, hbm_device: str | int
) -> None:
    t = make(db)
    values = np.arange(800, dtype=np.float32).reshape(200, DIM)
    t.upsert(np.arange(200), values)
    tiers = t.stats()["tiers"]
    assert list(tiers) == ["hbm", "dram", "rocksdb"]
    on_cpu = hbm_device == "cpu"
    assert tiers["hbm"]["device"] == ("cpu" if on_cpu else "cuda:0")
    assert tiers["hbm"]["emulated"] is on_cpu
    assert tiers["hbm"]["rows"] <= HBM and tiers["dram"]["rows"] <= DRAM
    assert tiers["rocksdb"]["rows"] >= 200 - HBM - DRAM
    for level in tiers.values():
        assert {"rows", "hits", "misses", "promotions", "written_back", "evictions"} <= set(level)
    assert tiers["hbm"]["written_back"] >= 200 - HBM  # dirty victims went down into DRAM
    assert tiers["dram"]["written_back"] >= 200 - HBM - DRAM  # and on to disk
    assert len(t) == 200
    keys = np.array([0, 199, 100, 5, 10**6])
    got = t.lookup(keys)
    np.testing.assert_array_equal(got[:4], values[keys[:4]])
    assert t.contains(keys).tolist() == [True] * 4 + [False]
    t.lookup(keys[:4], promote=True)
    assert t.stats()["tiers"]["hbm"]["promotions"] >= 1
    assert t.stats()["tiers"]["dram"]["hits"] + t.stats()["tiers"]["dram"]["misses"] > 0


def test_prefetch_reads_ahead_below_dram_and_changes_no_result(
    db: evdb.Database, hbm_device: str | int
) -> None:
    t = make(db)
    values = np.arange(800, dtype=np.float32).reshape(200, DIM)
    t.upsert(np.arange(200), values)
    keys = np.array([0, 5, 0, 199, 100, 10**6])
    t.prefetch(keys)  # through the HBM chain into the DRAM chain's RocksDB tier
    disk = t.stats()["tiers"]["rocksdb"]
    assert 1 <= disk["read_ahead"] <= 4  # what neither HBM nor DRAM holds, once each
    np.testing.assert_array_equal(t.lookup(keys[:5]), values[keys[:5]])
    assert t.stats()["tiers"]["rocksdb"]["read_ahead_used"] == disk["read_ahead"]


def test_training_matches_a_table_with_every_row_in_dram(
    db: evdb.Database, hbm_device: str | int
) -> None:
    tiered = make(db, "tiered", ttl_steps=6)
    flat = db.create_table(
        "flat", dim=DIM, optimizer=evdb.optim.Adagrad(lr=0.1), ttl_steps=6, disk=False
    )
    train(db, [tiered, flat], steps=40)
    assert_same_tables(tiered, flat)
    assert tiered.stats()["tiers"]["rocksdb"]["rows"] > 0  # rows did reach the disk
    got = {n: tiered.compact()[n] for n in ("expired",)}
    want = {n: flat.compact()[n] for n in ("expired",)}
    assert got == want
    assert_same_tables(tiered, flat)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_training_matches_a_table_with_every_row_in_dram(
    db: evdb.Database, hbm_device: str | int, dtype: str
) -> None:
    """A bf16/fp16 table's rows keep their bits through HBM (emulated, or on device 0 with
    the CUDA update), DRAM and RocksDB: the same as one whose rows all stay in DRAM."""
    opts = {"ttl_steps": 6, "dtype": dtype, "initializer": evdb.init.Normal(0, 0.1, seed=5)}
    tiered = make(db, "tiered", **opts)
    flat = db.create_table(
        "flat", dim=DIM, optimizer=evdb.optim.Adagrad(lr=0.1), disk=False, **opts
    )
    train(db, [tiered, flat], steps=20)
    assert_same_tables(tiered, flat)
    tiers = tiered.stats()["tiers"]
    assert tiers["rocksdb"]["rows"] > 0 and tiers["hbm"]["dtype"] == dtype


def test_a_batch_bigger_than_hbm_over_commits_it_until_the_push(
    db: evdb.Database, hbm_device: str | int
) -> None:
    t = make(db)
    flat = db.create_table("flat", dim=DIM, optimizer=evdb.optim.Adagrad(lr=0.1), disk=False)
    keys = np.arange(50)
    for table in (t, flat):
        p = table.pull(keys)
        assert p.admitted.all()
        if table is t:
            assert rows_in(t, "hbm") == 50  # pinned: the batch in flight is never evicted
        table.push(p, np.ones((50, DIM), np.float32))
    assert rows_in(t, "hbm") <= HBM and rows_in(t, "dram") <= DRAM and len(t) == 50
    p = t.pull(keys)  # the whole batch comes back up from DRAM and disk
    assert rows_in(t, "hbm") == 50 and p.admitted.all()
    np.testing.assert_array_equal(p.rows, flat.pull(keys).rows)


def test_delete_contains_and_len_across_levels(db: evdb.Database, hbm_device: str | int) -> None:
    t = make(db)
    t.upsert(np.arange(100), np.ones((100, DIM), np.float32))
    keys = np.arange(100)
    top, dram = t.resident(keys), t.resident(keys, tier="dram")
    on_top, in_dram, on_disk = keys[top][:2], keys[dram & ~top][:2], keys[~top & ~dram][:2]
    assert on_top.size == in_dram.size == on_disk.size == 2
    gone = np.concatenate([on_top, in_dram, on_disk, [10**6]])
    assert t.delete(gone) == 6
    assert not t.contains(gone).any() and len(t) == 94
    assert t.delete(gone) == 0
    assert sorted(snapshot(t)) == sorted(set(range(100)) - set(gone.tolist()))


def test_flush_and_reopen_keep_every_row(tmp_path: Path, hbm_device: str | int) -> None:
    with evdb.open(tmp_path / "db") as db:
        t = make(db, ttl_steps=10)
        flat = db.create_table(
            "flat", dim=DIM, optimizer=evdb.optim.Adagrad(lr=0.1), ttl_steps=10, disk=False
        )
        train(db, [t, flat], steps=25, seed=3)
        before = snapshot(t)
        db.flush()
        assert t.stats()["tiers"]["hbm"]["dirty_rows"] == 0
        assert t.stats()["tiers"]["dram"]["dirty_rows"] == 0
    with evdb.open(tmp_path / "db") as db:
        t, flat = db.table("t"), db.table("flat")
        assert t.config.hbm == HbmConfig(capacity_rows=HBM, device=hbm_device)
        assert rows_in(t, "hbm") == 0  # the HBM tier starts empty; rows come up as they are read
        assert snapshot(t).keys() == before.keys()
        assert_same_tables(t, flat)
        train(db, [t, flat], steps=10, seed=4)  # and training goes on the same
        assert_same_tables(t, flat)


def test_checkpoint_and_export_see_every_level(
    db: evdb.Database, tmp_path: Path, hbm_device: str | int
) -> None:
    t = make(db)
    t.upsert(np.arange(120), np.arange(480, dtype=np.float32).reshape(120, DIM))
    p = t.pull(np.arange(10))
    t.push(p, np.ones((10, DIM), np.float32))  # dirty rows in HBM, not yet flushed
    want = snapshot(t)
    db.checkpoint(tmp_path / "ckpt")
    t.upsert(np.arange(200, 230), np.zeros((30, DIM), np.float32))
    db.checkpoint(tmp_path / "incr", base=tmp_path / "ckpt")
    with evdb.open(tmp_path / "work", restore=tmp_path / "incr") as copy:  # base + changes
        assert len(copy.table("t")) == 150
    with evdb.open(tmp_path / "ckpt", read_only=True) as copy:
        got = snapshot(copy.table("t"))
        assert got.keys() == want.keys()
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])
    manifest = export(db, tmp_path / "out", format="npz")
    assert manifest["tables"]["t"]["rows"] == 150
    with np.load(tmp_path / "out" / manifest["tables"]["t"]["file"]) as z:
        assert sorted(z["keys"].tolist()) == sorted(snapshot(t))


def test_hbm_over_dram_without_a_disk_reloads_every_row_into_dram(
    tmp_path: Path, hbm_device: str | int
) -> None:
    with evdb.open(tmp_path / "db") as db:
        t = make(db, dram_rows=None, disk=False)
        t.upsert(np.arange(60), np.ones((60, DIM), np.float32))
        assert rows_in(t, "hbm") <= HBM and rows_in(t, "dram") == 60 - rows_in(t, "hbm")
    with evdb.open(tmp_path / "db") as db:
        t = db.table("t")
        assert rows_in(t, "dram") == 60 and len(t) == 60


def test_a_cuda_device_where_there_is_none_is_refused_and_nothing_is_created(
    db: evdb.Database,
) -> None:
    try:
        backend("gpu")
    except evdb.ConfigError:
        pass
    else:
        pytest.skip("this machine has cupy and a CUDA device")
    with pytest.raises(evdb.ConfigError, match=r"device=0: .*device='cpu'") as caught:
        db.create_table("gpu", dim=DIM, hbm_rows=16)  # device 0 by default
    assert "cupy" in str(caught.value) or "no CUDA device" in str(caught.value)
    with pytest.raises(evdb.ConfigError, match="device=1"):
        db.create_table("gpu", dim=DIM, hbm_rows=16, device=1)
    assert db.tables() == [] and not any("gpu" in cf for cf in db.storage.column_families)
    db.flush()


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"hbm_rows": 0, "device": "cpu"}, "hbm_rows must be >= 1"),
        ({"hbm_rows": 1.5, "device": "cpu"}, "hbm_rows must be an int"),
        ({"hbm_rows": 4, "device": "cuda"}, "device must be a CUDA device number"),
        ({"hbm_rows": 4, "device": -1}, "device must be a CUDA device number"),
        ({"hbm_rows": 4, "device": True}, "device must be a CUDA device number"),
        ({"device": "cpu"}, "needs hbm_rows"),
        ({"hbm_rows": 4, "hbm": HbmConfig(4, "cpu")}, "not both"),
        ({"hbm": 4}, "hbm must be an HbmConfig"),
        (
            {"hbm_rows": 4, "device": "cpu", "disk": False, "dram_rows": 10},
            "needs an unbounded DRAM tier",
        ),
    ],
)
def test_bad_hbm_options_name_the_argument(db: evdb.Database, kw: dict, message: str) -> None:
    with pytest.raises(evdb.ConfigError, match=message):
        db.create_table("t", dim=DIM, **kw)
    assert db.tables() == []


def test_hbm_config_round_trips_and_old_configs_load() -> None:
    config = TableConfig(dim=DIM, hbm=HbmConfig(capacity_rows=32, device="cpu"))
    assert TableConfig.from_dict(config.to_dict()) == config
    old = TableConfig(dim=DIM).to_dict()
    del old["hbm"]  # written before the HBM tier existed
    assert TableConfig.from_dict(old).hbm is None
    with pytest.raises(evdb.ConfigError, match=r"hbm\.capacity_rows"):
        HbmConfig(capacity_rows=0)


def test_an_old_database_without_hbm_opens_and_keeps_its_tiers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    to_dict = TableConfig.to_dict

    def old_to_dict(self: TableConfig) -> dict:
        d = to_dict(self)
        del d["hbm"]  # the manifest as written before the HBM tier existed
        return d

    monkeypatch.setattr(TableConfig, "to_dict", old_to_dict)
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("t", dim=DIM, dram_rows=10)
        t.upsert(np.arange(40), np.ones((40, DIM), np.float32))
    monkeypatch.undo()
    with evdb.open(tmp_path / "db") as db:
        t = db.table("t")
        assert t.config.hbm is None and list(t.stats()["tiers"]) == ["dram", "rocksdb"]
        assert len(t) == 40


def test_reopening_an_hbm_table_where_its_device_is_missing_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database whose table asked for an HBM device, opened on a machine that lacks it,
    is refused with the device's reason (ConfigError), not called corrupt."""
    with evdb.open(tmp_path / "db") as db:
        db.create_table("t", dim=2, hbm_rows=4, device="cpu")

    def no_device(device: object) -> None:
        raise evdb.ConfigError(f"device {device!r}: no CUDA device on this machine")

    monkeypatch.setattr("evdb.database.require_device", no_device)
    with pytest.raises(evdb.ConfigError, match="no CUDA device") as info:
        evdb.open(tmp_path / "db")
    assert not isinstance(info.value, evdb.CorruptDataError)
