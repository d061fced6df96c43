"""Resuming from a checkpoint never consumes it (issue 26, item 2): a writable open of a
checkpoint in place is refused with the way to resume, and ``evdb.open(workdir,
restore=ckpt)`` starts a work directory from it (full or incremental) without writing a byte
under it, so it still verifies and can be resumed again."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import evdb
from tests.files import fingerprint


def _rows(db: evdb.Database) -> dict[str, np.ndarray]:
    t = db.table("t")
    return {"values": t.lookup(np.arange(40)), "contains": t.contains(np.arange(40))}


@pytest.fixture
def checkpoints(tmp_path: Path) -> dict[str, object]:
    """A full checkpoint, an incremental one on it, and the state each was taken at."""
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("t", dim=4, dram_rows=8)  # most rows on disk
        t.upsert(np.arange(30), np.arange(120, dtype=np.float32).reshape(30, 4))
        db.advance(5)
        db.checkpoint(tmp_path / "full")
        full = (db.step, _rows(db))
        t.upsert([31, 32], np.full((2, 4), 7.0))
        t.delete([0, 1])
        db.advance(2)
        db.checkpoint(tmp_path / "inc", base=tmp_path / "full")
        inc = (db.step, _rows(db))
    return {"root": tmp_path, "full": full, "inc": inc}


def _assert_state(db: evdb.Database, want: tuple[int, dict[str, np.ndarray]]) -> None:
    step, rows = want
    assert db.step == step
    got = _rows(db)
    np.testing.assert_array_equal(got["values"], rows["values"])
    np.testing.assert_array_equal(got["contains"], rows["contains"])


def test_opening_a_checkpoint_for_writing_in_place_is_refused_with_the_way_to_resume(
    checkpoints: dict[str, object],
) -> None:
    root = checkpoints["root"]
    assert isinstance(root, Path)
    for kind in ("full", "inc"):
        before = fingerprint(root / kind)
        with pytest.raises(evdb.InvalidArgumentError, match=r"restore=.*read_only=True"):
            evdb.open(root / kind)
        assert fingerprint(root / kind) == before  # not even a LOCK file
        evdb.checkpoint.verify(root / kind)
    with evdb.open(root / "full", read_only=True) as served:  # serving it is unchanged
        _assert_state(served, checkpoints["full"])  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["full", "inc"])
def test_restore_resumes_from_a_checkpoint_without_writing_under_it(
    checkpoints: dict[str, object], kind: str
) -> None:
    root = checkpoints["root"]
    assert isinstance(root, Path)
    chain = [root / "full"] if kind == "full" else [root / "full", root / "inc"]
    before = {c: fingerprint(c) for c in chain}
    with evdb.open(root / "work", restore=root / kind) as db:
        _assert_state(db, checkpoints[kind])  # type: ignore[arg-type]
        t = db.table("t")  # training goes on in the work directory
        t.upsert(np.arange(40), np.zeros((40, 4)))
        t.delete([3])
        db.advance()
    with evdb.open(root / "work") as db:  # a database of its own, reopened like any other
        assert db.step == checkpoints[kind][0] + 1  # type: ignore[index]
        assert not db.table("t").contains([3])[0]
    for c in chain:
        assert fingerprint(c) == before[c], f"{c} changed"
        evdb.checkpoint.verify(c)
    with evdb.open(root / "again", restore=root / kind) as db:  # and it resumes again
        _assert_state(db, checkpoints[kind])  # type: ignore[arg-type]


def test_restore_into_a_directory_that_holds_anything_is_refused_and_changes_nothing(
    checkpoints: dict[str, object],
) -> None:
    root = checkpoints["root"]
    assert isinstance(root, Path)
    before = fingerprint(root / "db")
    with pytest.raises(evdb.InvalidArgumentError, match=r"path: .*db is not empty"):
        evdb.open(root / "db", restore=root / "full")
    assert fingerprint(root / "db") == before
    (root / "empty").mkdir()  # an empty directory is fine
    with evdb.open(root / "empty", restore=root / "full") as db:
        _assert_state(db, checkpoints["full"])  # type: ignore[arg-type]


def test_bad_restore_arguments_are_refused_and_create_nothing(
    checkpoints: dict[str, object],
) -> None:
    root = checkpoints["root"]
    assert isinstance(root, Path)
    with pytest.raises(evdb.ConfigError, match="restore: only for a writable open"):
        evdb.open(root / "full", read_only=True, restore=root / "full")
    with pytest.raises(evdb.InvalidArgumentError, match=r"restore: .*db is not an evdb checkpoint"):
        evdb.open(root / "work", restore=root / "db")
    with pytest.raises(evdb.InvalidArgumentError, match="restore must be a path"):
        evdb.open(root / "work", restore=3)  # type: ignore[arg-type]
    assert not (root / "work").exists()


def test_restoring_a_damaged_checkpoint_fails_naming_the_file_and_leaves_no_work_directory(
    checkpoints: dict[str, object],
) -> None:
    root = checkpoints["root"]
    assert isinstance(root, Path)
    damaged = next(p for p in sorted((root / "full").rglob("*.sst")))
    damaged.write_bytes(damaged.read_bytes()[:-1] + b"\x00")
    with pytest.raises(evdb.CorruptDataError, match=damaged.name):
        evdb.open(root / "work", restore=root / "full")
    assert not (root / "work").exists()
