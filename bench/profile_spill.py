"""Where a spilling training step's CPU goes, and the most this machine's cores allow it.

``bench_tiers``' training section again (the same Zipf batches over ``--zipf-keys`` keys,
``pull`` + Adagrad ``push`` + ``db.advance()``): run ``B`` holds every row in DRAM, run ``A``
gives DRAM ``--dram-share`` of the keys with RocksDB under it. Over the timed steps it counts
the CPU time of every thread of the process (Linux ``/proc/self/task``): the calling thread,
numba's worker threads and RocksDB's background threads (flushes and compactions), and, on the
calling thread, the time inside the RocksDB tier's ``get`` (misses read back) and ``put``
(dirty victims written back).

The bound. Run A does run B's work plus RocksDB's. On ``--cores`` cores, even with every piece
of it spread perfectly over them, A's step cannot be shorter than

    (B's calling-thread CPU + A's RocksDB CPU: get + put + background) / cores

per step. B's numba workers' CPU is left out (their spinning is not work), as is A's own extra
bookkeeping (victim choice, promotion), so this is a lower bound on A's step and
``B's step / that`` an upper bound on the ratio ``bench_tiers`` prints (keys/s A / B, taken
over the mean step like it). The issue's aim is 0.7x.

Run from the repository root: ``.venv/bin/python bench/profile_spill.py`` (about 2 minutes
and 4 GiB with the defaults, which are bench_tiers'), ``--quick`` for a smoke run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from _common import cpu_line, fmt_rate, log, print_table, versions_line, wall_line
from _mmap_floor import replay_mmap
from _rocks_configs import evdb_options, parse
from _rocks_floor import Replay, floor_replays
from bench_tiers import GRAD_STD, TRAIN_LR, add_train_args, scratch_dir, zipf_batches

import evdb
from evdb.tiers import rocks
from evdb.tiers.rocks import RocksTier

_ENCODE_KEYS = rocks.encode_keys
SPILL_AIM = 0.45  # issue 32: the spilling step at least 0.45x the all-in-DRAM one
READ_AIM = 1.5  # issue 32: a read from RocksDB at most 1.5x the bare multi-get's CPU


def rocks_tier(t: evdb.Table) -> RocksTier:
    """The table's RocksDB tier (the bottom of its chain), whose calls the profile times."""
    backing = t._chain.backing
    assert isinstance(backing, RocksTier)
    return backing


def thread_cpu() -> dict[str, float]:
    """CPU seconds so far of each live thread of this process, by thread id, with its group:
    ``main`` (the calling thread), ``rocksdb`` (RocksDB's background threads), ``reader`` (the
    store's reader thread: half of a split multi-get, read aheads) or ``numba``.
    The kernel counts them in clock ticks (10 ms here): the timed steps take seconds."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    # the RocksDB store's reader thread (read aheads, split multi-gets): Python names it,
    # the kernel does not
    readers = {t.native_id for t in threading.enumerate() if t.name.startswith("evdb-prefetch")}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                comm = f.read().strip()
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:  # the thread ended between the listing and the read
            continue
        if tid == str(os.getpid()):
            group = "main"
        elif int(tid) in readers:
            group = "reader"
        else:
            group = "rocksdb" if comm.startswith("rocksdb") else "numba"
        out[f"{group}/{tid}"] = (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    return out


def by_group(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    groups = {"main": 0.0, "numba": 0.0, "rocksdb": 0.0, "reader": 0.0}
    for name, cpu in after.items():
        groups[name.split("/")[0]] += cpu - before.get(name, 0.0)
    return groups


@dataclass
class Timed:
    """A method's calls timed on the calling thread: thread CPU seconds, and keys."""

    cpu: float = 0.0
    keys: int = 0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(keys: Any, *args: Any, **kwargs: Any) -> Any:
            c0 = time.thread_time()
            try:
                return fn(keys, *args, **kwargs)
            finally:
                self.cpu += time.thread_time() - c0
                self.keys += len(keys)

        return timed


# The parts of a read from RocksDB timed on the calling thread (run A's timed steps).
READ_PARTS = (
    ("get", "RocksTier.get, all of it"),
    ("multi_get", "  RocksDB multi-get (rocksdict)"),
    ("filter", "  key filter"),
    ("encode", "  key encoding"),
    ("decode", "  value decoding (join, checks)"),
    ("fetch", "chain.fetch, all of it (get + bookkeeping)"),
    ("promote", "chain.promote (rows read into DRAM)"),
)


