"""Tables whose optimizer slots are stored in half precision (``slot_dtype``, issue 29): what
is refused, what every tier stores, how pushes round the slots, and that reopening,
spilling, checkpoints and conversion keep them bit for bit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import evdb
from evdb.errors import ConfigError
from evdb.kernels import backend
from evdb.optim import SGD, Adagrad, Adam

from .test_lowp_tables import train

HALF = ["bfloat16", "float16"]
reference = backend("reference")


def slots_table(
    db: evdb.Database, dtype: str, *, name: str = "t", slot_dtype: str | None = None, **kw: object
) -> evdb.Table:
    kw.setdefault("optimizer", Adagrad(lr=0.05))
    kw.setdefault("initializer", evdb.init.Normal(0.0, 0.1, seed=5))
    kw.setdefault("disk", False)
    return db.create_table(
        name, 8, dtype=dtype, slot_dtype=dtype if slot_dtype is None else slot_dtype, **kw
    )  # type: ignore[arg-type]


def records(t: evdb.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(keys, values, slots) of every row, in key order (float32: widened exactly)."""
    keys, values, slots = [], [], []
    for k, r in t.records(1000):
        keys.append(k)
        values.append(r.values)
        slots.append(r.slots)
    order = np.argsort(np.concatenate(keys))
    return (
        np.concatenate(keys)[order],
        np.concatenate(values)[order],
        np.concatenate(slots)[order],
    )


def assert_same_records(got: tuple[np.ndarray, ...], want: tuple[np.ndarray, ...]) -> None:
    """Keys equal, values and slots equal bit for bit."""
    for x, y in zip(got, want, strict=True):
        if x.dtype == np.float32:
            x, y = x.view(np.uint32), y.view(np.uint32)
        np.testing.assert_array_equal(x, y)


# -- refusals ------------------------------------------------------------------------------


def test_a_bad_slot_dtype_is_refused_naming_it_and_the_choices(db: evdb.Database) -> None:
    for bad in ("float64", "bf16", 16, None):
        with pytest.raises(
            ConfigError, match=r"slot_dtype: expected one of \('float32', 'bfloat16', 'float16'\)"
        ):
            db.create_table("t", 4, dtype="bfloat16", slot_dtype=bad, disk=False)  # type: ignore[arg-type]
    assert db.tables() == []


def test_half_slots_on_other_values_are_refused_saying_what_is_supported(
    db: evdb.Database,
) -> None:
    with pytest.raises(ConfigError, match=r"slot_dtype='bfloat16' on a dtype='float32' table"):
        db.create_table("t", 4, slot_dtype="bfloat16", disk=False, optimizer=Adagrad())
    with pytest.raises(ConfigError, match=r"slot_dtype='float16' on a dtype='bfloat16' table"):
        db.create_table("t", 4, dtype="bfloat16", slot_dtype="float16", optimizer=Adagrad())
    assert db.tables() == []
    # an HBM tier on a CUDA device stores half slots too (tests/gpu/test_lowp_on_device.py)
    on_device = evdb.config.TableConfig(
        dim=4, dtype="bfloat16", slot_dtype="bfloat16", optimizer=Adagrad(),
        hbm=evdb.config.HbmConfig(capacity_rows=8, device=0),
    )  # fmt: skip
    assert on_device.slot_dtype == "bfloat16"


# -- storage -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", HALF)
def test_slots_are_stored_in_half_the_bytes(db: evdb.Database, dtype: str) -> None:
    half = slots_table(db, dtype)
    full = slots_table(db, dtype, name="f", slot_dtype="float32")
    for t in (half, full):
        train(t, db, 3)
    assert half._top.slots.dtype == full._top.values.dtype  # the values' storage
    a, b = half.stats()["tiers"]["dram"], full.stats()["tiers"]["dram"]
    assert (a["slot_dtype"], b["slot_dtype"]) == (dtype, "float32")
    by_a, by_b = a["bytes_per_row_by_component"], b["bytes_per_row_by_component"]
    assert by_a["slots"] * 2 == by_b["slots"] == 8 * 4  # Adagrad: dim slots
    assert by_a["values"] == by_b["values"] and by_a["index"] == by_b["index"]
    assert half.config.slot_dtype == dtype and full.config.slot_dtype == "float32"


