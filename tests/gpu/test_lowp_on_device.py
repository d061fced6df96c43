"""Half-precision tables (``dtype="bfloat16"`` / ``"float16"``) with their HBM tier on CUDA
device 0 (``evdb.tiers.hbm_lowp.DeviceLowpCache``), on the cupy stand-in (tests/cuda_cpu).

The spec is the emulated-HBM twin: the same table with ``device="cpu"`` (``LowpColumnCache``
and the cpu kernels). A device table and its twin take the same calls and must hold the same
bits: rows, slots and stamps after pulls, pushes (stochastic rounding with the table's seed,
and round-to-nearest), upserts and deletes, with rows evicted into DRAM and RocksDB and
promoted back; lookups and bags; a reopen and a checkpoint; the device path (device keys and
gradients, as DLPack brings them from torch); and a torch training loop through the binding.
Optimizer slots are float32 or, with ``slot_dtype``, the table's own half format (then
2 bytes a slot on the device too, rounded with the row as columns dim..).
The kernels are ``backend("gpu")``'s, the CUDA sources built and run on the CPU (on a GPU
with ``EVDB_REAL_CUPY=1``), so the sizes are small: every launch runs its threads as OS
threads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import evdb
from evdb.config import DramConfig, HbmConfig
from evdb.errors import ConfigError
from evdb.kernels.reference.lowp import storage_dtype
from evdb.records import RecordBatch
from evdb.tiers.cache_lowp import as_stored
from evdb.tiers.hbm import device_bytes, hbm_tier
from evdb.tiers.hbm_lowp import DeviceLowpCache
from tests.cuda_cpu.device_kernels import KERNEL_SETS, require_standin, use_kernels

DIM = 8
HBM, DRAM = 8, 16
DTYPES = ["bfloat16", "float16"]
SLOTS = ["float32", "half"]  # slot_dtype: float32, or the table's own dtype
OPTIMIZERS = {
    "Adagrad": evdb.optim.Adagrad(lr=0.1),
    "RowWiseAdagrad": evdb.optim.RowWiseAdagrad(lr=0.1),
    "Adam": evdb.optim.Adam(lr=0.05),
}


@pytest.fixture(params=KERNEL_SETS)
def cp(request: pytest.FixtureRequest, standin_cupy, monkeypatch: pytest.MonkeyPatch) -> Any:
    use_kernels(request.param, standin_cupy, monkeypatch)
    return standin_cupy


def twins(
    db: evdb.Database, dtype: str, slots: str = "float32", **options: Any
) -> tuple[evdb.Table, evdb.Table]:
    """A table with its HBM tier on device 0 and its emulated-HBM twin, alike otherwise;
    slots "half": slot_dtype the table's dtype."""
    opts: dict[str, Any] = {
        "dim": DIM, "hbm_rows": HBM, "dram_rows": DRAM, "dtype": dtype,
        "slot_dtype": dtype if slots == "half" else "float32",
        "optimizer": evdb.optim.Adagrad(lr=0.1), **options,
    }  # fmt: skip
    return db.create_table("dev", device=0, **opts), db.create_table("emu", device="cpu", **opts)


def records_of(t: evdb.Table, keys: np.ndarray) -> tuple[np.ndarray, ...]:
    found, rec = t.read_records(keys)
    return found, rec.values, rec.slots, rec.freq, rec.last_step, rec.version, rec.flags


def assert_same(a: evdb.Table, b: evdb.Table, keys: np.ndarray) -> None:
    """Bit for bit: every record, point lookups and bag lookups."""
    assert len(a) == len(b)
    for x, y in zip(records_of(a, keys), records_of(b, keys), strict=True):
        if x.dtype == np.float32:  # bits: -0.0 is not 0.0 here
            x, y = x.view(np.uint32), y.view(np.uint32)
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(a.lookup(keys), b.lookup(keys))
    scans = [  # the top tier's live blocks, then the rows below it
        sorted((k, v.tobytes()) for vs, ks in t.live_values() for k, v in zip(ks, vs, strict=True))
        for t in (a, b)
    ]
    assert scans[0] == scans[1]
    resident = keys[a.resident(keys)][:6]  # the fused probe + widen + combine on the device
    offsets = np.array([0, 2, 2, resident.shape[0]])
    for combiner in ("sum", "mean"):
        np.testing.assert_array_equal(
            a.lookup(resident, offsets, combiner=combiner),
            b.lookup(resident, offsets, combiner=combiner),
        )


