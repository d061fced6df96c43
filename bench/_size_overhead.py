"""``bench_size.py``'s recording-overhead part: a training step with and without a key trace.

One training step (``pull`` + fused Adagrad ``push`` of a batch of Zipf(1.1) keys, dim 16 by
default (``--dim``), every row in DRAM: the fastest step, so the largest ratio) plain, with a
fixed-rate recorder (``min_keys=0``) and with the default one (``min_keys`` raising the
rate), in turn, each going first in turn. Per step, two clocks: wall time, and the calling
thread's CPU time, which other processes on a shared machine disturb far less (a step
preempted for 100 ms reads as 100 ms of wall time, and as its own CPU time). The thread's CPU
leaves out what other threads do for the step (numba's workers, RocksDB's, the recorder's
chunk writer): the wall-time amortized figure, which waits for the writer, counts that. Min
and median of each, and the recording alone against the step: a pull of up to 8,192 keys
samples in its dedup pass (``Deduper.unique_sampled`` + ``KeyRecorder.record_kept``), so its
cost is that pass with a trace minus the pass an unrecorded pull runs (``Deduper.unique``);
``record()`` (lookups, and pulls of more keys) on its own.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from _common import print_table

import evdb
from evdb.dedup import Deduper
from evdb.trace import DEFAULT_MIN_KEYS, KeyRecorder

DIM = 16  # the default --dim: the cheapest step, so the largest ratio

Clock = tuple[float, float]  # (wall seconds, the calling thread's CPU seconds)


def _now() -> Clock:
    return time.perf_counter(), time.thread_time()


def _since(t0: Clock) -> Clock:
    t1 = _now()
    return t1[0] - t0[0], t1[1] - t0[1]


def bench_overhead(
    args: argparse.Namespace, draw: Callable[[np.random.Generator, int], np.ndarray]
) -> None:
    """``draw(rng, n)``: n Zipf(1.1) keys (``bench_size.zipf_keys``)."""
    rng = np.random.default_rng(1)
    steps = [draw(rng, args.batch) for _ in range(64)]
    work = tempfile.mkdtemp(prefix="bench-size-")
    with evdb.open(work) as db:  # removed below
        t = db.create_table("item", dim=args.dim, optimizer=evdb.optim.Adagrad(lr=0.05))
        recs = {
            "fixed": KeyRecorder.for_table(t, Path(work) / "f.trace", rate=args.rate, min_keys=0),
            "default": KeyRecorder.for_table(t, Path(work) / "d.trace", rate=args.rate),
        }
        grads = np.zeros((args.batch, args.dim), dtype=np.float32)

        def step(keys: np.ndarray, rec: KeyRecorder | None) -> Clock:
            t.trace(rec)  # Table.pull records when a recorder is attached
            t0 = _now()
            p = t.pull(keys)
            t.push(p, grads[: p.keys.shape[0]])
            db.advance()
            return _since(t0)

        for keys in steps:  # warm: every row created, kernels compiled
            step(keys, None)
            step(keys, recs["default"])
            step(keys, recs["fixed"])
        times: dict[str, list[Clock]] = {"plain": [], "fixed": [], "default": []}
        alone: dict[str, list[Clock]] = {"fixed": [], "default": [], "dedup": []}
        alone |= {f"dedup {name}": [] for name in recs}
        order = ["plain", "fixed", "default"]
        dedup = Deduper()  # the pull's dedup pass, as Table.pull runs it (its own scratch)
        for r in range(args.rounds):
            # a round's 64 steps of each in turn, each going first in turn: a step follows a
            # step of another batch, as in training (a second step of the same keys, their
            # rows and the dedup's scratch in cache, ran some 10 us faster than the first)
            for name in order[r % 3 :] + order[: r % 3]:
                for keys in steps:
                    times[name].append(step(keys, recs.get(name)))
            for keys in steps:
                for name in order[r % 3 :] + order[: r % 3]:
                    rec = recs.get(name)
                    t0 = _now()
                    if rec is None:  # what an unrecorded pull runs
                        dedup.unique(keys, keep=True)
                        alone["dedup"].append(_since(t0))
                        continue
                    u, _, _, kept, hashes = dedup.unique_sampled(keys, *rec.sampling)
                    rec.record_kept("pull", kept, hashes, keys.shape[0], db.step, u.shape[0])
                    alone[f"dedup {name}"].append(_since(t0))
                for name, rec in recs.items():
                    t0 = _now()
                    rec.record("pull", keys, db.step)
                    alone[name].append(_since(t0))
        t.trace(None)
        rates = {name: rec.rate for name, rec in recs.items()}
        amortized: dict[str, Clock] = {}
        calls = args.rounds * len(steps)
        for name, rec in [("dedup", None), *recs.items()]:
            best = (float("inf"), float("inf"))
            for _ in range(3):
                t0 = _now()
                for _ in range(args.rounds):
                    for keys in steps:
                        if rec is None:
                            dedup.unique(keys, keep=True)
                            continue
                        u, _, _, kept, hashes = dedup.unique_sampled(keys, *rec.sampling)
                        rec.record_kept("pull", kept, hashes, keys.shape[0], db.step, u.shape[0])
                if rec is not None:
                    rec.flush()  # the chunks the writer thread still holds count too
                wall, cpu = _since(t0)
                best = (min(best[0], wall / calls), min(best[1], cpu / calls))
            amortized[name] = best
        for rec in recs.values():
            rec.close()
    shutil.rmtree(work, ignore_errors=True)
    print(f"\n## Recording overhead on a training step ({len(times['plain'])} steps each)")
    print(
        f"setup: pull + Adagrad push of {args.batch:,} Zipf(1.1) keys, dim {args.dim}, all in "
        "DRAM, "
        f"64 batches over and over (a small key space: min_keys keeps the default recorder's "
        f"rate at {rates['default']:.3f}); 'fixed' = KeyRecorder(rate={args.rate:g}, "
        f"min_keys=0), 'default' = KeyRecorder(rate={args.rate:g}) (min_keys="
        f"{DEFAULT_MIN_KEYS:,}); min (least disturbed by other processes) and median of the "
        f"steps, by wall time and by the calling thread's CPU time; 'pull's recording, "
        f"amortized': {args.rounds * 64:,} dedup passes + record_kept back to back and a flush "
        f"(with the chunk writes, one per "
        f"1M kept keys, that a step's min and median leave out), best of 3, minus the same "
        f"passes without a trace"
    )
    for clock, label in ((0, "wall time"), (1, "the calling thread's CPU time")):
        print(f"\nby {label}:")
        _table(times, alone, amortized, clock)


def _table(
    times: dict[str, list[Clock]],
    alone: dict[str, list[Clock]],
    amortized: dict[str, Clock],
    clock: int,
) -> None:
    def col(xs: list[Clock]) -> list[float]:
        return [x[clock] for x in xs]

    p0, p50 = min(col(times["plain"])), statistics.median(col(times["plain"]))
    d0, d50 = min(col(alone["dedup"])), statistics.median(col(alone["dedup"]))
    rows = [
        ["step (baseline)", f"{p0 * 1e3:.3f} ms", "1.00x", f"{p50 * 1e3:.3f} ms", "1.00x"],
        ["pull's dedup pass, no trace", f"{d0 * 1e6:.1f} us", f"{100 * d0 / p0:.2f}% of a step",
         f"{d50 * 1e6:.1f} us", f"{100 * d50 / p50:.2f}% of a step"],
    ]  # fmt: skip
    for name in ("fixed", "default"):
        r0, r50 = min(col(times[name])), statistics.median(col(times[name]))
        a0, a50 = min(col(alone[name])), statistics.median(col(alone[name]))
        s0 = min(col(alone[f"dedup {name}"])) - d0
        s50 = statistics.median(col(alone[f"dedup {name}"])) - d50
        am = amortized[name][clock] - amortized["dedup"][clock]
        # a round's 64 steps of each run back to back: the ratio of their medians, round by
        # round, sees the same load on both sides more often than two whole-run statistics
        per_round = statistics.median(
            a / b
            for a, b in zip(
                _round_medians(col(times[name])), _round_medians(col(times["plain"])), strict=True
            )
        )
        rows += [
            [f"step + record ({name})", f"{r0 * 1e3:.3f} ms", f"{r0 / p0:.3f}x",
             f"{r50 * 1e3:.3f} ms", f"{r50 / p50:.3f}x"],
            [f"step + record ({name}), a round's median / plain's", "", "", "",
             f"{per_round:.3f}x (median of rounds)"],
            [f"pull's recording ({name}): dedup pass + record_kept - dedup pass",
             f"{s0 * 1e6:.1f} us", f"{100 * s0 / p0:.2f}% of a step", f"{s50 * 1e6:.1f} us",
             f"{100 * s50 / p50:.2f}% of a step"],
            [f"record() alone ({name})", f"{a0 * 1e6:.1f} us", f"{100 * a0 / p0:.2f}% of a step",
             f"{a50 * 1e6:.1f} us", f"{100 * a50 / p50:.2f}% of a step"],
            [f"pull's recording, amortized ({name})", f"{am * 1e6:.1f} us",
             f"{100 * am / p0:.2f}% of a step", "", ""],
        ]  # fmt: skip
    print_table(["", "min", "vs plain (min)", "median", "vs plain (median)"], rows, first_left=1)


def _round_medians(xs: list[float], per_round: int = 64) -> list[float]:
    return [statistics.median(xs[i : i + per_round]) for i in range(0, len(xs), per_round)]
