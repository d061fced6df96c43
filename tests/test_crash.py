"""kill -9 at a random moment: reopening gives exactly the state of the last completed flush.

A child process (``crash_child.py``) trains a table that spills to disk, with a flush every
few steps, logging the digest of the state it is about to flush ("pre STEP DIGEST") and each
flush that returned ("done STEP"). The parent kills it with SIGKILL at a random moment, then
reopens the directory: the step must be that of the last completed flush (or of the flush in
progress, if it completed but its "done" line was not written yet), and the whole state must
hash to the digest logged for that step.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import evdb

from .crash_child import digest

CHILD = Path(__file__).with_name("crash_child.py")


def _lines(log: Path) -> list[list[str]]:
    if not log.exists():
        return []
    return [line.split() for line in log.read_text().splitlines() if line]


SEEDS = range(int(os.environ.get("EVDB_CRASH_SEEDS", "4")))


@pytest.mark.parametrize("seed", SEEDS)
def test_a_crash_reopens_to_the_last_completed_flush(tmp_path: Path, seed: int) -> None:
    path, log = tmp_path / "db", tmp_path / "log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen([sys.executable, str(CHILD), str(path), str(seed), str(log)], env=env)
    rng = np.random.default_rng(seed)
    want_flushes = int(rng.integers(2, 6))
    deadline = time.monotonic() + 120
    try:
        while sum(1 for f in _lines(log) if f[0] == "done") < want_flushes:
            assert child.poll() is None, "the child died on its own"
            assert time.monotonic() < deadline, "the child made no progress"
            time.sleep(0.02)
        time.sleep(float(rng.uniform(0.0, 0.15)))  # land anywhere: in a step or a flush
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    lines = _lines(log)
    pre = {int(f[1]): f[2] for f in lines if f[0] == "pre" and len(f) == 3}
    done = [int(f[1]) for f in lines if f[0] == "done"]
    with evdb.open(path) as db:
        assert db.step == done[-1] or (db.step == max(pre) and max(pre) > done[-1])
        assert digest(db) == pre[db.step]
        t = db.table("t")
        assert len(t) == sum(1 for ks, _ in t.items() for _ in ks)  # the counts survived too
