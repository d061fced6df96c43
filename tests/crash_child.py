"""The child process of ``test_crash.py``: trains a spilling table, reading each next batch
ahead (``Table.prefetch``), with a flush every few steps until it is killed, logging the state
digest it is about to flush and each flush that completed. Run as
``python crash_child.py DB_PATH SEED LOG``."""

from __future__ import annotations

import hashlib
import sys

import numpy as np

import evdb

FLUSH_EVERY = 5


def digest(db: evdb.Database) -> str:
    """A hash of everything a flush must preserve: the step and, per table, every stored row
    (value, slots, freq, last_step, version) and the pending admission counts."""
    h = hashlib.sha256(str(db.step).encode())
    for name in db.tables():
        t = db.table(name)
        parts = list(t.records(65536))  # every stored row, expired ones too
        keys = np.concatenate([k for k, _ in parts])
        order = np.argsort(keys)
        h.update(keys[order].tobytes())
        for field in ("values", "slots", "freq", "last_step", "version"):
            h.update(np.concatenate([getattr(r, field) for _, r in parts])[order].tobytes())
        pending = t.summary().admission.to_arrays()
        by_key = np.argsort(pending["keys"])
        for field in ("keys", "counts", "last_seen"):
            h.update(pending[field][by_key].tobytes())
    return h.hexdigest()


def main(path: str, seed: int, log_path: str) -> None:
    db = evdb.open(path)
    t = db.create_table(
        "t",
        dim=8,
        dram_rows=64,
        ttl_steps=20,
        admission=evdb.admission.Counter(min_count=2),
        optimizer=evdb.optim.Adagrad(lr=0.05),
    )
    rng = np.random.default_rng(seed)
    with open(log_path, "a") as log:
        upcoming = rng.integers(0, 3000, 256)
        while True:
            keys, upcoming = upcoming, rng.integers(0, 3000, 256)
            p = t.pull(keys)
            t.prefetch(upcoming)  # a kill may land while the reader thread reads ahead
            t.push(p, rng.standard_normal((p.keys.shape[0], 8)).astype(np.float32))
            if rng.random() < 0.2:
                t.delete(rng.integers(0, 3000, 20))
            if rng.random() < 0.1:
                t.compact()
            db.advance()
            if db.step % FLUSH_EVERY == 0:
                log.write(f"pre {db.step} {digest(db)}\n")
                log.flush()
                db.flush()
                log.write(f"done {db.step}\n")
                log.flush()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
