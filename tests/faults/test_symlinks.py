"""evdb never follows a symbolic link inside a database directory (issue 26, item 1): it
deletes and rewrites its own entries there (stale checkpoints, the working copy, the pointer's
temporary file), so a link among them would reach data outside the database. A writable open
refuses, naming the link, and nothing outside changes; entries evdb did not make are left
alone. A link to the whole database directory is fine."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import evdb


def _fingerprint(root: Path) -> dict[str, tuple[int, bytes]]:
    """Every file's mtime and bytes, every directory's entry names (links not followed)."""
    out = {}
    for p in [*sorted(root.rglob("*")), root]:
        st = p.lstat()
        body = p.read_bytes() if p.is_file() else "\n".join(sorted(os.listdir(p))).encode()
        out[str(p.relative_to(root))] = (st.st_mtime_ns, body)
    return out


@pytest.fixture
def closed_db(tmp_path: Path) -> Path:
    with evdb.open(tmp_path / "db") as db:
        db.create_table("t", dim=4).upsert([1, 2, 3], np.ones((3, 4)))
    return tmp_path / "db"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """Someone's data outside the database: a directory, a file, a subdirectory."""
    big = tmp_path / "bigdisk"
    (big / "backups").mkdir(parents=True)
    (big / "backups" / "model.bin").write_bytes(b"precious" * 100)
    (big / "notes.txt").write_text("do not lose me\n")
    return big


def _current(db: Path) -> Path:
    (found,) = [p for p in (db / "checkpoints").iterdir() if p.name.isdigit()]
    return found


def test_a_symlinked_checkpoints_directory_is_refused_and_nothing_outside_is_deleted(
    closed_db: Path, outside: Path
) -> None:
    current = _current(closed_db)
    shutil.move(current, outside / current.name)  # checkpoints/ now lives on "bigdisk"
    (closed_db / "checkpoints").rmdir()
    (closed_db / "checkpoints").symlink_to(outside)
    before = _fingerprint(outside)
    with pytest.raises(evdb.InvalidArgumentError, match=r"checkpoints is a symbolic link"):
        evdb.open(closed_db)
    assert _fingerprint(outside) == before
    assert (outside / "backups" / "model.bin").read_bytes() == b"precious" * 100


@pytest.mark.parametrize(
    "name, target",
    [
        ("rocksdb", "backups"),  # the working copy, recreated (removed first) at every open
        ("rocksdb.tmp", "backups"),  # where the working copy is built
        ("evdb.json.tmp", "notes.txt"),  # written and renamed by every flush
        ("LOCK", "notes.txt"),  # opened and created by every writable open
    ],
)
def test_a_symlinked_internal_entry_is_refused_and_its_target_is_untouched(
    closed_db: Path, outside: Path, name: str, target: str
) -> None:
    link = closed_db / name
    if link.is_dir():
        shutil.rmtree(link)
    elif link.exists():
        link.unlink()
    link.symlink_to(outside / target)
    before = _fingerprint(outside)
    with pytest.raises(evdb.InvalidArgumentError, match=rf"{name} is a symbolic link"):
        evdb.open(closed_db)
    assert _fingerprint(outside) == before


def test_a_symlinked_stale_checkpoint_entry_is_refused_and_its_target_is_untouched(
    closed_db: Path, outside: Path
) -> None:
    (closed_db / "checkpoints" / "0000000099").symlink_to(outside / "backups")
    before = _fingerprint(outside)
    with pytest.raises(evdb.InvalidArgumentError, match=r"0000000099 is a symbolic link"):
        evdb.open(closed_db)
    assert _fingerprint(outside) == before


def test_entries_evdb_did_not_make_in_checkpoints_are_left_alone(closed_db: Path) -> None:
    (closed_db / "checkpoints" / "README").write_text("mine\n")
    (closed_db / "checkpoints" / "keep").mkdir()
    (closed_db / "checkpoints" / "keep" / "x").write_text("mine too\n")
    with evdb.open(closed_db) as db:
        db.table("t").upsert([4], np.ones((1, 4)))
    assert (closed_db / "checkpoints" / "README").read_text() == "mine\n"
    assert (closed_db / "checkpoints" / "keep" / "x").read_text() == "mine too\n"
    with evdb.open(closed_db, read_only=True) as db:
        assert len(db.table("t")) == 4


def test_a_stale_checkpoint_left_by_a_broken_flush_is_still_removed(closed_db: Path) -> None:
    stale = closed_db / "checkpoints" / "0000000099.tmp"
    stale.mkdir()
    (stale / "000001.sst").write_bytes(b"half written")
    with evdb.open(closed_db):
        pass
    assert not stale.exists()


def test_a_symlinked_checkpoint_directory_inside_a_checkpoint_is_never_deleted_through(
    tmp_path: Path, outside: Path
) -> None:
    """The issue's second case: a checkpoint whose checkpoints/ is a link to a directory with
    siblings. Opening it for writing is refused; restoring from it reads it and writes only
    the work directory."""
    with evdb.open(tmp_path / "db") as db:
        db.create_table("t", dim=4).upsert([1, 2, 3], np.ones((3, 4)))
        db.checkpoint(tmp_path / "ckpt")
    ckpt = tmp_path / "ckpt"
    shutil.move(ckpt / "checkpoints", outside / "checkpoints")
    (ckpt / "checkpoints").symlink_to(outside / "checkpoints")
    before = _fingerprint(outside)
    with pytest.raises(evdb.InvalidArgumentError, match="restore="):
        evdb.open(ckpt)
    with evdb.open(tmp_path / "work", restore=ckpt, verify=False) as db:
        assert len(db.table("t")) == 3
    assert _fingerprint(outside) == before


def test_a_database_directory_reached_through_a_link_opens_as_usual(
    closed_db: Path, tmp_path: Path
) -> None:
    (tmp_path / "link").symlink_to(closed_db)
    with evdb.open(tmp_path / "link") as db:
        db.table("t").upsert([9], np.ones((1, 4)))
    with evdb.open(tmp_path / "link", read_only=True) as db:
        assert len(db.table("t")) == 4