def train(db: evdb.Database, tables: tuple[evdb.Table, ...], steps: int, seed: int) -> None:
    """The same pulls, pushes, upserts and deletes on every table; 60 keys over 8 HBM and 16
    DRAM rows, so rows go down to RocksDB and come back up."""
    rng = np.random.default_rng(seed)
    for step in range(steps):
        keys = (rng.zipf(1.3, 12) % 60).astype(np.int64)
        grads = rng.standard_normal((12, DIM)).astype(np.float32)
        for t in tables:
            t.push(t.pull(keys), grads, per_position=True)
        if step % 3 == 1:
            up = rng.integers(0, 70, 4)
            values = rng.standard_normal((4, DIM)).astype(np.float32)
            gone = rng.integers(0, 60, 2)
            for t in tables:
                t.upsert(up, values)
                t.delete(gone)
        db.advance(1)


@pytest.mark.parametrize("optimizer", ["Adagrad", "RowWiseAdagrad"])
@pytest.mark.parametrize("slots", SLOTS)
@pytest.mark.parametrize("rounding", ["stochastic", "nearest"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_device_half_table_holds_the_bits_of_its_emulated_twin(
    cp, tmp_path: Path, dtype: str, rounding: str, slots: str, optimizer: str
) -> None:
    keys = np.arange(310, dtype=np.int64)
    with evdb.open(tmp_path / "db") as db:
        dev, emu = twins(
            db, dtype, slots, rounding=rounding, initializer=evdb.init.Normal(0, 0.1, 7),
            ttl_steps=5, l2_threshold=0.3, optimizer=OPTIMIZERS[optimizer],
        )  # fmt: skip
        train(db, (dev, emu), steps=8, seed=1)
        assert_same(dev, emu, keys)
        small = np.array([300, 301])  # rows of small norm in HBM, where the device widens them
        for t in (dev, emu):
            t.upsert(small, np.full((2, DIM), 0.01, np.float32))
        assert dev.resident(small).all()
        removed = dev.compact()
        assert removed == emu.compact() and removed["expired"] > 0 and removed["l2"] > 0
        assert_same(dev, emu, keys)
        tiers = dev.stats()["tiers"]
        assert tiers["rocksdb"]["rows"] > 0 and tiers["hbm"]["promotions"] > 0
        hbm = tiers["hbm"]
        assert hbm["device"] == "cuda:0" and hbm["dtype"] == dtype
        assert hbm["rounding"] == rounding
        assert hbm["slot_dtype"] == dev.config.slot_dtype
        # 2 bytes a value, as emulated HBM (rows allocated over rows live: both the same);
        # slots 4 bytes, or 2 when half
        parts, emu_parts = (
            t.stats()["tiers"]["hbm"]["bytes_per_row_by_component"] for t in (dev, emu)
        )
        assert parts["values"] == emu_parts["values"] and parts["slots"] == emu_parts["slots"]
        n_slots = DIM if optimizer == "Adagrad" else 1
        slot_bytes = 2 if slots == "half" else 4
        assert parts["values"] / (2 * DIM) == pytest.approx(parts["slots"] / (slot_bytes * n_slots))
        assert dev._top.slots.dtype == emu._top.slots.dtype  # type: ignore[attr-defined]
        before = {k: v.copy() for k, v in zip(keys.tolist(), dev.lookup(keys), strict=True)}
    with evdb.open(tmp_path / "db") as db:  # reopened: HBM starts empty, rows come back up
        dev, emu = db.table("dev"), db.table("emu")
        assert dev.stats()["tiers"]["hbm"]["rows"] == 0
        got = dev.lookup(keys)
        for i, k in enumerate(keys.tolist()):
            np.testing.assert_array_equal(got[i], before[k])
        train(db, (dev, emu), steps=4, seed=2)
        assert_same(dev, emu, keys)


@pytest.mark.parametrize("optimizer", ["Adagrad", "Adam"])
@pytest.mark.parametrize("slots", SLOTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_checkpoint_of_a_device_half_table_restores_bit_for_bit(
    cp, tmp_path: Path, dtype: str, slots: str, optimizer: str
) -> None:
    keys = np.arange(60, dtype=np.int64)
    with evdb.open(tmp_path / "db") as db:
        dev, emu = twins(db, dtype, slots, optimizer=OPTIMIZERS[optimizer])
        train(db, (dev, emu), steps=5, seed=3)
        assert_same(dev, emu, keys)
        want = records_of(dev, keys)
        db.checkpoint(tmp_path / "ckpt")  # dirty rows still on the device are in it
    with evdb.open(tmp_path / "ckpt", read_only=True) as copy:
        for x, y in zip(records_of(copy.table("dev"), keys), want, strict=True):
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("slots", SLOTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_device_path_trains_a_half_table_as_its_host_twins(
    cp, tmp_path: Path, dtype: str, slots: str
) -> None:
    """Device keys and gradients (what DLPack hands over from torch): rows pulled, combined,
    updated and looked up on the device equal the host path's and emulated HBM's bits."""
    rng = np.random.default_rng(4)
    with evdb.open(tmp_path / "db") as db:
        dev, emu = twins(db, dtype, slots, hbm_rows=12)
        host = db.create_table(
            "host", dim=DIM, hbm_rows=12, dram_rows=DRAM, dtype=dtype, device=0,
            optimizer=evdb.optim.Adagrad(lr=0.1), slot_dtype=dev.config.slot_dtype,
        )  # fmt: skip
        for _ in range(4):  # 20 keys over 12 HBM rows: evictions and promotions
            keys = rng.integers(0, 20, 10)
            offsets = np.array([0, 3, 3, 7])
            grad_out = rng.standard_normal((4, DIM)).astype(np.float32)
            pd, ph, pe = dev.pull(cp.asarray(keys)), host.pull(keys), emu.pull(keys)
            assert isinstance(pd.rows, cp.ndarray)
            np.testing.assert_array_equal(pd.rows.get(), pe.rows)
            np.testing.assert_array_equal(ph.rows, pe.rows)
            # the bag combine is float32 work (the device's and the cpu's sum apart by an ulp,
            # as for a float32 table); the pushes take the same gradients, uploaded
            close = {"rtol": 1e-6, "atol": 1e-7}
            np.testing.assert_allclose(pd.combine(offsets).get(), pe.combine(offsets), **close)
            gd = pd.combine_backward(cp.asarray(grad_out), offsets)
            ge = pe.combine_backward(grad_out, offsets)
            np.testing.assert_allclose(gd.get(), ge, **close)
            dev.push(pd, cp.asarray(ge))
            host.push(ph, ge)
            emu.push(pe, ge)
            db.advance()
            for t in (dev, host):
                assert_same(t, emu, np.arange(25))
            got = dev.lookup(cp.asarray(keys))
            assert isinstance(got, cp.ndarray)
            np.testing.assert_array_equal(got.get(), emu.lookup(keys))
            bags = dev.lookup(cp.asarray(keys), cp.asarray(offsets), combiner="sum")
            np.testing.assert_allclose(
                bags.get(), emu.lookup(keys, offsets, combiner="sum"), rtol=1e-6, atol=1e-7
            )
        assert dev.stats()["tiers"]["hbm"]["evictions"] > 0


def test_rows_cross_the_bus_in_the_tables_dtype_one_copy_a_column(cp, monkeypatch) -> None:
    """A write and a read of n rows copy the values column once each way, at 2 bytes a value
    (SGD: no slot column); values the format holds come back exactly, others as stored."""
    require_standin(cp)
    from tests.cuda_cpu.cupy_standin import _state

    log: list[tuple[str, int]] = []
    counted = _state.count_transfer
    monkeypatch.setattr(_state, "count_transfer", lambda d, b: (log.append((d, b)), counted(d, b)))
    tier = hbm_tier(DIM, 0, HbmConfig(capacity_rows=64, device=0), DramConfig(), dtype="bfloat16")
    assert isinstance(tier, DeviceLowpCache)
    n, rng = 10, np.random.default_rng(5)
    values = rng.standard_normal((n, DIM)).astype(np.float32)
    records = RecordBatch(
        values, np.empty((n, 0), np.float32), np.ones(n, np.uint32), np.arange(n),
        np.arange(n, dtype=np.uint64),
    )  # fmt: skip
    keys = np.arange(100, 100 + n, dtype=np.int64)
    log.clear()
    tier.put(keys, records)
    value_copies = [b for d, b in log if d == "to_device" and b > 8 * n]
    assert value_copies == [n * DIM * 2]
    log.clear()
    found, back = tier.get(keys)
    assert found.all()
    assert [b for d, b in log if d == "to_host" and b > 8 * n] == [n * DIM * 2]
    np.testing.assert_array_equal(back.values, as_stored("bfloat16", values))
    tier.put(keys, back)  # a row that went down and comes back keeps its bits
    np.testing.assert_array_equal(tier.get(keys)[1].values, back.values)


def test_the_size_check_counts_two_byte_values(cp) -> None:
    require_standin(cp)
    rows = 1000
    half, full = device_bytes(DIM, 1, rows, 2), device_bytes(DIM, 1, rows)
    assert full - half == rows * DIM * 2
    cp.cuda.runtime.set_mem_info(half, 10 * full)
    config = HbmConfig(capacity_rows=rows, device=0)
    tier = hbm_tier(DIM, 1, config, DramConfig(), dtype="float16")  # fits at 2 bytes a value
    assert tier.stats()["dtype"] == "float16"
    with pytest.raises(ConfigError, match=rf"needs {full} bytes.* {half} bytes free"):
        hbm_tier(DIM, 1, config, DramConfig())
    n = 2048  # a whole growth step: what the check counts is what the columns take
    records = RecordBatch(
        np.ones((n, DIM), np.float32), np.ones((n, 1), np.float32), np.ones(n, np.uint32),
        np.zeros(n, np.int64), np.zeros(n, np.uint64),
    )  # fmt: skip
    cp.cuda.runtime.set_mem_info(10 * full, 10 * full)
    tier = hbm_tier(DIM, 1, HbmConfig(capacity_rows=n, device=0), DramConfig(), dtype="float16")
    tier.put(np.arange(n, dtype=np.int64), records)
    assert tier.stats()["bytes"] == device_bytes(DIM, 1, n, 2)


def test_the_size_check_counts_two_byte_slots(cp) -> None:
    require_standin(cp)
    rows, n_slots = 1000, 2 * DIM  # Adam's
    half, full = device_bytes(DIM, n_slots, rows, 2, 2), device_bytes(DIM, n_slots, rows, 2)
    assert full - half == rows * n_slots * 2
    cp.cuda.runtime.set_mem_info(half, 10 * full)
    config = HbmConfig(capacity_rows=rows, device=0)
    tier = hbm_tier(DIM, n_slots, config, DramConfig(), dtype="bfloat16", slot_dtype="bfloat16")
    assert tier.stats()["slot_dtype"] == "bfloat16"  # fits at 2 bytes a slot
    with pytest.raises(ConfigError, match=rf"float32 optimizer slots.* needs {full} bytes"):
        hbm_tier(DIM, n_slots, config, DramConfig(), dtype="bfloat16")
    n = 2048  # a whole growth step: what the check counts is what the columns take
    records = RecordBatch(
        np.ones((n, DIM), np.float32), np.ones((n, n_slots), np.float32), np.ones(n, np.uint32),
        np.zeros(n, np.int64), np.zeros(n, np.uint64),
    )  # fmt: skip
    cp.cuda.runtime.set_mem_info(10 * full, 10 * full)
    config = HbmConfig(capacity_rows=n, device=0)
    tier = hbm_tier(DIM, n_slots, config, DramConfig(), dtype="bfloat16", slot_dtype="bfloat16")
    tier.put(np.arange(n, dtype=np.int64), records)
    assert tier.stats()["bytes"] == device_bytes(DIM, n_slots, n, 2, 2)


@pytest.mark.parametrize("slots", SLOTS)
def test_the_torch_binding_trains_a_device_half_table_as_emulated_hbm(
    cp, tmp_path, slots: str
) -> None:
    torch = pytest.importorskip("torch")
    from evdb.torch import EmbeddingBag

    rng = np.random.default_rng(6)
    start = (rng.standard_normal((30, DIM)) * 0.3).astype(np.float32)
    with evdb.open(tmp_path / "db") as db:
        dev, emu = twins(db, "bfloat16", slots, hbm_rows=10)
        modules = []
        for t in (dev, emu):
            t.upsert(np.arange(30), start)
            modules.append(EmbeddingBag(t, mode="mean"))
        for _ in range(6):
            lens = rng.integers(1, 4, 5)
            keys = torch.from_numpy(rng.integers(0, 30, int(lens.sum())))
            offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lens)[:-1]]))
            target = torch.from_numpy(rng.standard_normal((5, DIM)).astype(np.float32))
            outs = []
            for emb in modules:
                out = emb(keys, offsets)
                ((out - target) ** 2).sum().backward()
                outs.append(out.detach())
            db.advance()
            np.testing.assert_allclose(outs[0].numpy(), outs[1].numpy(), rtol=1e-5, atol=1e-6)
        assert dev.stats()["tiers"]["hbm"]["promotions"] > 0
        # The forward's float32 sums may differ by an ulp (as a float32 table's do); the
        # gradients and the rows they round into do not: the rows trained, to the same bits
        got, want = dev.lookup(np.arange(30)), emu.lookup(np.arange(30))
        np.testing.assert_array_equal(got, want)
        assert np.count_nonzero(got != as_stored("bfloat16", start)) > 30
        # float32 slots keep the gradients' last-bit differences; half slots round them away
        # as the rows do
        keys = np.arange(30, dtype=np.int64)
        got_slots, want_slots = records_of(dev, keys)[2], records_of(emu, keys)[2]
        if slots == "half":
            np.testing.assert_array_equal(got_slots, want_slots)
        else:
            np.testing.assert_allclose(got_slots, want_slots, rtol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_half_slots_live_on_the_device_and_cross_the_bus_at_two_bytes(
    cp, monkeypatch, dtype: str
) -> None:
    """slot_dtype = the tier's dtype: the device's slots column is in the values' format, a
    write and a read of n rows copy it once each way at 2 bytes a slot, slots come back as
    stored (rounded to nearest) and a row written back keeps its bits."""
    require_standin(cp)
    from tests.cuda_cpu.cupy_standin import _state

    log: list[tuple[str, int]] = []
    counted = _state.count_transfer
    monkeypatch.setattr(_state, "count_transfer", lambda d, b: (log.append((d, b)), counted(d, b)))
    config = HbmConfig(capacity_rows=64, device=0)
    tier = hbm_tier(DIM, DIM, config, DramConfig(), dtype=dtype, slot_dtype=dtype)
    assert isinstance(tier, DeviceLowpCache)
    assert tier.slots.dtype == storage_dtype(dtype) and tier.stats()["slot_dtype"] == dtype
    full = hbm_tier(DIM, DIM, config, DramConfig(), dtype=dtype)  # float32 slots by default
    assert full.slots.dtype == np.float32 and full.stats()["slot_dtype"] == "float32"
    n, rng = 10, np.random.default_rng(7)
    values = rng.standard_normal((n, DIM)).astype(np.float32)
    slots = rng.uniform(0.0, 3.0, (n, DIM)).astype(np.float32)
    records = RecordBatch(
        values, slots, np.ones(n, np.uint32), np.arange(n), np.arange(n, dtype=np.uint64)
    )
    keys = np.arange(100, 100 + n, dtype=np.int64)
    log.clear()
    tier.put(keys, records)
    assert [b for d, b in log if d == "to_device" and b > 8 * n] == [n * DIM * 2] * 2
    log.clear()
    found, back = tier.get(keys)
    assert found.all()
    assert [b for d, b in log if d == "to_host" and b > 8 * n] == [n * DIM * 2] * 2
    np.testing.assert_array_equal(back.values, as_stored(dtype, values))
    np.testing.assert_array_equal(back.slots, as_stored(dtype, slots))
    assert back.slots.dtype == np.float32 and not np.array_equal(back.slots, slots)
    tier.put(keys, back)  # a row that went down and comes back keeps its bits
    again = tier.get(keys)[1]
    np.testing.assert_array_equal(again.slots.view(np.uint32), back.slots.view(np.uint32))


def test_a_push_before_any_row_was_admitted_drops_its_gradients(cp, tmp_path) -> None:
    """No row stored yet (none admitted): the update has no key to draw, and drops them all."""
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table(
            "t", dim=DIM, hbm_rows=HBM, device=0, dtype="bfloat16",
            admission=evdb.admission.Counter(min_count=2), optimizer=evdb.optim.Adagrad(),
        )  # fmt: skip
        keys = np.array([1, 2, 3])
        p = t.pull(keys)
        assert not p.admitted.any()
        t.push(p, np.ones((3, DIM), np.float32))
        assert t.stats()["dropped_gradients"] == 3 and len(t) == 0
        assert t.pull(keys).admitted.all()  # the second pull admits them
