"""Readers against a busy writer (issue 26, item 5): a writer's flush removes the previous
checkpoint directory, possibly while a reader is opening it. A read-only open pins the
snapshot it chose (or moves on to the one that replaced it) and never reports corruption that
is not there; damage that is there is still ``CorruptDataError``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import evdb

ROWS = 64
OPENS = 200

# Every flush is a consistent cut in which each row holds the step: a reader that sees another
# mix read a torn snapshot. Stops when told (a file appears), or after 60 s whatever happens.
_WRITER = textwrap.dedent(
    """
    import sys, time, numpy as np, evdb
    from pathlib import Path
    path, stop = Path(sys.argv[1]), Path(sys.argv[2])
    keys = np.arange(int(sys.argv[3]))
    deadline = time.monotonic() + 60
    with evdb.open(path) as db:
        t = db.create_table("t", dim=4, dram_rows=16)  # most rows spill to RocksDB
        while not stop.exists() and time.monotonic() < deadline:
            step = db.advance()
            t.upsert(keys, np.full((keys.shape[0], 4), step, dtype=np.float32))
            db.flush()
            if step == 1:
                (path.parent / "ready").touch()
    """
)


def _checkpoint_number(path: Path) -> int:
    return int(json.loads((path / "evdb.json").read_text())["checkpoint"])


def test_read_only_opens_never_fail_while_a_writer_flushes_in_a_loop(tmp_path: Path) -> None:
    path, stop = tmp_path / "db", tmp_path / "stop"
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(path), str(stop), str(ROWS)])
    failures: list[str] = []
    seen: set[int] = set()
    try:
        for _ in range(6000):  # up to 60 s for the writer's first flush
            if (tmp_path / "ready").exists() or writer.poll() is not None:
                break
            time.sleep(0.01)
        assert (tmp_path / "ready").exists(), "the writer never flushed"
        first = _checkpoint_number(path)
        for _ in range(OPENS):
            try:
                with evdb.open(path, read_only=True) as db:
                    values = db.table("t").lookup(np.arange(ROWS))
                    step = db.step
            except evdb.EvdbError as e:
                failures.append(f"{type(e).__name__}: {e}")
                continue
            assert np.all(values == step), f"a torn snapshot: step {step}, rows {values[:, 0]}"
            seen.add(step)
        last = _checkpoint_number(path)
    finally:
        stop.touch()
        writer.wait(120)
    assert writer.returncode == 0
    assert failures == [], f"{len(failures)} of {OPENS} opens failed; first: {failures[0]}"
    # the writer did move under the readers: else this test proved nothing
    assert last > first and len(seen) > 1, (first, last, len(seen))


def test_a_checkpoint_removed_for_good_is_still_reported_as_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "db"
    with evdb.open(path) as db:
        db.create_table("t", dim=4).upsert([1, 2], np.ones((2, 4)))
    current = path / "checkpoints" / f"{_checkpoint_number(path):010d}"
    shutil.rmtree(current)  # the pointer names it, and nothing replaces it
    with pytest.raises(evdb.CorruptDataError, match="missing"):
        evdb.open(path, read_only=True)


def test_a_damaged_table_file_is_still_reported_as_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "db"
    with evdb.open(path) as db:
        db.create_table("t", dim=4).upsert([1, 2], np.ones((2, 4)))
    current = path / "checkpoints" / f"{_checkpoint_number(path):010d}"
    (current / "CURRENT").write_text("MANIFEST-999999\n")  # names a manifest that is not there
    with pytest.raises(evdb.CorruptDataError, match="RocksDB cannot open"):
        evdb.open(path, read_only=True)
