"""The device path of a table whose HBM tier is on device 0 (``evdb.tiers.device_path``), on
the cupy stand-in: device keys in, device rows out, gathered, stamped, combined and updated by
the CUDA sources (on the CPU executor; a real GPU with EVDB_REAL_CUPY=1).

Twin tables on device 0 take the same calls, one with host arrays (the host path) and one with
device arrays: every row, record and update is bit-equal (the same tier kernels run both; the
bag combine of a batch pulled on the host is the cpu kernel's, so it is compared to 1e-6). The
stand-in's transfer log shows what crosses: with every key resident, nothing row-sized."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import evdb
from evdb.errors import InvalidArgumentError
from tests.cuda_cpu.device_kernels import KERNEL_SETS, require_standin, use_kernels

DIM = 16  # a row is 64 bytes: key-sized copies (8 bytes a key) stay well under it


@pytest.fixture(params=KERNEL_SETS)
def cp(request: pytest.FixtureRequest, standin_cupy, monkeypatch: pytest.MonkeyPatch) -> Any:
    use_kernels(request.param, standin_cupy, monkeypatch)
    return standin_cupy


@pytest.fixture
def copies(cp: Any, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every host <-> device copy from now on, as (direction, bytes)."""
    require_standin(cp)
    from tests.cuda_cpu.cupy_standin import _state

    log: list[tuple[str, int]] = []
    counted = _state.count_transfer

    def count(direction: str, nbytes: int) -> None:
        log.append((direction, int(nbytes)))
        counted(direction, nbytes)

    monkeypatch.setattr(_state, "count_transfer", count)
    return log


def twins(db: evdb.Database, **options: Any) -> tuple[evdb.Table, evdb.Table]:
    """Two tables alike on device 0: "host" gets host arrays, "dev" device arrays."""
    options = {"dim": DIM, "hbm_rows": 64, "device": 0, **options}
    return db.create_table("host", **options), db.create_table("dev", **options)


def records_of(t: evdb.Table, keys: np.ndarray) -> tuple[np.ndarray, ...]:
    found, rec = t.read_records(keys)
    return (found, rec.values, rec.slots, rec.freq, rec.last_step, rec.version, rec.flags)


def assert_same_records(a: evdb.Table, b: evdb.Table, keys: np.ndarray) -> None:
    for x, y in zip(records_of(a, keys), records_of(b, keys), strict=True):
        np.testing.assert_array_equal(x, y)


def test_lookups_on_device_equal_the_host_path(cp, tmp_path) -> None:
    rng = np.random.default_rng(1)
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("t", dim=DIM, hbm_rows=16, device=0, dram_rows=200)
        t.upsert(np.arange(40), rng.standard_normal((40, DIM)).astype(np.float32))
        keys = rng.integers(0, 60, 24)  # resident in HBM, in DRAM below it, and absent
        assert not t.resident(keys).all() and t.resident(keys).any()
        got = t.lookup(cp.asarray(keys))
        assert isinstance(got, cp.ndarray)
        np.testing.assert_array_equal(got.get(), t.lookup(keys))
        offsets, w = np.array([0, 5, 5, 11]), rng.random(24).astype(np.float32)
        for combiner in ("sum", "mean", "sqrtn"):
            dev = t.lookup(cp.asarray(keys), cp.asarray(offsets), cp.asarray(w), combiner)
            host = t.lookup(keys, offsets, w, combiner)
            np.testing.assert_allclose(dev.get(), host, rtol=1e-6, atol=1e-7)
        resident = np.arange(40)[t.resident(np.arange(40))][:12]
        dev = t.lookup(cp.asarray(resident), offsets[:3], cp.asarray(w[:12]), "sum", 1.5)
        np.testing.assert_array_equal(
            dev.get(), t.lookup(resident, offsets[:3], w[:12], "sum", 1.5)
        )
        out = cp.empty((24, DIM), dtype=np.float32)
        assert t.lookup(cp.asarray(keys), out=out) is out


@pytest.mark.parametrize("admission", [None, evdb.admission.Counter(min_count=2)])
def test_training_on_device_updates_rows_as_the_host_path(cp, tmp_path, admission) -> None:
    rng = np.random.default_rng(2)
    options: dict[str, Any] = {"optimizer": evdb.optim.Adagrad(lr=0.2), "hbm_rows": 24}
    if admission is not None:
        options["admission"] = admission
    with evdb.open(tmp_path / "db") as db:
        host, dev = twins(db, **options)
        for step in range(6):  # 30 keys over 24 HBM rows: evictions and promotions
            keys = rng.integers(0, 30, 20)
            offsets = np.sort(rng.choice(np.arange(1, 20), 4, replace=False))
            offsets = np.concatenate([[0], offsets])
            grad_out = rng.standard_normal((5, DIM)).astype(np.float32)
            ph, pd = host.pull(keys), dev.pull(cp.asarray(keys))
            assert isinstance(pd.rows, cp.ndarray) and isinstance(ph.rows, np.ndarray)
            np.testing.assert_array_equal(pd.rows.get(), ph.rows)
            np.testing.assert_array_equal(pd.admitted, ph.admitted)
            ch, cd = ph.combine(offsets), pd.combine(offsets)
            np.testing.assert_allclose(cd.get(), ch, rtol=1e-6, atol=1e-7)
            gh = ph.combine_backward(grad_out, offsets)
            gd = pd.combine_backward(cp.asarray(grad_out), offsets)
            np.testing.assert_allclose(gd.get(), gh, rtol=1e-6, atol=1e-7)
            per_position = step % 2 == 1
            g = rng.standard_normal((20 if per_position else len(ph.keys), DIM)).astype(np.float32)
            host.push(ph, g, per_position=per_position)
            dev.push(pd, cp.asarray(g), per_position=per_position)
            db.advance()
            assert_same_records(host, dev, np.arange(30))
        assert dev.stats()["tiers"]["hbm"]["evictions"] > 0
        assert dev.stats()["tiers"]["hbm"]["key_bytes_to_host"] >= 6 * 20 * 8