def test_the_disk_holds_two_bytes_a_slot() -> None:
    from evdb.records import record_dtype
    from evdb.tiers.rocks import disk_dtype

    n_slots = Adam().n_slots(8)
    full = record_dtype(8, n_slots).itemsize
    assert disk_dtype(8, n_slots, "bfloat16", "bfloat16").itemsize == full - 2 * 8 - 2 * n_slots
    assert disk_dtype(8, n_slots, "float16", "float16").itemsize == full - 2 * 8 - 2 * n_slots


@pytest.mark.parametrize("slot", ["<u2", "<f2"])
def test_half_slot_records_pack_to_nearest_and_unpack_exactly(slot: str) -> None:
    from evdb.kernels.reference.lowp import narrow, widen
    from evdb.records import RecordBatch

    rng = np.random.default_rng(4)
    n = 50
    slots = rng.uniform(0.0, 3.0, (n, 3)).astype(np.float32)
    records = RecordBatch(
        values=rng.normal(size=(n, 2)).astype(np.float32), slots=slots,
        freq=np.arange(n, dtype=np.uint32), last_step=np.arange(n, dtype=np.int64),
        version=np.arange(n, dtype=np.uint64),
    )  # fmt: skip
    packed = records.pack("<f4", slot)
    fmt = "bfloat16" if slot == "<u2" else "float16"
    want = widen(narrow(slots, fmt, None))
    back = RecordBatch.unpack(packed.tobytes(), 2, 3, "<f4", slot=slot)
    np.testing.assert_array_equal(back.slots, want)
    assert not np.array_equal(back.slots, slots)  # it did round
    np.testing.assert_array_equal(back.values, records.values)
    again = RecordBatch.unpack(back.pack("<f4", slot), 2, 3, slot=slot)  # stored slots: exact
    np.testing.assert_array_equal(again.slots, back.slots)


# -- pushes --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("optimizer", [Adagrad(lr=0.2), Adam(lr=0.05)])
def test_half_slots_train_close_to_float32_slots(
    tmp_path: Path, dtype: str, optimizer: evdb.optim.Optimizer
) -> None:
    with evdb.open(tmp_path / "a") as a, evdb.open(tmp_path / "b") as b:
        half = slots_table(a, dtype, optimizer=optimizer)
        full = slots_table(b, dtype, slot_dtype="float32", optimizer=optimizer)
        start = full.lookup(np.arange(64))
        train(half, a, 40)
        train(full, b, 40)
        keys = np.arange(64)
        h, f = half.lookup(keys), full.lookup(keys)
        target = np.sin(keys[:, None] + np.arange(8))
        # both learned, and the half slots' rows stay within a few ulps of the float32 slots'
        assert np.abs(f - target).mean() < 0.5 * np.abs(start - target).mean()
        ulp = 2.0 ** (-7 if dtype == "bfloat16" else -10)
        assert np.abs(h - f).max() < 8 * ulp
        assert np.abs(h - f).mean() < ulp
        assert not np.array_equal(h, f)  # the slots' rounding did show


def test_sgd_with_half_slots_is_sgd(tmp_path: Path) -> None:
    # No slots to store: the update is the float32-slot update exactly.
    got = []
    for name, slot_dtype in (("a", "bfloat16"), ("b", "float32")):
        with evdb.open(tmp_path / name) as db:
            t = slots_table(db, "bfloat16", slot_dtype=slot_dtype, optimizer=SGD(lr=0.1))
            train(t, db, 5)
            got.append(t.lookup(np.arange(64)))
    np.testing.assert_array_equal(got[0], got[1])


