"""Tables that keep their strings: stored per row, persisted, checkpointed, never merged."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import evdb
import evdb.table_reads


def test_strings_are_kept_for_rows_and_survive_reopen(tmp_path: Path) -> None:
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table(
            "w",
            dim=2,
            key_type="str",
            keep_strings=True,
            dram_rows=2,
            admission=evdb.admission.Counter(min_count=2),
        )
        t.upsert(["cat", "dog", "हि"], np.ones((3, 2)))
        t.pull(["a", "a", "b"])  # "a" is admitted, "b" is not: only "a" gets a string
        assert t.strings(["cat", "हि", "a", "b", "never"]) == ["cat", "हि", "a", None, None]
        assert t.strings(evdb.hash_strings(["dog"])) == ["dog"]  # pre-hashed keys too
        t.delete(["dog"])
        assert t.strings(["dog"]) == [None]
    with evdb.open(tmp_path / "db") as db:
        assert db.table("w").strings(["cat", "a"]) == ["cat", "a"]


def test_two_strings_with_one_hash_raise_and_change_nothing(db, monkeypatch) -> None:
    t = db.create_table("w", dim=2, key_type="str", keep_strings=True)
    weak = lambda keys, key_type, arg="keys": np.array([len(k) for k in keys], np.int64)  # noqa: E731
    monkeypatch.setattr(evdb.table_reads, "normalize_keys", weak)  # collisions on demand
    t.upsert(["cat"], [[1.0, 1.0]])
    with pytest.raises(evdb.KeyCollisionError, match="'dog' hashes to key 3, which already"):
        t.upsert(["dog"], [[2.0, 2.0]])
    with pytest.raises(evdb.KeyCollisionError, match="'ab' and 'cd' hash to the same key 2"):
        t.pull(["ab", "cd"])
    assert len(t) == 1 and t.lookup(["cat"]).tolist() == [[1.0, 1.0]]


def test_keep_strings_needs_a_str_table(db) -> None:
    with pytest.raises(evdb.ConfigError, match="keep_strings=True needs key_type='str'"):
        db.create_table("t", dim=2, keep_strings=True)
    t = db.create_table("t", dim=2, key_type="str")
    with pytest.raises(evdb.InvalidArgumentError, match="does not keep its strings"):
        t.strings(["x"])


def test_checkpoints_carry_the_strings(tmp_path: Path) -> None:
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("w", dim=2, key_type="str", keep_strings=True, dram_rows=4)
        t.upsert([f"w{i}" for i in range(50)], np.ones((50, 2)))
        db.checkpoint(tmp_path / "base")
        t.upsert(["new", "w3"], np.zeros((2, 2)))
        t.delete(["w4"])
        db.checkpoint(tmp_path / "inc", base=tmp_path / "base")
    with evdb.open(tmp_path / "open", restore=tmp_path / "inc") as db:
        t = db.table("w")
        assert t.strings(["new", "w3", "w4", "w49"]) == ["new", "w3", None, "w49"]
        assert len(t) == 50


def test_compact_drops_the_strings_of_rows_that_are_gone(db) -> None:
    t = db.create_table(
        "w", dim=2, key_type="str", keep_strings=True, ttl_steps=1, disk=False, dram_rows=3
    )
    t.upsert(["old", "gone1", "gone2"], np.ones((3, 2)))
    t.upsert(["gone3"], np.ones((1, 2)))  # a full DRAM tier without disk drops a row for good
    assert len(t) < 4  # evicted down to the low watermark
    db.advance(2)
    t.upsert(["new"], [[1.0, 1.0]])
    t.compact()
    assert t.strings(["old", "gone1", "gone2", "gone3", "new"]) == [None] * 4 + ["new"]