def test_with_every_key_resident_no_row_crosses(cp, copies, tmp_path) -> None:
    rng = np.random.default_rng(3)
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("t", dim=DIM, hbm_rows=64, device=0, optimizer=evdb.optim.Adam())
        keys = rng.integers(0, 40, 30)
        t.push(p := t.pull(cp.asarray(keys)), cp.zeros((len(p.keys), DIM), dtype=np.float32))
        before = t.stats()["tiers"]["hbm"]
        copies.clear()
        offsets = np.array([0, 7, 19])
        p = t.pull(cp.asarray(keys))
        p.combine(offsets)
        grads = p.combine_backward(cp.ones((3, DIM), dtype=np.float32), offsets)
        t.push(p, grads)
        t.lookup(cp.asarray(keys))
        t.lookup(cp.asarray(keys), offsets)
        row_bytes = len(p.keys) * DIM * 4
        assert copies, "the keys' bookkeeping crosses"
        assert max(nbytes for _, nbytes in copies) <= 8 * keys.shape[0] < row_bytes
        after = t.stats()["tiers"]["hbm"]
        assert after["key_bytes_to_host"] - before["key_bytes_to_host"] == 8 * keys.shape[0]


def test_misses_go_up_in_one_batched_copy(cp, copies, tmp_path) -> None:
    rng = np.random.default_rng(4)
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("t", dim=DIM, hbm_rows=16, dram_rows=200, device=0)
        t.upsert(np.arange(60), rng.standard_normal((60, DIM)).astype(np.float32))
        keys = np.arange(60)[~t.resident(np.arange(60))][:10]
        keys = np.concatenate([keys, np.arange(60)[t.resident(np.arange(60))][:5], [500]])
        n_miss = 11  # ten rows below HBM, one absent (its default value)
        copies.clear()
        got = t.lookup(cp.asarray(keys))
        # the rest is key-sized: keys, rows' handles, positions (8 bytes a key)
        beyond_keys = [c for c in copies if c[1] > 8 * keys.shape[0]]
        assert beyond_keys == [("to_device", n_miss * DIM * 4)]
        np.testing.assert_array_equal(got.get(), t.lookup(keys))


def test_host_arrays_given_to_the_device_path_are_refused(cp, tmp_path) -> None:
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("t", dim=DIM, hbm_rows=64, device=0, optimizer=evdb.optim.SGD(lr=1))
        keys = cp.asarray(np.array([1, 2, 3]))
        with pytest.raises(InvalidArgumentError, match=r"^out must be a device array"):
            t.lookup(keys, out=np.empty((3, DIM), np.float32))
        with pytest.raises(InvalidArgumentError, match=r"^weights must be a device array"):
            t.lookup(keys, [0, 1], np.ones(3, np.float32), "sum")
        p = t.pull(keys)
        with pytest.raises(InvalidArgumentError, match=r"^grad_out must be a device array"):
            p.combine_backward(np.ones((1, DIM), np.float32), [0])
        with pytest.raises(InvalidArgumentError, match=r"^grads must be a device array"):
            t.push(p, np.ones((3, DIM), np.float32))
        bad = cp.ones((3, DIM), dtype=np.float32)
        bad[1, 2] = np.inf
        with pytest.raises(InvalidArgumentError, match=r"^grads\[1, 2\] = inf is not finite"):
            t.push(p, bad)
        rows = t.lookup(np.array([1, 2, 3]))
        t.push(p, cp.ones((3, DIM), dtype=np.float32))  # the refused pushes changed nothing
        np.testing.assert_array_equal(t.lookup(np.array([1, 2, 3])), rows - 1)
        with pytest.raises(InvalidArgumentError, match=r"^keys must be 1-D"):
            t.lookup(cp.asarray(np.ones((2, 2), np.int64)))


def test_device_keys_given_to_a_table_without_a_device_tier_are_refused(cp, tmp_path) -> None:
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("t", dim=DIM)  # DRAM only: its rows are host memory
        keys = cp.asarray(np.array([1, 2, 3]))
        with pytest.raises(evdb.errors.InvalidTypeError, match=r"^keys: .*HBM tier is on their"):
            t.lookup(keys)
        with pytest.raises(evdb.errors.InvalidTypeError, match=r"^keys: "):
            t.pull(keys)
        assert len(t) == 0