# -- tiers, reopening, checkpoints ---------------------------------------------------------


@pytest.mark.parametrize("dtype", HALF)
def test_spilling_and_an_emulated_hbm_tier_train_bit_for_bit_as_dram_alone(
    tmp_path: Path, dtype: str
) -> None:
    tables = {}
    dbs = []
    try:
        for name, kw in (
            ("dram", {}),
            ("disk", {"disk": True, "dram_rows": 16}),
            ("hbm", {"hbm_rows": 16, "device": "cpu"}),
        ):
            db = evdb.open(tmp_path / name)
            dbs.append(db)
            t = slots_table(db, dtype, **kw)
            train(t, db, 12)
            tables[name] = t
        tiers = tables["disk"].stats()["tiers"]
        assert tiers["dram"]["evictions"] > 0 and tiers["rocksdb"]["rows"] > 0
        assert tiers["rocksdb"]["slot_dtype"] == dtype
        assert tiers["rocksdb"]["bytes_per_row_by_component"]["slots"] == 2 * 8
        hbm = tables["hbm"].stats()["tiers"]["hbm"]
        assert hbm["evictions"] > 0 and hbm["slot_dtype"] == dtype
        assert_same_records(records(tables["disk"]), records(tables["dram"]))
        assert_same_records(records(tables["hbm"]), records(tables["dram"]))
    finally:
        for db in dbs:
            db.close()


def test_slots_survive_reopen_and_checkpoint_restore_bit_for_bit(tmp_path: Path) -> None:
    with evdb.open(tmp_path / "db") as db:
        t = slots_table(db, "bfloat16", disk=True, dram_rows=16, optimizer=Adam(lr=0.05))
        train(t, db, 8)
        db.checkpoint(tmp_path / "ckpt")
        at_checkpoint = records(t)
        train(t, db, 4)
        before_close = records(t)
        assert not np.array_equal(before_close[2], at_checkpoint[2])
        db.checkpoint(tmp_path / "delta", base=tmp_path / "ckpt")  # the changed rows only
    with evdb.open(tmp_path / "db") as db:
        t = db.table("t")
        assert t.config.slot_dtype == "bfloat16" and t._top.slots.dtype == np.uint16
        assert_same_records(records(t), before_close)
        db.restore_in_place(tmp_path / "ckpt")
        assert_same_records(records(t), at_checkpoint)
    with evdb.open(tmp_path / "work", restore=tmp_path / "ckpt") as db:
        assert_same_records(records(db.table("t")), at_checkpoint)
    with evdb.open(tmp_path / "work2", restore=tmp_path / "delta") as db:
        assert_same_records(records(db.table("t")), before_close)


def test_a_table_that_resumes_after_reopen_trains_as_one_that_never_closed(
    tmp_path: Path,
) -> None:
    with evdb.open(tmp_path / "once") as db:
        t = slots_table(db, "float16", disk=True, dram_rows=16)
        train(t, db, 6)
        train(t, db, 4, seed=1)
        want = records(t)
    with evdb.open(tmp_path / "twice") as db:
        train(slots_table(db, "float16", disk=True, dram_rows=16), db, 6)
    with evdb.open(tmp_path / "twice") as db:
        t = db.table("t")
        train(t, db, 4, seed=1)
        assert_same_records(records(t), want)


# -- conversion ----------------------------------------------------------------------------


