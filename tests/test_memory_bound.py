"""With ``dram_rows=N`` and a disk tier, training 50 x N distinct keys keeps the process's
resident set within the stated budget (README, "Memory"): the DRAM tier's N rows plus
RocksDB's fixed share (a 32 MiB block cache and two 16 MiB memtables per table), whatever
the number of rows on disk."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

CHILD = textwrap.dedent(
    """
    import sys
    import numpy as np
    import evdb

    def rss():
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS"))

    N, DIM, BATCH = 20_000, 16, 10_000
    with evdb.open(sys.argv[1]) as db:
        t = db.create_table("t", dim=DIM, dram_rows=N, optimizer=evdb.optim.Adagrad(lr=0.1))
        grads = np.full((BATCH, DIM), 0.01, np.float32)
        base = peak = 0
        for i in range(50 * N // BATCH):
            t.push(t.pull(np.arange(i * BATCH, (i + 1) * BATCH)), grads)
            db.advance()
            if i == 10:  # warmed up: the DRAM tier is full, RocksDB has its memtables
                base = rss()
            peak = max(peak, rss())
        assert len(t) == 50 * N and t.stats()["tiers"]["dram"]["rows"] <= N
        print(peak - base)
    """
)


def test_resident_memory_stays_bounded_while_50x_dram_rows_are_trained(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "db")],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    growth = int(out.stdout.split()[-1])
    # 1,000,000 rows of dim 16 with Adagrad slots would take > 150 MiB in DRAM; the budget
    # after warm-up is RocksDB's 64 MiB (block cache + memtables) plus 32 MiB of slack.
    assert growth < 96 * 2**20, f"RSS grew {growth / 2**20:.0f} MiB"
