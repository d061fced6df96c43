"""Bytes a row: torch fp32 + Adagrad against evdb (float32 and bfloat16 rows), and what
served snapshots cost in float32, float16, int8 and int4 (issue 29).

Every figure is the RSS growth of a fresh Python process (``--one``) while it builds one
thing of ``--rows`` rows (1M by default) of dim ``--dim`` (64), divided by the rows; the
process first imports everything and warms up the kernels it will use on a few rows, so only
the thing itself is counted. Two kinds of figure:

* **measured table**: a real one. ``torch``: ``nn.Embedding(rows, dim, sparse=True)`` and
  ``torch.optim.Adagrad`` after one step (weight + the ``sum`` state); ``evdb``: a table in
  DRAM only (``disk=False``), every row upserted, one push over a batch; with Adagrad (a
  float32 accumulator a column) and with row-wise Adagrad (one a row); float32 rows, and
  ``dtype="bfloat16"`` rows (the DRAM tier's values column in bfloat16, slots float32, or
  also bfloat16 with ``slot_dtype="bfloat16"``: Adagrad's dim accumulators at 2 bytes).
* **measured arrays**: the layouts of ``evdb/kernels/*/lowp.py``, filled through those
  kernels, before any tier stores them: bfloat16 values (``round_rows``) + one float32
  row-wise Adagrad accumulator. It is the floor a bfloat16 table's rows can reach; the
  measured bfloat16 table adds its index and metadata (its tier's stats split a row's bytes
  by component: printed after the table).
* **served snapshot**: a serving export of a table of ``--rows`` rows (``evdb.export``,
  ``format="serving"``, ``dtype`` float32, float16, int8, int4; built first, in a process of
  its own), opened the way ``evdb serve`` opens it (``evdb.api.snapshots.Snapshot.open``,
  with ``cache_rows`` = every row for the float32 / float16 ones, whose rows are otherwise
  read from RocksDB) and every row looked up once (``promote=True``, as the server does), so
  all of it is in memory. int8 / int4 are frozen files read through a memory map
  (``evdb.quantized``): their pages count in RSS once touched (and are shared by the
  workers of one server). Aims at dim 64, everything counted: int8 <= 112, int4 <= 80.

The ratio column is each figure over torch fp32 + Adagrad's, measured in the same run. Run
from the repository root: ``.venv/bin/python bench/bench_memory.py`` (about a minute at 1M
rows on 2 shared cores; ``--rows 100000`` for a quick look).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from _common import cpu_line, log, malloc_trim, print_table, random_keys, rss, versions_line

CHUNK = 65_536  # rows per fill call: the float32 staging never outweighs the measured thing
SEED = 0


def _settle() -> int:
    gc.collect()
    malloc_trim()
    return rss()


# -- the things measured, each in its own process ----------------------------------------


def torch_adagrad(rows: int, dim: int) -> dict[str, Any]:
    import torch

    warm = torch.nn.Embedding(8, dim, sparse=True)  # torch's own first-use allocations
    torch.optim.Adagrad(warm.parameters(), lr=0.01).step()
    before = _settle()
    emb = torch.nn.Embedding(rows, dim, sparse=True)
    opt = torch.optim.Adagrad(emb.parameters(), lr=0.01)  # allocates its sum state here
    idx = torch.randint(0, rows, (4096,))
    emb(idx).sum().backward()
    opt.step()
    return {"bytes": _settle() - before}


def evdb_table(
    rows: int, dim: int, optimizer: str, dtype: str = "float32", slot_dtype: str = "float32"
) -> dict[str, Any]:
    import evdb

    def make(db: evdb.Database, name: str) -> evdb.Table:
        opt = {"adagrad": evdb.optim.Adagrad, "rowwise": evdb.optim.RowWiseAdagrad}[optimizer]
        return db.create_table(
            name, dim=dim, optimizer=opt(lr=0.01), disk=False, dtype=dtype,
            slot_dtype=slot_dtype,
        )  # fmt: skip

    rng = np.random.default_rng(SEED)
    with tempfile.TemporaryDirectory() as tmp, evdb.open(f"{tmp}/db") as db:
        warm = make(db, "warm")  # kernels compiled or loaded, scratch allocated
        fill(warm, random_keys(rng, 5000), dim, rng)
        before = _settle()
        t = make(db, "t")
        keys = random_keys(rng, rows)
        fill(t, keys, dim, rng)
        del keys  # the bench's, not the table's (torch's side holds only a batch of indices)
        grown = _settle() - before
        stats = t.stats()
        parts = stats["tiers"]["dram"]["bytes_per_row_by_component"]
        return {"bytes": grown, "rows": int(stats["rows"]), "components": parts}


def fill(t: Any, keys: np.ndarray, dim: int, rng: np.random.Generator) -> None:
    """Upsert every key in chunks, then one training step over a batch of them."""
    for start in range(0, keys.shape[0], CHUNK):
        part = keys[start : start + CHUNK]
        t.upsert(part, rng.standard_normal((part.shape[0], dim), dtype=np.float32))
    batch = keys[: min(4096, keys.shape[0])]
    pulled = t.pull(batch)
    t.push(pulled, np.ones((batch.shape[0], dim), np.float32))


def bf16_rowwise_arrays(rows: int, dim: int) -> dict[str, Any]:
    from evdb.kernels import backend

    cpu = backend("cpu")
    rng = np.random.default_rng(SEED)
    _round_chunks(cpu, np.zeros((16, dim), np.uint16), rng, dim)  # compile before measuring
    before = _settle()
    values = np.empty((rows, dim), np.uint16)
    _round_chunks(cpu, values, rng, dim)
    acc = np.zeros((rows, 1), np.float32)
    acc[:] = 0.1  # touched, as a table's slots are
    return {"bytes": _settle() - before}


def _round_chunks(cpu: Any, values: np.ndarray, rng: np.random.Generator, dim: int) -> None:
    for start in range(0, values.shape[0], CHUNK):
        stop = min(start + CHUNK, values.shape[0])
        x = rng.standard_normal((stop - start, dim), dtype=np.float32)
        rows = np.arange(start, stop, dtype=np.int64)
        cpu.round_rows(x, rows, rows, SEED, 0, True, values)


SERVED_DTYPES = ("float32", "float16", "int8", "int4")
WARM_ROWS = 2000  # the small export each measuring process warms up on


def build_exports(rows: int, dim: int) -> dict[str, Any]:
    """A DRAM-only table of rows random rows exported for serving in each of SERVED_DTYPES
    (and a WARM_ROWS one of each) under $EVDB_BENCH_DIR; seconds each export took."""
    import evdb

    root = os.environ["EVDB_BENCH_DIR"]
    rng = np.random.default_rng(SEED)
    took = {}
    with evdb.open(f"{root}/source") as db:
        for name, n in (("warm", WARM_ROWS), ("t", rows)):
            t = db.create_table(name, dim=dim, disk=False)
            keys = random_keys(rng, n)
            for start in range(0, n, CHUNK):
                part = keys[start : start + CHUNK]
                t.upsert(part, rng.standard_normal((part.shape[0], dim), dtype=np.float32))
        for dtype in SERVED_DTYPES:
            evdb.export(db, f"{root}/warm-{dtype}", tables=["warm"], dtype=dtype)
            t0 = time.perf_counter()
            evdb.export(db, f"{root}/{dtype}", tables=["t"], dtype=dtype)
            took[dtype] = time.perf_counter() - t0
    return {"bytes": 0, "export_s": took}


def served_snapshot(rows: int, dim: int, dtype: str) -> dict[str, Any]:
    """RSS growth of opening the dtype export as the server does and looking every row up."""
    from evdb.api.snapshots import Snapshot

    root = os.environ["EVDB_BENCH_DIR"]

    def open_and_touch(path: str, n: int, name: str) -> tuple[Any, dict[str, Any]]:
        snap = Snapshot.open(Path(path), cache_rows=n)
        table = snap.tables[name]
        # every key (scanned first: a promoting lookup during the scan would end it), looked
        # up as a request would; the keys and the answer buffer go before RSS is read
        keys = np.concatenate([k for k, _ in table.items(CHUNK)])
        out = np.empty((CHUNK, dim), np.float32)
        for start in range(0, keys.shape[0], CHUNK):
            part = keys[start : start + CHUNK]
            table.lookup(part, out=out[: part.shape[0]], promote=True)
        return snap, table.stats()

    warm, _ = open_and_touch(f"{root}/warm-{dtype}", WARM_ROWS, "warm")  # imports, kernels
    warm.close()
    before = _settle()
    snap, stats = open_and_touch(f"{root}/{dtype}", rows, "t")
    grown = _settle() - before
    reads = stats["reads"]["lookup"]  # keys each tier answered
    found = int(sum(n for tier, n in reads.items() if tier != "not_found"))
    dram = stats["tiers"]["dram"]
    snap.close()
    return {
        "bytes": grown,
        "rows": int(stats["rows"]),
        "found": found,
        "components": dram.get("bytes_per_row_by_component", {}),
    }


MEASURES: dict[str, Callable[[int, int], dict[str, Any]]] = {
    "torch_adagrad": torch_adagrad,
    "evdb_adagrad": lambda r, d: evdb_table(r, d, "adagrad"),
    "evdb_rowwise": lambda r, d: evdb_table(r, d, "rowwise"),
    "evdb_bf16_adagrad": lambda r, d: evdb_table(r, d, "adagrad", "bfloat16"),
    "evdb_bf16_adagrad_bf16_slots": lambda r, d: evdb_table(r, d, "adagrad", *["bfloat16"] * 2),
    "evdb_bf16_rowwise": lambda r, d: evdb_table(r, d, "rowwise", "bfloat16"),
    "bf16_rowwise_arrays": bf16_rowwise_arrays,
    "build_exports": build_exports,
    **{f"serve_{t}": (lambda r, d, t=t: served_snapshot(r, d, t)) for t in SERVED_DTYPES},
}


def measure(name: str, rows: int, dim: int) -> dict[str, Any]:
    """Run one measurement in a fresh process; its JSON result."""
    cmd = [sys.executable, __file__, "--one", name, "--rows", str(rows), "--dim", str(dim)]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=1800)
    log(f"{name}: {time.perf_counter() - t0:.0f}s")
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--one", choices=sorted(MEASURES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(MEASURES[args.one](args.rows, args.dim)))
        return
    import torch

    rows, dim = args.rows, args.dim
    print(f"bench_memory: RSS growth per row, {rows:,} rows, dim {dim}, one process each")
    print(cpu_line())
    print(versions_line(torch.__version__))
    with tempfile.TemporaryDirectory(dir=".") as tmp:  # exports: on disk, not in /tmp's RAM
        os.environ["EVDB_BENCH_DIR"] = tmp
        got = {name: measure(name, rows, dim) for name in MEASURES}
    per_row = {name: r["bytes"] / rows for name, r in got.items()}
    torch_b = per_row["torch_adagrad"]
    rowwise_overhead = per_row["evdb_rowwise"] - 4 * dim  # all but its float32 values
    table = [
        ("torch fp32 + Adagrad", "measured table", torch_b),
        ("evdb fp32 + Adagrad", "measured table", per_row["evdb_adagrad"]),
        ("evdb fp32 + row-wise Adagrad", "measured table", per_row["evdb_rowwise"]),
        ("evdb bf16 + Adagrad", "measured table", per_row["evdb_bf16_adagrad"]),
        (
            "evdb bf16 + Adagrad, bf16 slots",
            "measured table",
            per_row["evdb_bf16_adagrad_bf16_slots"],
        ),
        ("evdb bf16 + row-wise Adagrad", "measured table", per_row["evdb_bf16_rowwise"]),
        ("bf16 values + row-wise acc", "measured arrays", per_row["bf16_rowwise_arrays"]),
    ]
    aims = {"int8": 112, "int4": 80}
    for t in SERVED_DTYPES:
        aim = f" (aim <= {aims[t]})" if t in aims else ""
        table.append((f"serving {t}{aim}", "served snapshot", per_row[f"serve_{t}"]))
    print_table(
        ["rows of", "figure", "bytes/row", "/ torch"],
        [[a, b, f"{c:.0f}", f"{c / torch_b:.2f}x"] for a, b, c in table],
        first_left=2,
    )
    print(f"evdb row-wise table, all but its values: {rowwise_overhead:.0f} B/row")
    for t in SERVED_DTYPES:
        r = got[f"serve_{t}"]
        assert r["found"] == r["rows"] == rows, f"serving {t}: {r['found']} of {rows} rows found"
        parts = r["components"]
        print(
            f"serving {t}, its DRAM tier's stats (B/row): "
            + ", ".join(f"{k} {v:.1f}" for k, v in parts.items())
            + f"; export took {got['build_exports']['export_s'][t]:.1f} s"
        )
    for name, label in (
        ("evdb_bf16_rowwise", "evdb bf16 + row-wise Adagrad"),
        ("evdb_bf16_adagrad_bf16_slots", "evdb bf16 + Adagrad, bf16 slots"),
    ):
        parts = got[name]["components"]
        print(
            f"{label}, its DRAM tier's stats (B/row): "
            + ", ".join(f"{k} {v:.1f}" for k, v in parts.items())
            + f"; total {sum(parts.values()):.1f}"
        )


if __name__ == "__main__":
    main()
