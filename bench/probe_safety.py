"""The data-safety probes: counts of what a storage engine must never do, each 0 when evdb
keeps its promises (a failure prints the count, never a timing).

* threads, all in DRAM and spilling: three lookup threads, one ``contains`` thread and one
  upsert writer for 4 s, every row's value[0] its key: wrong rows among those looked up;
* mixed threads (pull + push, upsert, two lookups) for 4 s over 50,000 keys: ``len`` after
  close and reopen against the distinct keys written;
* 200 read-only opens against a writer process flushing in a loop: failed opens, and torn
  snapshots (rows of two flushes in one open).

Run ``.venv/bin/python bench/probe_safety.py`` (about 30 s); with ``PYTHONPATH`` set to a
worktree of an older commit it probes that one.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import numpy as np

import evdb

DIM = 8


def lookups_under_threads(spill: bool, seconds: float = 4.0) -> tuple[int, int]:
    """3 lookup threads + 1 contains thread (the issue's probe), plus 1 upsert writer,
    against rows whose value[0] is the key: (wrong rows, rows checked)."""
    path = tempfile.mkdtemp()
    db = evdb.open(path)
    kw = {"dram_rows": 2_000} if spill else {"disk": False}
    t = db.create_table("t", dim=DIM, **kw)
    keys = np.arange(50_000)
    vals = np.repeat(keys[:, None].astype(np.float32), DIM, axis=1)
    t.upsert(keys, vals)
    stop = time.monotonic() + seconds
    wrong = [0]
    checked = [0]
    errors: list[BaseException] = []
    counts_lock = threading.Lock()

    def reader(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            while time.monotonic() < stop:
                k = rng.integers(0, 50_000, 512)
                got = t.lookup(k)
                bad = int(np.count_nonzero(got[:, 0] != k))
                with counts_lock:
                    wrong[0] += bad
                    checked[0] += k.shape[0]
        except BaseException as e:
            errors.append(e)

    def contains() -> None:
        rng = np.random.default_rng(9)
        try:
            while time.monotonic() < stop:
                k = rng.integers(0, 50_000, 512)
                missing = int(np.count_nonzero(~t.contains(k)))  # every key has a row
                with counts_lock:
                    wrong[0] += missing
        except BaseException as e:
            errors.append(e)

    def writer() -> None:
        rng = np.random.default_rng(11)
        try:
            while time.monotonic() < stop:
                k = np.unique(rng.integers(0, 50_000, 256))
                t.upsert(k, np.repeat(k[:, None].astype(np.float32), DIM, axis=1))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(3)]
    threads += [threading.Thread(target=contains), threading.Thread(target=writer)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    n = len(t)
    db.close()
    if errors:
        print("  thread errors:", [repr(e)[:100] for e in errors])
    assert n == 50_000, n
    return wrong[0], checked[0]


def mixed_then_len(seconds: float = 4.0) -> tuple[int, int]:
    """pull/push, upsert and lookup threads over 50,000 distinct keys: len after close and
    reopen (the issue's 57,517 for 50,000)."""
    path = tempfile.mkdtemp()
    db = evdb.open(path)
    t = db.create_table("t", dim=DIM, dram_rows=5_000)
    stop = time.monotonic() + seconds
    seen: set[int] = set()
    lock = threading.Lock()

    def trainer() -> None:
        rng = np.random.default_rng(1)
        while time.monotonic() < stop:
            k = rng.integers(0, 50_000, 1024)
            p = t.pull(k)
            t.push(p, np.zeros((p.keys.shape[0], DIM), np.float32))
            with lock:
                seen.update(p.keys[p.admitted].tolist())

    def upserter() -> None:
        rng = np.random.default_rng(2)
        while time.monotonic() < stop:
            k = np.unique(rng.integers(0, 50_000, 512))
            t.upsert(k, np.ones((k.shape[0], DIM), np.float32))
            with lock:
                seen.update(k.tolist())

    def reader() -> None:
        rng = np.random.default_rng(3)
        while time.monotonic() < stop:
            t.lookup(rng.integers(0, 50_000, 512))

    threads = [threading.Thread(target=f) for f in (trainer, upserter, reader, reader)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    db.close()
    with evdb.open(path) as again:
        return len(again.table("t")), len(seen)


WRITER = textwrap.dedent(
    """
    import sys, time, numpy as np, evdb
    db = evdb.open(sys.argv[1])
    t = db.create_table("t", dim=4) if "t" not in db.tables() else db.table("t")
    print("ready", flush=True)
    end = time.monotonic() + float(sys.argv[2])
    i = 0
    while time.monotonic() < end:
        t.upsert(np.arange(100), np.full((100, 4), float(i), np.float32))
        db.advance()
        db.flush()
        i += 1
    db.close()
    print(i, flush=True)
    """
)


def readers_vs_writer(opens: int = 200) -> tuple[int, int, int]:
    path = Path(tempfile.mkdtemp()) / "db"
    with evdb.open(path) as db:
        db.create_table("t", dim=4).upsert(np.arange(100), np.zeros((100, 4), np.float32))
    w = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), "120"], stdout=subprocess.PIPE, text=True
    )
    assert w.stdout is not None
    w.stdout.readline()
    failed = torn = 0
    for _ in range(opens):
        try:
            with evdb.open(path, read_only=True) as r:
                v = r.table("t").lookup(np.arange(100))
                if not (v == v[0, 0]).all():
                    torn += 1
        except evdb.EvdbError as e:
            failed += 1
            if failed <= 2:
                print("  open failed:", str(e)[:160])
    w.terminate()
    w.wait(timeout=60)
    return failed, torn, opens


if __name__ == "__main__":
    for spill in (False, True):
        wrong, checked = lookups_under_threads(spill)
        kind = "spilling" if spill else "all in DRAM"
        print(f"threads, {kind}: {wrong} wrong rows in {checked:,} looked up")
    n, distinct = mixed_then_len()
    print(f"mixed threads, after close and reopen: len {n:,} for {distinct:,} distinct keys")
    failed, torn, opens = readers_vs_writer()
    print(
        f"read-only opens against a writer flushing in a loop: {failed} failed, {torn} torn, "
        f"of {opens}"
    )
