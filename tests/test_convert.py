"""``evdb.convert`` and ``evdb convert``: a database's rows in another dtype, in a new database,
with every record and every table's state carried, and the source unchanged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import evdb
from evdb.admission import Counter
from evdb.convert import convert
from evdb.errors import InvalidArgumentError
from evdb.kernels.reference.lowp import narrow, widen
from evdb.optim import Adam
from tests.test_cli import evdb_cli, fails, ok_json

DIM = 8


def trained(path: Path, dtype: str = "float32", steps: int = 6) -> None:
    """A database with a spilling Adam table (TTL, counter admission with pending keys) and
    a table that keeps its strings, trained for a few steps."""
    rng = np.random.default_rng(7)
    with evdb.open(path) as db:
        t = db.create_table(
            "emb",
            DIM,
            optimizer=Adam(lr=0.05),
            ttl_steps=50,
            admission=Counter(min_count=2),
            dram_rows=40,  # most of the rows live in RocksDB
            dtype=dtype,  # type: ignore[arg-type]
        )
        w = db.create_table("words", DIM, key_type="str", keep_strings=True)
        w.upsert(["alpha", "beta", "gamma"], rng.normal(size=(3, DIM)).astype(np.float32))
        for _ in range(steps):
            keys = rng.integers(0, 300, size=200)
            p = t.pull(keys)
            t.push(p, rng.normal(size=p.rows.shape).astype(np.float32))
            db.advance()
        t.upsert([10**9], np.full((1, DIM), 3e5, np.float32))  # beyond float16's range


def records(path: Path, table: str) -> dict[str, np.ndarray]:
    """Every stored record of a table, sorted by key, and its stats' admission part."""
    with evdb.open(path, read_only=True) as db:
        t = db.table(table)
        chunks = list(t.records())
        keys = np.concatenate([k for k, _ in chunks])
        order = np.argsort(keys)
        out = {"keys": keys[order], "step": np.array(db.step)}
        for field in ("values", "slots", "freq", "last_step", "version", "flags"):
            out[field] = np.concatenate([getattr(r, field) for _, r in chunks])[order]
        out["pending"] = np.array(t.stats()["admission"].get("pending", -1))
        return out


def without_dtype(config: dict[str, Any]) -> dict[str, Any]:
    c = {k: v for k, v in config.items() if k != "dtype"}
    c["disk"] = {k: v for k, v in (c["disk"] or {}).items() if k != "dtype"}
    return c


def test_every_record_and_the_tables_state_carry_over_with_rounded_values(tmp_path: Path) -> None:
    src, dest = tmp_path / "src", tmp_path / "bf16"
    trained(src)
    before = records(src, "emb")
    result = convert(src, dest, "bfloat16", tables=["emb"])
    assert result["tables"]["emb"] == {
        "rows": before["keys"].shape[0],
        "from": "float32",
        "to": "bfloat16",
        "slots_from": "float32",  # float32 slots stay float32 unless asked
        "slots_to": "float32",
    }
    assert result["tables"]["words"]["to"] == "float32"  # not chosen: copied as it was

    after = records(dest, "emb")
    assert np.array_equal(after["keys"], before["keys"])
    rounded = widen(narrow(before["values"], "bfloat16", None))  # to nearest even
    assert np.array_equal(after["values"], rounded)
    assert not np.array_equal(after["values"], before["values"])
    for field in ("slots", "freq", "last_step", "version", "flags", "step", "pending"):
        assert np.array_equal(after[field], before[field]), field
    assert int(before["pending"]) > 0  # the admission's pending counts were there to carry
    assert records(src, "emb")["values"].tobytes() == before["values"].tobytes()  # unchanged

    with evdb.open(src, read_only=True) as a, evdb.open(dest, read_only=True) as b:
        old, new = a.table("emb").config, b.table("emb").config
        assert (new.dtype, new.disk.dtype) == ("bfloat16", "bfloat16")  # type: ignore[union-attr]
        assert without_dtype(new.to_dict()) == without_dtype(old.to_dict())
        assert b.table("words").strings(b.table("words").records().__next__()[0]) == a.table(
            "words"
        ).strings(a.table("words").records().__next__()[0])
        assert (
            b.table("words").lookup(["beta"]).tolist() == a.table("words").lookup(["beta"]).tolist()
        )


