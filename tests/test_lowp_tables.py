"""Tables whose rows are stored in bfloat16 or float16 (issue 29): what is stored, what reads
answer, how pushes round, and what is refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import evdb
from evdb.errors import ConfigError
from evdb.kernels import backend
from evdb.kernels.reference.lowp import narrow, widen
from evdb.optim import SGD, Adagrad, Adam, Ftrl, RowWiseAdagrad

HALF = ["bfloat16", "float16"]
reference = backend("reference")


def half_table(db: evdb.Database, dtype: str, dim: int = 8, **kw: object) -> evdb.Table:
    kw.setdefault("optimizer", Adagrad(lr=0.05))
    kw.setdefault("initializer", evdb.init.Normal(0.0, 0.1, seed=5))
    return db.create_table("t", dim, dtype=dtype, disk=False, **kw)  # type: ignore[arg-type]


def representable(x: np.ndarray, dtype: str) -> np.ndarray:
    """x rounded to nearest even in dtype and widened back: what the tier must hold."""
    return widen(narrow(np.asarray(x, np.float32), dtype, None))


def train(t: evdb.Table, db: evdb.Database, steps: int, seed: int = 0) -> None:
    """Pull a random batch (repeats included), push the gradient of 0.5 |x - target|^2."""
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        keys = rng.integers(0, 64, size=48)
        p = t.pull(keys)
        target = np.sin(p.keys[:, None] + np.arange(t.dim)).astype(np.float32)
        t.push(p, (p.rows - target).astype(np.float32))
        db.advance()


# -- refusals ------------------------------------------------------------------------------


def test_a_bad_dtype_is_refused_naming_the_choices(db: evdb.Database) -> None:
    for bad in ("float64", "bf16", 16):
        with pytest.raises(ConfigError, match=r"dtype: expected one of \('float32', 'bfloat16'"):
            db.create_table("t", 4, dtype=bad, disk=False)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"rounding: expected one of \('stochastic', 'nearest'"):
        db.create_table("t", 4, dtype="bfloat16", disk=False, rounding="up")  # type: ignore[arg-type]
    assert db.tables() == []


def test_an_optimizer_without_a_half_update_is_refused_naming_those_with_one(
    db: evdb.Database,
) -> None:
    with pytest.raises(ConfigError, match=r"Ftrl has no half-precision update.*RowWiseAdagrad"):
        db.create_table("t", 4, dtype="float16", disk=False, optimizer=Ftrl())
    assert db.tables() == []


def test_a_disk_of_another_dtype_is_refused_not_widened(db: evdb.Database) -> None:
    # (a CUDA HBM tier stores the table's dtype: tests/gpu/test_lowp_on_device.py)
    with pytest.raises(ConfigError, match=r"disk.dtype='float16' on a dtype='bfloat16' table"):
        db.create_table("t", 4, dtype="bfloat16", disk=evdb.DiskConfig(dtype="float16"))
    assert db.tables() == []


# -- storage and reads ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", HALF)
def test_rows_are_stored_in_half_the_bytes_and_read_as_float32(
    db: evdb.Database, dtype: str
) -> None:
    t = half_table(db, dtype, dim=16)
    twin = db.create_table("f", 16, disk=False, optimizer=Adagrad(lr=0.05))
    values = np.random.default_rng(0).normal(size=(50, 16)).astype(np.float32)
    t.upsert(np.arange(50), values)
    twin.upsert(np.arange(50), values)
    got = t.lookup(np.arange(50))
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, representable(values, dtype))  # to nearest even
    assert not np.array_equal(got, values)  # it did round
    half, full = t.stats()["tiers"]["dram"], twin.stats()["tiers"]["dram"]
    assert half["dtype"] == dtype and full["dtype"] == "float32" and t.stats()["dtype"] == dtype
    by_half, by_full = half["bytes_per_row_by_component"], full["bytes_per_row_by_component"]
    assert by_half["values"] * 2 == by_full["values"] == 16 * 4  # every row allocated is live
    assert by_half["slots"] == by_full["slots"] and by_half["index"] == by_full["index"]
    assert half["bytes"] < full["bytes"]
    out = np.empty((3, 16), np.float32)
    assert t.lookup([2, 1, 99], out=out) is out
    np.testing.assert_array_equal(out[:2], got[[2, 1]])


@pytest.mark.parametrize("dtype", HALF)
def test_a_new_rows_pull_hands_the_trainer_the_row_it_stores(db: evdb.Database, dtype: str) -> None:
    t = half_table(db, dtype)
    p = t.pull([3, 4, 3])
    init = t.config.initializer.values(p.keys, t.dim)
    np.testing.assert_array_equal(p.rows, representable(init, dtype))
    np.testing.assert_array_equal(t.lookup(p.keys), p.rows)
    t.push(p, np.zeros_like(p.rows))
    np.testing.assert_array_equal(t.pull(p.keys).rows, p.rows)  # found rows: the same


@pytest.mark.parametrize("dtype", HALF)
def test_bag_lookups_combine_the_widened_rows(db: evdb.Database, dtype: str) -> None:
    t = half_table(db, dtype)
    t.upsert(np.arange(6), np.random.default_rng(1).normal(size=(6, 8)))
    keys = np.array([0, 1, 2, 7, 3, 4, 5])  # 7 has no row: its initializer value
    weights = np.linspace(0.5, 2.0, 7).astype(np.float32)
    got = t.lookup(keys, offsets=[0, 4], weights=weights, combiner="sum")
    rows = t.lookup(keys)
    want = np.stack([(rows[:4] * weights[:4, None]).sum(0), (rows[4:] * weights[4:, None]).sum(0)])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


# -- pushes --------------------------------------------------------------------------------


@pytest.mark.parametrize("half_slots", [False, True], ids=["float32-slots", "half-slots"])
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize(
    "optimizer", [SGD(lr=0.1), Adagrad(lr=0.1), Adam(lr=0.01), RowWiseAdagrad(lr=0.1)]
)
def test_a_push_is_the_reference_half_update(
    db: evdb.Database, dtype: str, optimizer: evdb.optim.Optimizer, half_slots: bool
) -> None:
    t = half_table(db, dtype, optimizer=optimizer, slot_dtype=dtype if half_slots else "float32")
    db.advance(7)
    train(t, db, 2)  # slots away from their start
    tier = t._top
    keys = np.array([5, 9, 5, 40, 9, 5])
    p = t.pull(keys)
    values, slots = tier.values.copy(), tier.slots.copy()
    start_slots = slots.copy()
    rows = tier.locate(p.keys)
    grads = np.random.default_rng(2).normal(size=(keys.shape[0], t.dim)).astype(np.float32)
    t.push(p, grads, per_position=True)
    positions = np.argsort(p.inverse, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(p.counts)])
    hyper = optimizer.hyper(db.step, t.meta.pushes)
    reference.segment_sum_apply_lowp(
        grads, positions, bounds, rows, tier.row_keys, optimizer.code, hyper, 5, db.step, True,
        values, slots,
    )  # fmt: skip
    np.testing.assert_array_equal(tier.values.view(np.uint16), values.view(np.uint16))
    np.testing.assert_array_equal(tier.slots.view(np.uint8), slots.view(np.uint8))  # bits
    if slots.shape[1]:
        assert (slots[rows] != start_slots[rows]).all(axis=1).mean() > 0.5  # slots moved


@pytest.mark.parametrize("dtype", HALF)
def test_a_half_table_trains_close_to_its_float32_twin(tmp_path: Path, dtype: str) -> None:
    with evdb.open(tmp_path / "a") as a, evdb.open(tmp_path / "b") as b:
        half = half_table(a, dtype, optimizer=Adagrad(lr=0.2))
        full = b.create_table(
            "t", 8, disk=False, optimizer=Adagrad(lr=0.2),
            initializer=evdb.init.Normal(0.0, 0.1, seed=5),
        )  # fmt: skip
        train(half, a, 40)
        train(full, b, 40)
        keys = np.arange(64)
        h, f = half.lookup(keys), full.lookup(keys)
        target = np.sin(keys[:, None] + np.arange(8))
        # both learned (far from where they started), and agree within a few half ulps
        assert np.abs(f - target).mean() < 0.1 * np.abs(target).mean()
        ulp = 2.0 ** (-7 if dtype == "bfloat16" else -10)
        assert np.abs(h - f).max() < 8 * ulp
        assert np.abs(h - f).mean() < ulp


def test_stochastic_rounding_keeps_updates_that_nearest_loses(tmp_path: Path) -> None:
    # lr * g = 1e-3 on weights of 1.0: an eighth of bfloat16's half ulp (2^-8) there
    moved = {}
    for rounding in ("stochastic", "nearest"):
        with evdb.open(tmp_path / rounding) as db:
            t = db.create_table(
                "t", 32, dtype="bfloat16", disk=False, rounding=rounding,
                optimizer=SGD(lr=1e-3), initializer=evdb.init.Constant(1.0),
            )  # fmt: skip
            keys = np.arange(16)
            for _ in range(200):
                p = t.pull(keys)
                t.push(p, np.ones_like(p.rows))
                db.advance()
            moved[rounding] = 1.0 - t.lookup(keys)
    np.testing.assert_array_equal(moved["nearest"], 0.0)  # every update lost
    # 200 updates of 1e-3 move a float32 row by 0.2; unbiased rounding does, on average
    assert abs(moved["stochastic"].mean() - 0.2) < 0.01


def test_training_is_deterministic_for_a_seed(tmp_path: Path) -> None:
    got = []
    for name in ("a", "b"):
        with evdb.open(tmp_path / name) as db:
            t = half_table(db, "bfloat16")
            train(t, db, 10)
            got.append(t.lookup(np.arange(64)))
    np.testing.assert_array_equal(got[0], got[1])


def test_an_emulated_hbm_tier_trains_bit_for_bit_as_dram_alone(tmp_path: Path) -> None:
    got = []
    for name, hbm_rows in (("dram", None), ("hbm", 16)):
        with evdb.open(tmp_path / name) as db:
            t = half_table(
                db, "bfloat16", hbm_rows=hbm_rows, device=None if hbm_rows is None else "cpu"
            )
            train(t, db, 12)
            if hbm_rows is not None:
                assert t.stats()["tiers"]["hbm"]["evictions"] > 0  # rows went down and up
                assert t.stats()["tiers"]["hbm"]["dtype"] == "bfloat16"
            got.append(t.lookup(np.arange(64)))
    np.testing.assert_array_equal(got[0], got[1])


def test_dtype_and_rows_survive_close_and_reopen(tmp_path: Path) -> None:
    with evdb.open(tmp_path / "db") as db:
        t = half_table(db, "float16", rounding="nearest")
        train(t, db, 5)
        before = t.lookup(np.arange(64))
    with evdb.open(tmp_path / "db") as db:
        t = db.table("t")
        assert (t.config.dtype, t.config.rounding) == ("float16", "nearest")
        assert t._top.values.dtype == np.float16
        np.testing.assert_array_equal(t.lookup(np.arange(64)), before)
        train(t, db, 2)  # and it still trains
        assert not np.array_equal(t.lookup(np.arange(64)), before)


# -- the disk tier and checkpoints ---------------------------------------------------------


def spilling(db: evdb.Database, dtype: str, dram_rows: int | None = 16) -> evdb.Table:
    if dram_rows is None:
        return half_table(db, dtype)
    return db.create_table(
        "t", 8, dtype=dtype, dram_rows=dram_rows, optimizer=Adagrad(lr=0.05),
        initializer=evdb.init.Normal(0.0, 0.1, seed=5),
    )  # type: ignore[arg-type]  # fmt: skip


@pytest.mark.parametrize("dtype", HALF)
def test_a_spilling_half_table_trains_bit_for_bit_as_one_in_dram(
    tmp_path: Path, dtype: str
) -> None:
    got = []
    for name, dram_rows in (("dram", None), ("disk", 16)):
        with evdb.open(tmp_path / name) as db:
            t = spilling(db, dtype, dram_rows)
            train(t, db, 12)
            if dram_rows is not None:
                tiers = t.stats()["tiers"]
                assert tiers["dram"]["evictions"] > 0 and tiers["rocksdb"]["rows"] > 0
                assert t.config.disk is not None and t.config.disk.dtype == dtype
                assert tiers["rocksdb"]["dtype"] == dtype  # 2-byte values on disk
                assert tiers["rocksdb"]["bytes_per_row_by_component"]["values"] == 2 * 8
            got.append(t.lookup(np.arange(64)))
    np.testing.assert_array_equal(got[0], got[1])


def test_bfloat16_records_pack_to_nearest_even_and_unpack_exactly() -> None:
    from evdb.kernels.reference.lowp import bfloat16_bits
    from evdb.records import BFLOAT16, RecordBatch

    rng = np.random.default_rng(6)
    x = (rng.normal(size=(300, 5)) * 10.0 ** rng.integers(-30, 30, size=(300, 1))).astype(
        np.float32
    )
    x[0, :4] = [np.nan, np.inf, -np.inf, 3.4e38]  # specials, and one that rounds to inf
    n = x.shape[0]
    records = RecordBatch(
        values=x, slots=rng.normal(size=(n, 2)).astype(np.float32),
        freq=np.arange(n, dtype=np.uint32), last_step=np.arange(n, dtype=np.int64),
        version=np.arange(n, dtype=np.uint64),
    )  # fmt: skip
    packed = records.pack(BFLOAT16)
    np.testing.assert_array_equal(packed["value"], bfloat16_bits(x, None))
    back = RecordBatch.unpack(packed.tobytes(), 5, 2, BFLOAT16)
    assert back.values.dtype == np.float32
    np.testing.assert_array_equal(back.values.view(np.uint32) >> 16, bfloat16_bits(x, None))
    np.testing.assert_array_equal(back.slots, records.slots)
    again = RecordBatch.unpack(back.pack(BFLOAT16), 5, 2, BFLOAT16)  # stored values: exact
    np.testing.assert_array_equal(again.values.view(np.uint32), back.values.view(np.uint32))


def test_the_disk_holds_two_bytes_a_value() -> None:
    from evdb.records import record_dtype
    from evdb.tiers.rocks import disk_dtype

    n_slots = Adagrad().n_slots(8)
    full = record_dtype(8, n_slots).itemsize
    assert disk_dtype(8, n_slots, "bfloat16").itemsize == full - 2 * 8
    assert disk_dtype(8, n_slots, "float16").itemsize == full - 2 * 8


def test_a_spilled_bfloat16_table_reopens_and_restores_bit_for_bit(tmp_path: Path) -> None:
    keys = np.arange(64)
    with evdb.open(tmp_path / "db") as db:
        t = spilling(db, "bfloat16")
        train(t, db, 8)
        db.checkpoint(tmp_path / "ckpt")
        at_checkpoint = t.lookup(keys)
        train(t, db, 4)
        before_close = t.lookup(keys)
        assert not np.array_equal(before_close, at_checkpoint)
    with evdb.open(tmp_path / "db") as db:
        t = db.table("t")
        assert t.config.dtype == "bfloat16" and t._top.values.dtype == np.uint16
        np.testing.assert_array_equal(t.lookup(keys), before_close)
        db.restore_in_place(tmp_path / "ckpt")
        np.testing.assert_array_equal(t.lookup(keys), at_checkpoint)
    with evdb.open(tmp_path / "work", restore=tmp_path / "ckpt") as db:
        np.testing.assert_array_equal(db.table("t").lookup(keys), at_checkpoint)


def test_a_float32_table_may_keep_bfloat16_on_disk_rounded_to_nearest(db: evdb.Database) -> None:
    t = db.create_table("t", 8, dram_rows=4, disk=evdb.DiskConfig(dtype="bfloat16"))
    values = np.random.default_rng(3).normal(size=(32, 8)).astype(np.float32)
    t.upsert(np.arange(32), values)
    got = t.lookup(np.arange(32))
    on_disk = ~np.all(got == values, axis=1)
    assert on_disk.sum() >= 20  # the rows evicted: read back rounded
    np.testing.assert_array_equal(
        got, np.where(on_disk[:, None], representable(values, "bfloat16"), values)
    )


# -- serving snapshots ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", HALF)
def test_a_serving_export_in_half_precision_serves_its_rows_rounded_to_nearest(
    tmp_path: Path, dtype: str
) -> None:
    from evdb.io.export import export

    values = np.random.default_rng(4).normal(size=(40, 8)).astype(np.float32)
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("t", 8, optimizer=Adagrad(lr=0.1))
        t.upsert(np.arange(40), values)
        manifest = export(db, tmp_path / "serve", dtype=dtype, chunk_rows=16)
    assert manifest["dtype"] == dtype
    with evdb.open(tmp_path / "serve", read_only=True) as served:
        s = served.table("t")
        assert s.config.dtype == dtype and s.config.disk is not None
        assert s.config.disk.dtype == dtype
        got = s.lookup(np.arange(40))
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, representable(values, dtype))
        bags = s.lookup(np.arange(40), offsets=[0, 10, 25], combiner="sum")
        np.testing.assert_allclose(bags[1], got[10:25].sum(0), rtol=1e-5, atol=1e-6)


def test_a_bfloat16_export_to_a_file_format_is_refused_naming_serving(tmp_path: Path) -> None:
    from evdb.errors import InvalidArgumentError
    from evdb.io.export import export

    with evdb.open(tmp_path / "db") as db:
        db.create_table("t", 4).upsert([1], [[1.0, 2.0, 3.0, 4.0]])
        with pytest.raises(InvalidArgumentError, match="dtype='bfloat16' needs format='serving'"):
            export(db, tmp_path / "out", format="npz", dtype="bfloat16")
        with pytest.raises(
            InvalidArgumentError,
            match=r"dtype must be one of \('float32', 'float16', 'bfloat16', 'int8', 'int4'\), "
            "got 'int2'",
        ):
            export(db, tmp_path / "out", dtype="int2")
    assert not (tmp_path / "out").exists()


# -- scans and upkeep ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", HALF)
def test_scans_neighbours_and_compaction_see_the_widened_rows(
    db: evdb.Database, dtype: str
) -> None:
    rng = np.random.default_rng(7)
    values = rng.normal(size=(30, 8)).astype(np.float32)
    values[::3] *= 1e-3  # ten rows under the L2 threshold
    t = half_table(db, dtype, l2_threshold=0.05)
    twin = db.create_table("f", 8, disk=False, l2_threshold=0.05)
    t.upsert(np.arange(30), values)
    twin.upsert(np.arange(30), representable(values, dtype))  # the rows t holds, in float32
    t.delete([4])  # a freed row inside the scanned block
    twin.delete([4])
    chunks = list(t.items(chunk_rows=7))
    keys = np.concatenate([k for k, _ in chunks])
    np.testing.assert_array_equal(np.concatenate([r for _, r in chunks]), twin.lookup(keys))
    assert sorted(keys.tolist()) == sorted(set(range(30)) - {4})
    for metric in ("cosine", "dot", "l2"):
        got, want = (
            t.neighbors(values[1], k=5, metric=metric),
            twin.neighbors(values[1], k=5, metric=metric),
        )
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_allclose(got[1], want[1], rtol=1e-6)
    assert t.compact() == twin.compact()
    assert sorted(k for a, _ in t.items() for k in a.tolist()) == sorted(
        k for a, _ in twin.items() for k in a.tolist()
    )
    assert len(t) == 19


def test_an_npz_round_trip_keeps_the_dtype_or_converts_it_when_asked(tmp_path: Path) -> None:
    from evdb.io.export import export
    from evdb.io.importer import import_vectors

    keys = np.arange(64)
    with evdb.open(tmp_path / "db") as db:
        t = half_table(db, "bfloat16")
        train(t, db, 5)
        want = t.lookup(keys)
        export(db, tmp_path / "out", format="npz", include_slots=True)
    with evdb.open(tmp_path / "db2") as db:
        import_vectors(db, "t", tmp_path / "out" / "t.npz", format="npz")
        back = db.table("t")
        assert (back.config.dtype, back.config.rounding) == ("bfloat16", "stochastic")
        np.testing.assert_array_equal(back.lookup(keys), want)
        import_vectors(db, "wide", tmp_path / "out" / "t.npz", format="npz", dtype="float32")
        wide = db.table("wide")
        assert wide.config.dtype == "float32" and wide._top.values.dtype == np.float32
        np.testing.assert_array_equal(wide.lookup(keys), want)  # widening loses nothing


def test_a_table_without_a_disk_tier_persists_its_rows_in_its_dtype(tmp_path: Path) -> None:
    from evdb.storage import rocks_tier
    from evdb.tiers.store import RocksStore

    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("t", dim=8, dtype="bfloat16", disk=False)
        store = RocksStore(tmp_path / "rows", {})
        try:  # where close() writes a DRAM-only table's rows: 2 bytes a value, as in DRAM
            assert rocks_tier(store, "t", t.config).dtype == "bfloat16"
        finally:
            store.close()


@pytest.mark.parametrize("dtype", HALF)
def test_a_push_before_any_row_is_stored_counts_its_rows_dropped(
    db: evdb.Database, dtype: str
) -> None:
    # admission keeps every key out on its first pull: the push finds a tier with no row yet
    t = half_table(db, dtype, admission=evdb.admission.Counter(min_count=2))
    p = t.pull(np.array([3, 4]))
    assert not p.admitted.any()
    t.push(p, np.ones((p.keys.shape[0], t.dim), np.float32))
    assert t.stats()["dropped_gradients"] == 2 and len(t) == 0
