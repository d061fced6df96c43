"""An npz export carries its table's config and slots, and ``evdb import`` restores both: export
then import gives the table back; an npz from elsewhere (keys and values only) imports as it
always did."""

from __future__ import annotations

import dataclasses
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import evdb
from evdb.tools.cli import cli

DIM = 3


def trained(db: evdb.Database) -> evdb.Table:
    """A table far from the defaults, trained a little so its Adagrad slots are not fresh."""
    t = db.create_table(
        "t",
        DIM,
        optimizer=evdb.optim.Adagrad(lr=0.3, initial_accumulator=0.2),
        admission=evdb.admission.Counter(min_count=2),
        initializer=evdb.initializers.Normal(0.0, 0.5, 7),
        ttl_steps=50,
        l2_threshold=0.25,
        dram_rows=16,
    )
    rng = np.random.default_rng(0)
    for _ in range(4):
        keys = rng.integers(0, 40, 60)
        p = t.pull(keys)
        t.push(p, rng.standard_normal((p.keys.shape[0], DIM)).astype(np.float32))
        db.advance()
    t.learning_rate = 0.125  # a rate set while training is the config's too
    return t


def rows(t: evdb.Table) -> dict[int, tuple[bytes, bytes]]:
    out = {}
    for keys, recs in t.records(live_only=True):
        for k, v, s in zip(keys.tolist(), recs.values, recs.slots, strict=True):
            out[k] = (v.tobytes(), s.tobytes())
    return out


def export_npz(tmp_path: Path, include_slots: bool) -> tuple[Path, evdb.TableConfig, dict]:
    with evdb.open(tmp_path / "a") as db:
        t = trained(db)
        evdb.export(db, tmp_path / "out", format="npz", include_slots=include_slots)
        return tmp_path / "out" / "t.npz", t.config, rows(t)


def test_export_then_cli_import_gives_the_table_back(tmp_path: Path) -> None:
    src, config, want = export_npz(tmp_path, include_slots=True)
    done = CliRunner().invoke(
        cli, ["import", str(src), str(tmp_path / "b"), "--table", "t", "--format", "npz", "--json"]
    )
    assert done.exit_code == 0, done.output
    result = json.loads(done.output)
    assert (result["config"], result["slots"], result["rows"]) == ("file", True, len(want))
    with evdb.open(tmp_path / "b", read_only=True) as db:
        t = db.table("t")
        assert t.config == config  # optimizer and lr, TTL, admission, initializer, tiers
        assert t.learning_rate == 0.125
        assert rows(t) == want  # values and slots, bit for bit


def test_without_slots_the_config_comes_back_and_slots_start_fresh(tmp_path: Path) -> None:
    src, config, want = export_npz(tmp_path, include_slots=False)
    with evdb.open(tmp_path / "b") as db:
        got = evdb.import_vectors(db, "t", src, "npz")
        t = db.table("t")
        assert (got["config"], got["slots"]) == ("file", False)
        assert t.config == config
        fresh = np.full(DIM, 0.2, np.float32).tobytes()  # Adagrad's initial_accumulator
        assert rows(t) == {k: (v, fresh) for k, (v, _) in want.items()}


def test_given_options_win_over_the_files_config(tmp_path: Path) -> None:
    src, config, _ = export_npz(tmp_path, include_slots=False)
    with evdb.open(tmp_path / "b") as db:
        evdb.import_vectors(db, "t", src, "npz", ttl_steps=None)
        assert db.table("t").config == dataclasses.replace(config, ttl_steps=None)


def test_an_npz_from_elsewhere_imports_with_the_defaults(db, tmp_path: Path) -> None:
    src = tmp_path / "v.npz"
    np.savez(src, keys=np.array([4, 9]), values=np.ones((2, DIM), np.float32))
    got = evdb.import_vectors(db, "n", src, "npz")
    t = db.table("n")
    assert (got["config"], got["slots"]) == ("options", False)
    assert t.config.optimizer == evdb.optim.SGD() and t.config.ttl_steps is None
    assert t.config.admission == evdb.admission.AdmitAll()


def test_slots_of_the_wrong_width_are_refused_before_anything_is_written(db, tmp_path) -> None:
    src = tmp_path / "v.npz"
    keys, values = np.array([4, 9]), np.ones((2, DIM), np.float32)
    np.savez(src, keys=keys, values=values, slots=np.ones((2, 5), np.float32))
    with pytest.raises(
        evdb.ConfigError,
        match=r"slots have 5 columns; the optimizer of table 'n' \('sgd'\) keeps 0",
    ):
        evdb.import_vectors(db, "n", src, "npz")
    assert db.tables() == []
    db.create_table("a", DIM, optimizer=evdb.optim.Adagrad())
    with pytest.raises(evdb.ConfigError, match=r"\('adagrad'\) keeps 3 for dim 3"):
        evdb.import_vectors(db, "a", src, "npz")
    assert len(db.table("a")) == 0


def test_slots_replace_an_existing_rows_slots_and_the_last_duplicate_wins(db, tmp_path) -> None:
    t = db.create_table("a", DIM, optimizer=evdb.optim.Adagrad())
    t.upsert([4], np.zeros((1, DIM), np.float32))
    src = tmp_path / "v.npz"
    slots = np.arange(9, dtype=np.float32).reshape(3, DIM)
    np.savez(src, keys=np.array([4, 9, 4]), values=slots + 10, slots=slots)
    got = evdb.import_vectors(db, "a", src, "npz", freeze=True)
    assert (got["rows"], got["slots"]) == (2, True)
    assert rows(t) == {
        4: ((slots[2] + 10).tobytes(), slots[2].tobytes()),
        9: (
            (slots[1] + 10).tobytes(),
            slots[1].tobytes(),
        ),
    }
    t.push(t.pull([9]), np.ones((1, DIM), np.float32))  # frozen: training reads, never writes
    assert t.lookup([9]).tobytes() == (slots[1] + 10).tobytes()


def test_a_damaged_config_is_corrupt_data(db, tmp_path: Path) -> None:
    src, _, _ = export_npz(tmp_path, include_slots=False)
    bad = tmp_path / "bad.npz"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(bad, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item)
            if item.filename == "config.npy":
                data = data.replace(b'"optimizer"', b'"optimiser"')
            zout.writestr(item, data)
    with pytest.raises(evdb.CorruptDataError, match="'config' is not an evdb table config"):
        evdb.import_vectors(db, "t", bad, "npz")
    assert db.tables() == []
