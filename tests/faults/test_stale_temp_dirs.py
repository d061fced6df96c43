"""A killed checkpoint's temporary directory (a full copy of the database's files, as hard
links) is removed by the next checkpoint into the same parent, whatever its name; a live
writer's is never touched (issue 26, item 10). Dead and alive are told apart by a flock the
writer holds on its temporary directory, not by PIDs (unreliable across PID namespaces)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

import evdb

# A child that checkpoints its own database into PARENT/ck-1 and, with its temporary
# directory filled, either dies (SIGKILL: no cleanup of any kind) or says where it is and
# waits for a line on stdin before finishing.
CHILD = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    import evdb
    from evdb import checkpoint as ck

    db_path, dest, mode = sys.argv[1:4]
    finish = ck.finish_dir

    def patched(tmp, dest, manifest):
        if mode == "die":
            os.kill(os.getpid(), signal.SIGKILL)
        print(tmp, flush=True)
        sys.stdin.readline()
        finish(tmp, dest, manifest)

    ck.finish_dir = patched
    with evdb.open(db_path) as db:
        db.create_table("t", dim=4).upsert(np.arange(50), np.ones((50, 4), np.float32))
        db.checkpoint(dest)
    """
)


def child(tmp_path: Path, dest: Path, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path / f"child-db-{mode}"), str(dest), mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def temp_dirs(parent: Path) -> list[Path]:
    return sorted(p for p in parent.iterdir() if p.name.startswith(".") and ".tmp-" in p.name)


def checkpoint_into(tmp_path: Path, dest: Path) -> None:
    with evdb.open(tmp_path / "db") as db:
        if "t" not in db.tables():
            db.create_table("t", dim=4).upsert([1, 2], np.ones((2, 4), np.float32))
        db.checkpoint(dest)


def test_a_checkpoint_removes_the_temp_dir_a_killed_checkpoint_left(tmp_path: Path) -> None:
    parent = tmp_path / "checkpoints"
    killed = child(tmp_path, parent / "ck-1", "die")
    assert killed.wait(timeout=120) == -9
    (left,) = temp_dirs(parent)
    assert any(p.is_file() for p in left.rglob("*"))  # the copy of the database's files
    checkpoint_into(tmp_path, parent / "ck-2")  # another name, same parent
    assert temp_dirs(parent) == []
    assert sorted(p.name for p in parent.iterdir()) == ["ck-2"]
    evdb.verify(parent / "ck-2")


def test_a_checkpoint_never_removes_a_live_writers_temp_dir(tmp_path: Path) -> None:
    parent = tmp_path / "checkpoints"
    live = child(tmp_path, parent / "ck-1", "wait")
    try:
        assert live.stdout is not None and live.stdin is not None
        building = Path(live.stdout.readline().strip())  # its temp dir, filled, locked
        files = sorted(p.relative_to(building) for p in building.rglob("*"))
        assert files
        checkpoint_into(tmp_path, parent / "ck-2")
        checkpoint_into(tmp_path, parent / "ck-1")  # even a checkpoint to the same name
        assert sorted(p.relative_to(building) for p in building.rglob("*")) == files
        live.stdin.write("go\n")
        live.stdin.close()
        live.wait(timeout=120)  # ck-1 exists by now: its rename fails, and it cleans up
    finally:
        live.kill()
        live.wait(timeout=120)
    assert temp_dirs(parent) == []
    evdb.verify(parent / "ck-1")
    evdb.verify(parent / "ck-2")


def test_an_export_removes_the_temp_dir_a_killed_export_left(tmp_path: Path) -> None:
    parent = tmp_path / "exports"
    killed = child(tmp_path, parent / "ck-1", "die")  # a dead writer's dir, as an export's
    assert killed.wait(timeout=120) == -9
    assert len(temp_dirs(parent)) == 1
    with evdb.open(tmp_path / "db") as db:
        db.create_table("t", dim=4).upsert([1, 2], np.ones((2, 4), np.float32))
        evdb.export(db, parent / "e.npz", format="npz")
    assert sorted(p.name for p in parent.iterdir()) == ["e.npz"]