@dataclass
class Run:
    name: str
    step: float = 0.0  # s, mean over the timed steps
    median_step: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)  # s a step by thread group
    parts: dict[str, Timed] = field(default_factory=lambda: {k: Timed() for k, _ in READ_PARTS})
    put: Timed = field(default_factory=Timed)
    found: int = 0  # rows the RocksDB tier found over the timed steps
    filtered: int = 0  # keys its key filter ruled out (not asked of RocksDB)
    calls: list[list[bytes]] = field(default_factory=list)  # the multi-gets' keys
    floor: list[Replay] = field(default_factory=list)
    mmap_ns: float = 0.0  # the same keys from an immutable memory-mapped file, ns a key

    @property
    def get(self) -> Timed:
        return self.parts["get"]


def instrument(t: evdb.Table, run: Run) -> None:
    """Time the read path's parts (and the put) of t's RocksDB tier on the calling thread,
    and record the keys of every multi-get."""
    tier, chain, parts = rocks_tier(t), t._chain, run.parts
    if hasattr(tier, "_multi_get"):  # (evdb before issue 32 has no such parts: not timed)
        multi_get = tier._multi_get

        def recorded(encoded: list[bytes]) -> list[Any]:
            run.calls.append(list(encoded))
            return multi_get(encoded)

        tier._multi_get = parts["multi_get"].wrap(recorded)  # type: ignore[method-assign]
        tier._decode = parts["decode"].wrap(tier._decode)  # type: ignore[method-assign]
    tier.filter.may_contain = parts["filter"].wrap(tier.filter.may_contain)  # type: ignore[method-assign]
    tier.put = run.put.wrap(tier.put)  # type: ignore[method-assign]
    chain.fetch = parts["fetch"].wrap(chain.fetch)  # type: ignore[method-assign]
    chain.promote = parts["promote"].wrap(chain.promote)  # type: ignore[method-assign]
    get, encode, inside = tier.get, rocks.encode_keys, [False]

    def get_flagged(keys: np.ndarray) -> Any:
        inside[0] = True
        try:
            return get(keys)
        finally:
            inside[0] = False

    def encode_timed(keys: np.ndarray) -> list[bytes]:
        c0 = time.thread_time()
        try:
            return encode(keys)
        finally:  # the get's encodings only (a put encodes too)
            if inside[0]:
                parts["encode"].cpu += time.thread_time() - c0
                parts["encode"].keys += keys.shape[0]

    tier.get = parts["get"].wrap(get_flagged)  # type: ignore[method-assign]
    rocks.encode_keys = encode_timed


def uninstrument(t: evdb.Table) -> None:
    """Undo ``instrument``: the tier's and the chain's own methods again."""
    rocks.encode_keys = _ENCODE_KEYS
    tier = rocks_tier(t)
    for name in ("_multi_get", "_decode", "get", "put"):
        vars(tier).pop(name, None)
    vars(tier.filter).pop("may_contain", None)
    for name in ("fetch", "promote"):
        vars(t._chain).pop(name, None)


def train(
    name: str, dram_rows: int | None, batches: list[np.ndarray], grads: np.ndarray, args: Any
) -> Run:
    run = Run(name)
    with scratch_dir(args.tmpdir, "spill") as path:
        db = evdb.open(path)
        try:
            t = db.create_table(
                "bench",
                dim=args.train_dim,
                dram_rows=dram_rows,
                disk=dram_rows is not None,
                optimizer=evdb.optim.Adagrad(lr=TRAIN_LR),
            )
            steps = []
            for i, b in enumerate(batches):
                if i == args.train_warmup:
                    if dram_rows is not None:  # the timed steps' RocksDB calls only
                        instrument(t, run)
                        counters0 = dict(rocks_tier(t).counters)
                    cpu0, wall0 = thread_cpu(), time.perf_counter()
                t0 = time.perf_counter()
                p = t.pull(b)
                t.push(p, grads[: p.keys.shape[0]])
                db.advance()
                steps.append(time.perf_counter() - t0)
            wall, cpu1 = time.perf_counter() - wall0, thread_cpu()
            n = args.train_steps
            run.step, run.median_step = wall / n, statistics.median(steps[args.train_warmup :])
            run.cpu = {g: s / n for g, s in by_group(cpu0, cpu1).items()}
            if dram_rows is not None:
                uninstrument(t)
                counters = rocks_tier(t).counters
                run.found = counters["hits"] - counters0["hits"]
                run.filtered = counters["filtered"] - counters0["filtered"]
                if run.calls and not args.no_floor:
                    log(f"  {name}: replaying {len(run.calls)} multi-gets bare (the floor)")
                    run.floor = floor_replays(rocks_tier(t), run.calls, args.tmpdir)
                    run.mmap_ns, _ = replay_mmap(rocks_tier(t).cf, run.calls, args.tmpdir)
            db.drop_table("bench")  # close() then has no rows to write
        finally:
            db.close()
    return run