def test_training_resumed_from_a_converted_copy_goes_on_as_from_the_source(tmp_path: Path) -> None:
    src = tmp_path / "src"
    trained(src, dtype="bfloat16")
    convert(src, tmp_path / "copy", "bfloat16")  # same dtype: a faithful copy
    rng = np.random.default_rng(3)
    keys = rng.integers(0, 300, size=300)
    grads = rng.normal(size=(np.unique(keys).shape[0], DIM)).astype(np.float32)
    got = []
    for path in (src, tmp_path / "copy"):
        with evdb.open(path) as db:
            t = db.table("emb")
            t.push(t.pull(keys), grads)  # Adam's bias correction reads the table's pushes
            db.advance()
            got.append((t.lookup(keys), len(t), t.stats()["admission"]))
    assert np.array_equal(got[0][0], got[1][0])
    assert got[0][1:] == got[1][1:]


def test_widening_back_to_float32_is_exact(tmp_path: Path) -> None:
    trained(tmp_path / "src", dtype="bfloat16")
    convert(tmp_path / "src", tmp_path / "f32", "float32")
    half, full = records(tmp_path / "src", "emb"), records(tmp_path / "f32", "emb")
    assert np.array_equal(half["values"], full["values"])
    with evdb.open(tmp_path / "f32", read_only=True) as db:
        assert db.table("emb").config.dtype == "float32"


def test_a_value_beyond_float16_is_refused_naming_the_key_and_leaves_no_dest(
    tmp_path: Path,
) -> None:
    trained(tmp_path / "src")
    with pytest.raises(InvalidArgumentError, match=r"table 'emb', key 1000000000 holds 300000"):
        convert(tmp_path / "src", tmp_path / "f16", "float16")
    assert not (tmp_path / "f16").exists()
    convert(tmp_path / "src", tmp_path / "f16", "float16", tables=["words"])  # fits


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dtype": "int8"}, r"dtype must be one of \('float32', 'bfloat16', 'float16'\)"),
        ({"dtype": "float16", "rounding": "up"}, "rounding must be one of"),
        ({"dtype": "float16", "tables": ["nope"]}, "tables: no table 'nope'"),
        ({"dtype": "float16", "tables": "emb"}, "tables must be a sequence"),
    ],
)
def test_bad_arguments_are_named_and_nothing_is_written(
    tmp_path: Path, kwargs: dict[str, Any], message: str
) -> None:
    trained(tmp_path / "src", steps=1)
    with pytest.raises(InvalidArgumentError, match=message):
        convert(tmp_path / "src", tmp_path / "out", **kwargs)
    assert not (tmp_path / "out").exists()


def test_an_existing_dest_is_refused(tmp_path: Path) -> None:
    trained(tmp_path / "src", steps=1)
    (tmp_path / "out").mkdir()
    with pytest.raises(InvalidArgumentError, match=r"dest: .* exists"):
        convert(tmp_path / "src", tmp_path / "out", "bfloat16")
    assert list((tmp_path / "out").iterdir()) == []


def test_the_command_line(tmp_path: Path) -> None:
    trained(tmp_path / "src", steps=2)
    out = ok_json("convert", tmp_path / "src", tmp_path / "bf16", "--dtype", "bfloat16")
    assert out["tables"]["emb"]["to"] == "bfloat16" and out["step"] == 2
    line = fails(4, "convert", tmp_path / "missing", tmp_path / "x", "--dtype", "bfloat16")
    assert "SRC:" in line
    line = fails(2, "convert", tmp_path / "src", tmp_path / "f16", "--dtype", "float16")
    assert "key 1000000000" in line and "bfloat16" in line
    done = evdb_cli("convert", tmp_path / "src", tmp_path / "y", "--dtype", "int4")
    assert done.returncode == 2 and "--dtype" in done.stderr
