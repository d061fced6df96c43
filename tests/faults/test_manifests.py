"""Manifests are trusted no further than the directory they describe (issue 26, item 6).

``evdb verify`` (and every open that verifies) checks the directory's actual files against
the manifest: a name that leaves the directory, a file the manifest does not list, a link or
a missing or mistyped field is ``CorruptDataError`` naming the file (and the field), never a
file read from elsewhere, an "OK", or a ``KeyError``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import evdb
from evdb import checkpoint as ck
from evdb import publish
from tests.test_cli import evdb_cli


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("manifests")
    with evdb.open(root / "db") as db:
        db.create_table("t", dim=4).upsert(np.arange(100), np.ones((100, 4), np.float32))
        db.advance(3)
        db.checkpoint(root / "ckpt")
    return root / "ckpt"


@pytest.fixture
def ckpt(pristine: Path, tmp_path: Path) -> Path:
    """A fresh copy of a good checkpoint, to damage."""
    copy = tmp_path / "ckpt"
    subprocess.run(["cp", "-a", str(pristine), str(copy)], check=True)
    ck.verify(copy)
    return copy


def edit(root: Path, change: Any) -> None:
    path = root / ck.MANIFEST
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


def entry_of(path: Path) -> dict[str, Any]:
    return {"size": path.stat().st_size, "xxh3_128": ck.file_digest(path)}


def biggest_file(root: Path) -> Path:
    return max((p for p in root.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


@pytest.mark.parametrize("name", ["../outside.bin", "{outside}", "./../outside.bin"])
def test_verify_refuses_a_listed_name_that_leaves_the_directory(
    ckpt: Path, tmp_path: Path, name: str
) -> None:
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"not part of the checkpoint")
    name = name.format(outside=outside)
    # size and checksum right: only refusing the name keeps verify from reading it
    edit(ckpt, lambda m: m["files"].update({name: entry_of(outside)}))
    with pytest.raises(evdb.CorruptDataError, match="inside the directory") as e:
        evdb.verify(ckpt)
    assert "MANIFEST.json" in str(e.value)


def test_verify_refuses_files_the_manifest_does_not_list(ckpt: Path) -> None:
    edit(ckpt, lambda m: m.update(files={}))
    with pytest.raises(evdb.CorruptDataError, match="not listed"):
        evdb.verify(ckpt)
    with pytest.raises(evdb.CorruptDataError, match="not listed"):
        evdb.open(ckpt, read_only=True)


def test_verify_refuses_a_file_added_after_the_checkpoint(ckpt: Path) -> None:
    (ckpt / "checkpoints" / "extra.sst").write_bytes(b"x")
    with pytest.raises(evdb.CorruptDataError, match=r"extra\.sst: not listed"):
        evdb.verify(ckpt)


def test_a_listed_file_replaced_by_a_link_is_neither_verified_nor_served(
    ckpt: Path, tmp_path: Path
) -> None:
    victim = biggest_file(ckpt)
    outside = tmp_path / "elsewhere" / victim.name
    outside.parent.mkdir()
    os.replace(victim, outside)  # the same bytes, now outside the checkpoint
    victim.symlink_to(outside)
    with pytest.raises(evdb.CorruptDataError, match=f"{victim.name}: a symbolic link"):
        evdb.verify(ckpt)
    with pytest.raises(evdb.CorruptDataError, match="symbolic link"):
        evdb.open(ckpt, read_only=True)


def test_a_linked_directory_inside_a_checkpoint_is_refused(ckpt: Path, tmp_path: Path) -> None:
    inner = ckpt / "checkpoints"
    os.replace(inner, tmp_path / "moved")
    inner.symlink_to(tmp_path / "moved")
    with pytest.raises(evdb.CorruptDataError, match="checkpoints: a symbolic link"):
        evdb.verify(ckpt)


def _drop(*path: str) -> Any:
    def change(m: dict[str, Any]) -> None:
        for key in path[:-1]:
            m = m[key]
        del m[path[-1]]

    return change


def _set(value: Any, *path: str) -> Any:
    def change(m: dict[str, Any]) -> None:
        for key in path[:-1]:
            m = m[key]
        m[path[-1]] = value

    return change


def _first_file(m: dict[str, Any]) -> dict[str, Any]:
    return m["files"][sorted(m["files"])[0]]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (_drop("files"), "files is missing"),
        (_set([], "files"), "files must be an object"),
        (_drop("kind"), "kind must be"),
        (_set("weird", "kind"), "kind must be"),
        (_drop("step"), "step is missing"),
        (_set("3", "step"), "step must be an int"),
        (_set(-1, "step"), "step must be an int >= 0"),
        (_drop("tables"), "tables is missing"),
        (_set({"t": 5}, "tables"), r"tables\['t'\] must be an object"),
        (_drop("tables", "t", "rows"), r"tables\['t'\].rows is missing"),
        (_set("now", "created"), "created must be a number"),
        (lambda m: _first_file(m).update(size="12"), r"files\[.*\]\.size must be an int"),
        (lambda m: _first_file(m).update(size=True), r"files\[.*\]\.size must be an int"),
        (lambda m: _first_file(m).pop("xxh3_128"), r"files\[.*\]\.xxh3_128 is missing"),
        (lambda m: _first_file(m).update(xxh3_128=7), r"files\[.*\]\.xxh3_128 must be an xxh3-128"),
    ],
)
def test_a_missing_or_mistyped_manifest_field_is_corrupt_naming_it(
    ckpt: Path, change: Any, field: str
) -> None:
    edit(ckpt, change)
    with pytest.raises(evdb.CorruptDataError, match=f"MANIFEST.json: field {field}"):
        evdb.verify(ckpt)
    with pytest.raises(evdb.CorruptDataError, match=r"MANIFEST\.json: field"):
        evdb.open(ckpt, read_only=True, verify=False)  # a read-only open reads it too


def test_an_incremental_manifest_without_its_base_is_corrupt_naming_the_field(
    tmp_path: Path,
) -> None:
    with evdb.open(tmp_path / "db") as db:
        db.create_table("t", dim=2).upsert([1], [[1.0, 2.0]])
        db.checkpoint(tmp_path / "base")
        db.table("t").upsert([2], [[3.0, 4.0]])
        db.checkpoint(tmp_path / "inc", base=tmp_path / "base")
    edit(tmp_path / "inc", _drop("base_manifest"))
    with pytest.raises(evdb.CorruptDataError, match="field base_manifest is missing"):
        evdb.verify(tmp_path / "inc")


def test_an_incremental_whose_base_is_gone_is_corrupt_not_a_file_error(tmp_path: Path) -> None:
    with evdb.open(tmp_path / "db") as db:
        db.create_table("t", dim=2).upsert([1], [[1.0, 2.0]])
        db.checkpoint(tmp_path / "base")
        db.checkpoint(tmp_path / "inc", base=tmp_path / "base")
    (tmp_path / "base" / ck.MANIFEST).unlink()
    with pytest.raises(evdb.CorruptDataError, match=r"base of .* is gone"):
        evdb.verify(tmp_path / "inc")


def test_evdb_verify_reports_a_manifest_without_files_in_one_line(ckpt: Path) -> None:
    edit(ckpt, _drop("files"))
    done = evdb_cli("verify", ckpt)
    assert done.returncode == 3, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip() == f"evdb: error: {ckpt / ck.MANIFEST}: field files is missing"


def test_a_publication_manifest_missing_a_field_followers_read_is_refused(
    tmp_path: Path,
) -> None:
    with evdb.open(tmp_path / "db") as db:
        db.create_table("t", dim=2).upsert([1], [[1.0, 2.0]])
        db.publish(tmp_path / "pub")
    root = tmp_path / "pub"
    assert publish.check_publication(root, 1, None)[1] is None
    edit(publish.publication_dir(root, 1), _drop("publication", "step"))
    assert publish.check_publication(root, 1, None) == (None, "manifest")
    with pytest.raises(evdb.CorruptDataError, match=r"field publication\.step is missing"):
        evdb.verify(publish.publication_dir(root, 1))


def test_a_sharded_layout_with_a_bad_field_is_corrupt_naming_it(tmp_path: Path) -> None:
    from evdb.distributed import checkpoint as sharded
    from evdb.distributed.layout import FORMAT, LAYOUT, read_layout

    root = tmp_path / "sharded"
    root.mkdir()
    for layout, field in [
        ({"format": FORMAT, "tables": {}}, "world_size is missing"),
        ({"format": FORMAT, "world_size": "2", "tables": {}}, "world_size must be"),
        ({"format": FORMAT, "world_size": 1}, "tables is missing"),
        (
            {"format": FORMAT, "world_size": 1, "tables": {}, "checkpoint": {"shards": []}},
            "checkpoint.shards must be",
        ),
    ]:
        (root / LAYOUT).write_text(json.dumps(layout))
        with pytest.raises(evdb.CorruptDataError, match=f"sharding.json: field {field}"):
            sharded.info(root)
        # what a sharded database's open reads (evdb.distributed.open) checks the same
        with pytest.raises(evdb.CorruptDataError, match=f"sharding.json: field {field}"):
            read_layout(root)


def test_an_export_is_refused_as_the_base_of_an_incremental_checkpoint(tmp_path: Path) -> None:
    with evdb.open(tmp_path / "db") as db:
        db.create_table("t", dim=2).upsert([1], [[1.0, 2.0]])
        evdb.export(db, tmp_path / "export", format="npz")
        with pytest.raises(evdb.InvalidArgumentError, match="is an export-npz, not a checkpoint"):
            db.checkpoint(tmp_path / "inc", base=tmp_path / "export")
    assert not (tmp_path / "inc").exists()