def ms(s: float) -> str:
    return f"{s * 1e3:.2f}"


def report(b: Run, a: Run, args: argparse.Namespace) -> None:
    n = args.train_steps
    rows = []
    for r in (b, a):
        rows.append(
            [
                r.name,
                fmt_rate(args.train_batch / r.step),
                ms(r.step),
                ms(r.median_step),
                ms(r.cpu["main"]),
                f"{ms(r.get.cpu / n)} ({r.get.keys / n:,.0f} keys asked)",
                f"{ms(r.put.cpu / n)} ({r.put.keys / n:,.0f} rows)",
                ms(r.cpu["numba"]),
                ms(r.cpu["rocksdb"]),
                f"{sum(r.cpu.values()) / r.step:.2f}",
            ]
        )
    print_table(
        [
            "run",
            "keys/s",
            "step ms (mean)",
            "median",
            "calling thread CPU ms",
            "of it RocksDB get",
            "of it RocksDB put",
            "numba workers CPU ms",
            "RocksDB background CPU ms",
            "cores busy",
        ],
        rows,
    )
    rocks_cpu = (a.get.cpu + a.put.cpu) / n + a.cpu["rocksdb"] + a.cpu["reader"]
    floor = (b.cpu["main"] + rocks_cpu) / args.cores
    print()
    print(
        f"RocksDB's CPU a step in run A: {ms(rocks_cpu)} ms (get {ms(a.get.cpu / n)}, put "
        f"{ms(a.put.cpu / n)}, background threads {ms(a.cpu['rocksdb'])}, reader thread "
        f"{ms(a.cpu['reader'])})"
    )
    print(
        f"A's step on {args.cores} cores cannot be shorter than (B's calling thread "
        f"{ms(b.cpu['main'])} + RocksDB {ms(rocks_cpu)}) / {args.cores} = {ms(floor)} ms"
    )
    print(
        f"so A / B can reach at most {b.step / floor:.2f}x here (the bound); measured: "
        f"{b.step / a.step:.2f}x (aim {SPILL_AIM}x, which needs A's step <= "
        f"{ms(b.step / SPILL_AIM)} ms)"
    )
    report_reads(a, args)


def report_reads(a: Run, args: argparse.Namespace) -> None:
    """Run A's reads from RocksDB: the calling thread's CPU per key asked of RocksDB, split
    into its parts, beside the bare multi-gets of the same keys."""
    asked = a.get.keys - a.filtered  # keys that passed the key filter, asked of RocksDB
    if not asked:
        return
    n = args.train_steps
    print(
        f"\nRun A's reads from RocksDB on the calling thread: {asked / n:,.0f} keys asked of "
        f"RocksDB a step ({a.get.keys / n:,.0f} asked of the tier, {a.found / n:,.0f} found), "
        "CPU per key asked of RocksDB"
    )
    rows = [
        [label, f"{a.parts[k].cpu / asked * 1e6:.2f}", f"{a.parts[k].cpu / n * 1e3:.3f}"]
        for k, label in READ_PARTS
    ]
    bookkeeping = a.parts["fetch"].cpu - a.get.cpu
    rows.append(["chain bookkeeping (fetch - get)", f"{bookkeeping / asked * 1e6:.2f}", ""])
    whole = a.get.cpu + a.cpu["reader"] * n  # the reader thread reads half of a split get
    rows.append(["RocksTier.get + the reader thread", f"{whole / asked * 1e6:.2f}", ms(whole / n)])
    for r in a.floor:
        rows.append([r.name, f"{r.ns_per_key / 1e3:.2f}", f"{r.cpu_ns / n / 1e6:.3f}"])
    print_table(["part", "us per key", "ms a step"], rows, first_left=1)
    absent = asked - a.found  # asked of RocksDB, not there: the filter's false positives
    print(
        f"Keys asked of RocksDB and not found: {absent / n:,.1f} a step, {absent / asked:.1%} "
        f"of the keys asked: about {ms(absent / asked * a.get.cpu / n)} ms of get CPU a step "
        "(charged at the mean cost of a key; a miss stops at RocksDB's own Bloom filter)"
    )
    if not a.floor:
        return
    replayed, bare = a.floor[0], a.floor[1:]
    best = min(bare, key=lambda r: r.ns_per_key)
    in_run = (a.get.cpu + a.cpu["reader"] * n) * 1e9 / asked / best.ns_per_key
    print(
        f"RocksTier.get (with the reader thread) / the floor ({best.name.strip()}): in the "
        f"run {in_run:.2f}x,"
        f" replayed {replayed.ns_per_key / best.ns_per_key:.2f}x (aim <= {READ_AIM}x); "
        f"replayed / the bare multi-get on the same column family, in turn: "
        f"{replayed.ns_per_key / bare[0].ns_per_key:.2f}x"
    )
    if a.mmap_ns:
        print(
            f"The same keys from an immutable memory-mapped file (sorted keys + packed records, "
            f"searchsorted + one gather; bench/_mmap_floor.py): {a.mmap_ns / 1e3:.2f} us a key, "
            f"{best.ns_per_key / a.mmap_ns:.1f}x below the RocksDB floor"
        )