def test_convert_keeps_half_slots_with_the_values_or_widens_them(tmp_path: Path) -> None:
    from evdb.convert import convert

    with evdb.open(tmp_path / "src") as db:
        t = slots_table(db, "bfloat16", disk=True)
        train(t, db, 5)
        want = records(t)
    convert(tmp_path / "src", tmp_path / "same", "bfloat16")
    convert(tmp_path / "src", tmp_path / "wide", "float32")
    convert(tmp_path / "src", tmp_path / "wide_slots", "bfloat16", slot_dtype="float32")
    for name, dtype, slot_dtype in (
        ("same", "bfloat16", "bfloat16"),
        ("wide", "float32", "float32"),  # half slots follow the values; float32 holds them
        ("wide_slots", "bfloat16", "float32"),
    ):
        with evdb.open(tmp_path / name, read_only=True) as db:
            t = db.table("t")
            assert (t.config.dtype, t.config.slot_dtype) == (dtype, slot_dtype)
            assert_same_records(records(t), want)  # widening loses nothing
    convert(tmp_path / "wide", tmp_path / "narrow", "bfloat16", slot_dtype="bfloat16")
    with evdb.open(tmp_path / "narrow", read_only=True) as db:
        t = db.table("t")
        assert (t.config.dtype, t.config.slot_dtype) == ("bfloat16", "bfloat16")
        assert_same_records(records(t), want)  # rounding stored values: exact


def test_convert_refuses_a_slot_dtype_the_values_cannot_take_and_writes_nothing(
    tmp_path: Path,
) -> None:
    from evdb.convert import convert
    from evdb.errors import InvalidArgumentError

    with evdb.open(tmp_path / "src") as db:
        train(slots_table(db, "bfloat16"), db, 2)
    for dtype, slot_dtype, match in (
        ("float32", "bfloat16", r"slot_dtype='bfloat16' on a dtype='float32'"),
        ("bfloat16", "int8", r"slot_dtype must be one of \('float32', 'bfloat16', 'float16'\)"),
    ):
        with pytest.raises((ConfigError, InvalidArgumentError), match=match):
            convert(tmp_path / "src", tmp_path / "dest", dtype, slot_dtype=slot_dtype)
        assert not (tmp_path / "dest").exists()


def test_the_command_line_converts_slots(tmp_path: Path) -> None:
    from tests.test_cli import evdb_cli, ok_json

    with evdb.open(tmp_path / "src") as db:
        train(slots_table(db, "bfloat16", slot_dtype="float32"), db, 2)
    out = ok_json(
        "convert", tmp_path / "src", tmp_path / "half", "--dtype", "bfloat16",
        "--slot-dtype", "bfloat16",
    )  # fmt: skip
    assert (out["tables"]["t"]["slots_from"], out["tables"]["t"]["slots_to"]) == (
        "float32",
        "bfloat16",
    )
    with evdb.open(tmp_path / "half", read_only=True) as db:
        assert db.table("t").config.slot_dtype == "bfloat16"
    done = evdb_cli("convert", tmp_path / "src", tmp_path / "x", "--dtype", "bfloat16",
                    "--slot-dtype", "int8")  # fmt: skip
    assert done.returncode == 2 and "--slot-dtype" in done.stderr


# -- exports and stats ---------------------------------------------------------------------


def test_an_npz_round_trip_keeps_half_slots_or_widens_them_with_the_values(
    tmp_path: Path,
) -> None:
    from evdb.io.export import export
    from evdb.io.importer import import_vectors

    with evdb.open(tmp_path / "db") as db:
        t = slots_table(db, "float16", optimizer=Adam(lr=0.05))
        train(t, db, 5)
        want = records(t)
        assert t.stats()["slot_dtype"] == "float16"
        export(db, tmp_path / "out", format="npz", include_slots=True)
    with evdb.open(tmp_path / "db2") as db:
        import_vectors(db, "t", tmp_path / "out" / "t.npz", format="npz")
        back = db.table("t")
        assert (back.config.dtype, back.config.slot_dtype) == ("float16", "float16")
        assert_same_records(records(back), want)
        import_vectors(db, "wide", tmp_path / "out" / "t.npz", format="npz", dtype="float32")
        wide = db.table("wide")
        assert (wide.config.dtype, wide.config.slot_dtype) == ("float32", "float32")
        assert_same_records(records(wide), want)  # widening loses nothing
