"""Read-only means read-only: opening a checkpoint, a serving export or a closed database with
``read_only=True`` changes no byte and no mtime under it, even from several processes at once
(ranks restoring shards and ``evdb serve --workers N`` both do that)."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pytest

import evdb
from tests.files import fingerprint


def shadows_held() -> set[Path]:
    """The read-only shadows (``RocksStore``'s private directories of links, ``evdb-ro-*``
    in the temporary directory) this process holds: found through the descriptors it keeps
    open in them (its owner lock), since the store keeps its shadow to itself."""
    tmp = Path(os.path.realpath(tempfile.gettempdir()))
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = Path(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # closed meanwhile (the listing's own descriptor)
            continue
        if target.parent.parent == tmp and target.parent.name.startswith("evdb-ro-"):
            found.add(target.parent)
    return found


# what a child process needs to name its shadow the same way
_SHADOWS_HELD = "import os, tempfile\nfrom pathlib import Path\n" + inspect.getsource(shadows_held)

_READER = textwrap.dedent(
    """
    import sys, numpy as np, evdb
    path, rounds = sys.argv[1], int(sys.argv[2])
    for _ in range(rounds):
        with evdb.open(path, read_only=True) as db:  # verify=True: reads every checksum
            t = db.table("item")
            v = t.lookup(np.arange(64))
            assert np.allclose(v[:32], np.arange(32)[:, None]), v[:4]
            assert len(t) == 32
    print("ok")
    """
)


@pytest.fixture(scope="module")
def snapshots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ro")
    with evdb.open(root / "db") as db:
        t = db.create_table("item", dim=4, dram_rows=8)  # most rows on disk
        keys = np.arange(32)
        t.upsert(keys, np.repeat(keys[:, None], 4, axis=1).astype(np.float32))
        db.checkpoint(root / "checkpoint")
        evdb.export(db, root / "serving")
    return {"checkpoint": root / "checkpoint", "serving": root / "serving", "database": root / "db"}


@pytest.mark.parametrize("kind", ["checkpoint", "serving", "database"])
def test_concurrent_read_only_opens_change_nothing(snapshots: dict[str, Path], kind: str) -> None:
    path = snapshots[kind]
    before = fingerprint(path)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _READER, str(path), "5"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0 and out.strip() == "ok", err[-2000:]
    after = fingerprint(path)
    changed = [k for k in sorted(set(before) | set(after)) if before.get(k) != after.get(k)]
    assert changed == [], f"a read-only open changed {changed}"


def test_read_only_open_leaves_no_shadow_behind(snapshots: dict[str, Path]) -> None:
    before = shadows_held()
    db = evdb.open(snapshots["checkpoint"], read_only=True)
    (shadow,) = shadows_held() - before
    assert shadow.is_dir()
    assert (shadow / "rocksdict-config.json").is_file()
    assert not (shadow / "rocksdict-config.json").is_symlink()  # written there, not through
    db.close()
    assert not shadow.exists()


def test_a_read_only_open_never_closed_removes_its_shadow_at_exit(
    snapshots: dict[str, Path],
) -> None:
    child = _SHADOWS_HELD + textwrap.dedent(
        """
        import sys, evdb
        db = evdb.open(sys.argv[1], read_only=True)  # never closed
        (shadow,) = shadows_held()
        print(shadow)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", child, str(snapshots["checkpoint"])],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    shadow = Path(out.stdout.strip())
    assert shadow.name.startswith("evdb-ro-") and not shadow.exists()


def test_the_shadow_of_a_killed_reader_is_removed_by_the_next_open_and_a_live_ones_kept(
    snapshots: dict[str, Path],
) -> None:
    """kill -9 runs no exit handler, so a crashed server's shadow stays in the temporary
    directory; the next read-only open (any process) removes it, but never the shadow of a
    reader that is still alive."""
    opener = _SHADOWS_HELD + textwrap.dedent(
        """
        import os, signal, sys, evdb
        db = evdb.open(sys.argv[1], read_only=True)
        (shadow,) = shadows_held()
        print(shadow, flush=True)
        if sys.argv[2] == "die":
            os.kill(os.getpid(), signal.SIGKILL)
        sys.stdin.read()  # alive until the test closes stdin
        """
    )

    def start(mode: str) -> tuple[subprocess.Popen[str], Path]:
        p = subprocess.Popen(
            [sys.executable, "-c", opener, str(snapshots["checkpoint"]), mode],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert p.stdout is not None
        return p, Path(p.stdout.readline().strip())

    live, live_shadow = start("live")
    try:
        dead, dead_shadow = start("die")
        assert dead.wait(timeout=120) == -9
        assert dead_shadow.name.startswith("evdb-ro-") and dead_shadow.is_dir()
        with evdb.open(snapshots["checkpoint"], read_only=True) as db:
            assert db.table("item").lookup(np.arange(4)).shape == (4, 4)
        assert not dead_shadow.exists()
        assert live_shadow.is_dir() and (live_shadow / "rocksdict-config.json").is_file()
    finally:
        live.communicate(input="", timeout=120)
    assert live.returncode == 0 and not live_shadow.exists()