def compare_configs(
    b: Run, dram_rows: int, batches: list[np.ndarray], grads: np.ndarray, args: Any
) -> None:
    """Run A under each of ``--configs`` in turn, ``--reps`` rounds, and print RocksDB's CPU
    a step for each run (the calling thread's get and put, the background threads)."""
    n, rows = args.train_steps, []
    for rep in range(args.reps):
        for name in args.configs:
            with evdb_options(parse(name)):
                a = train(f"A {name or '(evdb)'}", dram_rows, batches, grads, args)
            asked = max(1, a.get.keys - a.filtered)
            rocks_cpu = (a.get.cpu + a.put.cpu) / n + a.cpu["rocksdb"] + a.cpu["reader"]
            log(f"  {a.name} round {rep}: RocksDB {ms(rocks_cpu)} ms a step")
            rows.append(
                [
                    name or "(evdb)",
                    str(rep),
                    ms(a.step),
                    ms(a.median_step),
                    ms(a.get.cpu / n),
                    f"{a.parts['multi_get'].cpu / asked * 1e6:.2f}",
                    ms(a.put.cpu / n),
                    ms(a.cpu["rocksdb"]),
                    ms(a.cpu["reader"]),
                    ms(rocks_cpu),
                    f"{b.step / a.step:.2f}",
                ]
            )
    print_table(
        [
            "options",
            "round",
            "A step ms",
            "median",
            "get ms",
            "multi-get us/key",
            "put ms",
            "background ms",
            "reader ms",
            "RocksDB CPU ms",
            "A / B",
        ],
        rows,
        first_left=1,
    )
    print(f"B (all in DRAM): step {ms(b.step)} ms, median {ms(b.median_step)} ms")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_train_args(p)
    p.add_argument(
        "--cores", type=int, default=len(os.sched_getaffinity(0)), help="cores for the bound"
    )
    p.add_argument("--tmpdir", default=None, help="where the stores live")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="smoke run: small sizes, seconds")
    p.add_argument(
        "--configs",
        nargs="+",
        default=None,
        help="RocksDB option sets to run A under, in turn (flags of bench/_rocks_configs.py, "
        "comma-separated; '' for evdb's options): prints RocksDB's CPU a step for each",
    )
    p.add_argument("--reps", type=int, default=1, help="rounds of --configs")
    p.add_argument("--no-floor", action="store_true", help="skip the bare replays")
    args = p.parse_args(argv)
    if args.quick:
        args.zipf_keys, args.train_batch = 200_000, 2048
        args.train_warmup, args.train_steps, args.train_dim = 50, 100, 16
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print(cpu_line())
    print(versions_line("-"))
    rng = np.random.default_rng(args.seed + 1)  # bench_tiers' training batches
    batches = zipf_batches(args, rng)
    grads = rng.standard_normal((args.train_batch, args.train_dim), dtype=np.float32)
    grads *= GRAD_STD
    dram_rows = max(1, round(args.dram_share * args.zipf_keys))
    b = train("B: all in DRAM", None, batches, grads, args)
    log(f"  B: {fmt_rate(args.train_batch / b.step)}")
    if args.configs is not None:
        compare_configs(b, dram_rows, batches, grads, args)
        print(wall_line())
        return
    a = train("A: DRAM + disk", dram_rows, batches, grads, args)
    log(f"  A: {fmt_rate(args.train_batch / a.step)}")
    print()
    report(b, a, args)
    print(wall_line())


if __name__ == "__main__":
    main()
