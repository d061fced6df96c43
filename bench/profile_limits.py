"""How close ``lookup`` and ``pull`` are to what this machine's memory allows them.

A gather with the rows known reads 4 random cache lines a key (a dim-64 float32 row). A
lookup must also read the key's hash slot, one more random line; a pull must also count the
key once per batch (a mark per row) and stamp the row's bookkeeping (a read-modify-write of
its metadata), besides the gather. This script times those memory patterns alone, as plain
numba loops over evdb's own arrays (the table's slab and hash index, so the same pages and
page sizes), with the slot of each key known (no hashing, no probe sequence) and everything
in one fused pass, the fewest passes any design could make:

* ``gather``: copy each key's row into out (the ``bench_lookup`` limit's work);
* ``lookup floor``: the gather plus a read of each key's hash slot;
* ``probe``: evdb's hash probe of the keys alone (``hash_find``, into a reused output): what
  a lookup adds to the floor is mostly this probe's own work (hashing, comparing keys), which
  costs about as much with the index in cache;
* ``pull floor``: the lookup floor plus a write of each key's mark and a read-modify-write
  of one 32-byte metadata record per row (count, step, version, flags in one line).

Beside them, in the same run and taking turns with them, evdb's ``lookup`` (into a reused
output) and ``pull`` (hits only) of the same keys. The ratios say how much of the way to the
floor each path has come: ``gather / lookup floor`` is the most a lookup can reach against
the gather limit, ``lookup / pull floor`` the most a pull can reach against a lookup.

Run from the repository root: ``.venv/bin/python bench/profile_limits.py`` (about 30 s,
6 GiB at 10M rows) or ``--rows 1000000`` for the small table only.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
from _common import adagrad_table_in_dram, cpu_line, discard, print_table, versions_line
from numba import njit, prange

from evdb.kernels.cpu._common import copy_row, prefetch

CHUNK = 256  # keys a thread handles at a time, their lines prefetched first (as evdb's gathers)


@njit(parallel=True, nogil=True)
def gather(rows, values, out):  # type: ignore[no-untyped-def]
    for c in prange((rows.shape[0] + CHUNK - 1) // CHUNK):
        lo, hi = c * CHUNK, min((c + 1) * CHUNK, rows.shape[0])
        for i in range(lo, hi):
            for j in range(0, values.shape[1], 16):
                prefetch(values, rows[i], j)
        for i in range(lo, hi):
            copy_row(values, rows[i], out, i)


@njit(parallel=True, nogil=True)
def lookup_floor(rows, slots, index, values, out):  # type: ignore[no-untyped-def]
    """The gather, each row found through its key's slot (read, as a probe must)."""
    for c in prange((rows.shape[0] + CHUNK - 1) // CHUNK):
        lo, hi = c * CHUNK, min((c + 1) * CHUNK, rows.shape[0])
        for i in range(lo, hi):
            prefetch(index, slots[i], 0)
            for j in range(0, values.shape[1], 16):
                prefetch(values, rows[i], j)
        for i in range(lo, hi):
            copy_row(values, index[slots[i], 1], out, i)


@njit(parallel=True, nogil=True)
def pull_floor(rows, slots, index, mark, records, step, values, out):  # type: ignore[no-untyped-def]
    """The lookup floor, plus a mark per key and one metadata record updated per row."""
    for c in prange((rows.shape[0] + CHUNK - 1) // CHUNK):
        lo, hi = c * CHUNK, min((c + 1) * CHUNK, rows.shape[0])
        for i in range(lo, hi):
            prefetch(index, slots[i], 0)
            prefetch(records, rows[i], 0)
            prefetch(mark, rows[i], 0)
            for j in range(0, values.shape[1], 16):
                prefetch(values, rows[i], j)
        for i in range(lo, hi):
            r = index[slots[i], 1]
            mark[r, 0] = i
            records[r, 0] += 1  # count
            records[r, 1] = step  # last step
            records[r, 2] = step  # version
            records[r, 3] |= 3  # dirty and pinned
            copy_row(values, r, out, i)


def medians(calls: dict[str, Callable[[], Any]], repeat: int) -> dict[str, float]:
    """Each call's median seconds, the calls taking turns (a stall lands on all alike)."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeat):
        for name, call in calls.items():
            t0 = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - t0)
    return {name: float(np.median(ts)) for name, ts in times.items()}


def slot_of_rows(index: np.ndarray, n_rows: int) -> np.ndarray:
    """The hash slot holding each row's key (index: the table's (capacity, 2) key/row slots)."""
    occupied = np.flatnonzero(index[:, 1] >= 0)
    slot = np.full(n_rows, -1, dtype=np.int64)
    slot[index[occupied, 1]] = occupied
    return slot


def measure(n_rows: int, batches: list[int], repeat: int, dim: int) -> list[list[str]]:
    rng = np.random.default_rng(0)
    db, t, keys = adagrad_table_in_dram("evdb-limits-", n_rows, dim, rng)
    dram = t._top  # a profile of the floor reads the top tier's own arrays: evdb's pages
    if dram.index._next is not None:  # the index is moving its keys into a larger table
        raise SystemExit("the table's index is growing; rerun with another --rows")
    index, values = dram.index.slots, dram.values
    slot = slot_of_rows(index, dram.alloc.high_water)
    mark = np.full((dram.alloc.high_water, 1), -1, dtype=np.int32)
    records = np.zeros((dram.alloc.high_water, 4), dtype=np.int64)
    out_rows = []
    for batch in batches:
        # distinct keys where a pull is timed too (the floor's record updates never collide)
        batch_keys = rng.choice(keys, batch, replace=batch > 65_536)
        rows = dram.locate(batch_keys)
        slots = slot[rows]
        out = np.empty((batch, dim), np.float32)
        looked = np.empty_like(out)
        found = np.empty(batch, dtype=np.int64)
        gather(rows, values, out)
        t.lookup(batch_keys, out=looked)
        if not np.array_equal(out, looked):
            raise SystemExit("the gather floor copied other rows than evdb's lookup")
        calls: dict[str, Callable[[], Any]] = {  # partial binds this batch's arrays
            "gather": partial(gather, rows, values, out),
            "lookup floor": partial(lookup_floor, rows, slots, index, values, out),
            "evdb probe": partial(dram.locate, batch_keys, found),
            "evdb lookup": partial(t.lookup, batch_keys, out=looked),
        }
        if batch <= 65_536:
            calls["pull floor"] = partial(
                pull_floor, rows, slots, index, mark, records, 1, values, out
            )
            calls["evdb pull"] = partial(t.pull, batch_keys)
        for call in calls.values():  # compiled, pages touched
            call()
        ms = {name: s * 1e3 for name, s in medians(calls, repeat).items()}
        row = [
            f"{n_rows:,}",
            f"{batch:,}",
            f"{ms['gather']:.2f}",
            f"{ms['lookup floor']:.2f}",
            f"{ms['evdb probe']:.2f}",
            f"{ms['evdb lookup']:.2f}",
            f"{ms['gather'] / ms['lookup floor']:.2f}x",
            f"{ms['gather'] / ms['evdb lookup']:.2f}x",
        ]
        if "pull floor" in ms:
            row += [
                f"{ms['pull floor']:.2f}",
                f"{ms['evdb pull']:.2f}",
                f"{ms['evdb lookup'] / ms['pull floor']:.2f}x",
                f"{ms['evdb lookup'] / ms['evdb pull']:.2f}x",
            ]
        else:
            row += ["-"] * 4
        out_rows.append(row)
    discard(db)
    return out_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--batches", type=int, nargs="+", default=[65_536, 1_048_576])
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=25)
    args = parser.parse_args()
    print("profile_limits: lookup and pull against the memory traffic they must make")
    print(cpu_line())
    print(versions_line("-"))
    print(f"setup       dim {args.dim}, Adagrad tables all in DRAM; medians of {args.repeat} turns")
    rows = []
    for n in args.rows:
        rows += measure(n, args.batches, args.repeat, args.dim)
    print()
    print_table(
        [
            "rows", "keys", "gather ms", "lookup floor ms", "probe ms", "lookup ms", "gather/floor",
            "gather/lookup", "pull floor ms", "pull ms", "lookup/pull floor", "lookup/pull",
        ],
        rows,
    )  # fmt: skip
    print(
        "(gather/floor: the most a lookup can reach against the gather limit; lookup/pull "
        "floor: the most a pull can reach against a lookup; pull: hits only, 65,536 keys)"
    )


if __name__ == "__main__":
    main()
