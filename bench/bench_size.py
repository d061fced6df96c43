"""``evdb size`` against reality: key-trace recording overhead, analysis speed, and predicted
vs measured DRAM hit rates (issue 31).

Four parts, each against a baseline measured in the same run:

* **Recording overhead** (``_size_overhead.py``): one training step (``pull`` + fused Adagrad
  ``push`` of a batch of Zipf(1.1) keys, dim 16, every row in DRAM: the fastest step, so the
  largest ratio) plain, with a fixed-rate recorder (``min_keys=0``) and with the default one
  (``min_keys`` raising the rate), in turn; min and median per-step wall and CPU times; the
  pull's recording alone (its dedup pass sampling the keys, ``Deduper.unique_sampled`` +
  ``KeyRecorder.record_kept``, minus the unrecorded pull's ``Deduper.unique``) and
  ``record()`` alone (lookups, pulls of over 8,192 keys) over the step time.
* **Zipf(1.1) click log**: ``--accesses`` keys (a catalogue of 1M items, keys the hashed
  ranks) in batches of ``--batch``, through real tables (dim 16, Adagrad, Counter admission
  min_count=2, a TTL, LFU, RocksDB under DRAM) at three DRAM sizes; their measured DRAM hit
  rates against ``evdb size``'s predictions from the two traces recorded during the first
  run (the default recorder at ``--rate``, and the fixed ``--rate``), and against the
  unsampled miniature simulation. Speed: each analysis (read, LRU curve and the miniatures)
  against simulating the unsampled trace, at the same sizes.
* **Speed at a larger trace** (``--speed-accesses N``, e.g. 100M): a Zipf trace generated and
  recorded in chunks, analysed at the same sizes; its unsampled baseline is the Zipf part's
  unsampled time per access times N (extrapolated, not run).
* **MovieLens 100K**: the example's traffic (``examples/movielens.py``: the first 80% of the
  ratings by time, shuffled per epoch with seed 0, batches of 512, 3 epochs; the user and
  item tables' configuration), measured and predicted at three DRAM sizes per table, from the
  default recorder and from fixed rates of 1%, 10% and 50% (1,682 items hold 17 keys at
  1%). Needs the ratings at ``~/.cache/evdb/ml-100k.inter`` (``python
  examples/movielens.py`` fetches them once; see ``../shared/data/README.md``); skipped
  otherwise.

Run from the repository root: ``.venv/bin/python bench/bench_size.py`` (about 3 minutes on 2
shared cores at the default 2M accesses); the issue's figures: ``--accesses 10000000
--speed-accesses 100000000`` (10 to 16 minutes, most of it the three real tables).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import cpu_line, log, print_table, versions_line, wall_line
from _size_overhead import bench_overhead

import evdb
from evdb.kernels.hashing import mix64_np
from evdb.sizing import lru_curve, simulate, size_table
from evdb.sizing_logs import read_key_log
from evdb.trace import CURRENT_SIZE_ROWS, DEFAULT_MIN_KEYS, KeyRecorder, read_trace

DIM = 16
MOVIELENS = Path.home() / ".cache" / "evdb" / "ml-100k.inter"


def zipf_keys(rng: np.random.Generator, n: int, items: int = 1_000_000) -> np.ndarray:
    """n Zipf(1.1) draws over ranks 1..items (rejection of the tail), as hashed int64 keys."""
    out: list[np.ndarray] = []
    have = 0
    while have < n:
        r = rng.zipf(1.1, n)
        r = r[r <= items]
        out.append(r)
        have += r.shape[0]
    ranks = np.concatenate(out)[:n].astype(np.uint64)
    return mix64_np(ranks).view(np.int64)


def batches_of(keys: np.ndarray, batch: int) -> list[np.ndarray]:
    return [keys[s : s + batch] for s in range(0, keys.shape[0], batch)]


def train(
    path: str,
    name: str,
    batches: list[np.ndarray],
    table_args: dict[str, Any],
    traces: tuple[tuple[Path, float, int], ...] = (),
) -> tuple[float, float]:
    """Train a real table on the batches (pull, zero-gradient Adagrad push, advance); returns
    its measured DRAM hit rate and seconds. A recorder per (path, rate, min_keys) of
    ``traces`` records each pull (as ``Table.pull`` does with a recorder attached)."""
    with evdb.open(path) as db:
        t = db.create_table(name, dim=DIM, optimizer=evdb.optim.Adagrad(lr=0.05), **table_args)
        recorders = [KeyRecorder.for_table(t, p, rate=r, min_keys=m) for p, r, m in traces]
        grads = np.zeros((max(b.shape[0] for b in batches), DIM), dtype=np.float32)
        t0 = time.perf_counter()
        for keys in batches:
            p = t.pull(keys)
            for rec in recorders:
                rec.record("pull", keys, db.step, counted=p.keys.shape[0])
            t.push(p, grads[: p.keys.shape[0]])
            db.advance()
        seconds = time.perf_counter() - t0
        for rec in recorders:
            rec.close()
        d = t.stats()["tiers"]["dram"]
        return d["hits"] / max(d["hits"] + d["misses"], 1), seconds


def pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def pts(x: float) -> str:
    return f"{100 * x:+.2f}"


# -- Zipf click log -------------------------------------------------------------------------
def bench_zipf(args: argparse.Namespace) -> float:
    """Returns the unsampled simulation's seconds per access (the speed part's baseline)."""
    rng = np.random.default_rng(2)
    log(f"zipf: drawing {args.accesses:,} keys")
    keys = zipf_keys(rng, args.accesses)
    batches = batches_of(keys, args.batch)
    sizes = [5_000, 20_000, 80_000]
    conf: dict[str, Any] = dict(admission=evdb.admission.Counter(min_count=2), ttl_steps=100)
    work = Path(tempfile.mkdtemp(prefix="bench-size-"))
    measured = []
    # the default recorder (rate, and min_keys raising it), and the plain fixed-rate one
    traces = (
        (work / "zipf.trace", args.rate, DEFAULT_MIN_KEYS),
        (work / "fixed.trace", args.rate, 0),
    )
    for i, rows in enumerate(sizes):
        log(f"zipf: real table, dram_rows={rows:,}")
        recs = traces if i == 0 else ()
        rate, secs = train(str(work / f"db{i}"), "item", batches, {**conf, "dram_rows": rows}, recs)
        measured.append((rate, secs))
    predicted, seconds, kept = {}, {}, {}
    for name in ("zipf", "fixed"):
        log(f"zipf: analysis of the {name} trace")
        t0 = time.perf_counter()
        tr = read_trace(work / f"{name}.trace")
        report = size_table(tr, rows=sizes)
        seconds[name] = time.perf_counter() - t0
        assert report.policy is not None
        at = np.isin(report.policy.rows, sizes)
        predicted[name] = report.policy.hit_rate()[at]
        kept[name] = (tr.header.rate, report.distinct, report.policy.mini_rows[at])
    np.savez(work / "full.npz", key=keys, step=np.arange(keys.shape[0]) // args.batch)
    full = read_key_log(work / "full.npz")
    config = evdb.TableConfig.from_dict(read_trace(work / "zipf.trace").header.config)  # type: ignore[arg-type]
    log("zipf: unsampled simulation")
    t0 = time.perf_counter()
    unsampled = simulate(full, sizes, config=config)
    t_full = time.perf_counter() - t0
    seeds = seed_errors(args, work, batches, config, sizes, unsampled.hit_rate())
    shutil.rmtree(work, ignore_errors=True)
    unsamp = unsampled.hit_rate()
    lru_full = lru_curve(full).hit_rate(sizes)
    (r_def, d_def, m_def), (_, d_fix, m_fix) = kept["zipf"], kept["fixed"]
    print("\n## Zipf(1.1) click log: predicted vs measured DRAM hit rate")
    print(
        f"setup: {keys.shape[0]:,} accesses, {np.unique(keys).shape[0]:,} distinct keys, batches "
        f"of {args.batch:,}; tables: dim {DIM}, Adagrad, Counter(min_count=2), ttl_steps=100, "
        f"LFU, RocksDB below. Traces recorded during the first table's run: 'default' = "
        f"KeyRecorder.for_table(table, rate={args.rate:g}) with its default min_keys="
        f"{DEFAULT_MIN_KEYS:,}, which also keeps at least {CURRENT_SIZE_ROWS:,} / the "
        f"table's dram_rows (ended at rate {r_def:.4f}, {d_def:,} distinct keys; miniatures "
        f"{m_def.tolist()} rows), "
        f"'fixed' = rate {args.rate:g}, min_keys=0 ({d_fix:,} distinct keys; miniatures "
        f"{m_fix.tolist()} rows)"
    )
    rows_out = []
    for j, rows in enumerate(sizes):
        m = measured[j][0]
        pd, pf = predicted["zipf"][j], predicted["fixed"][j]
        rows_out.append(
            [f"{rows:,}", pct(m), pct(pd), pts(pd - m), pct(pf), pts(pf - m), pct(unsamp[j]),
             pts(pd - unsamp[j]), pct(lru_full[j])]
        )  # fmt: skip
    print_table(
        ["dram_rows", "measured", "default trace", "error (pts)", f"fixed {args.rate:g}",
         "error (pts)", "unsampled sim", "default-unsampled", "LRU (exact)"],
        rows_out,
    )  # fmt: skip
    if seeds:
        print(
            f"\nother hash seeds: the default trace's recorder (its rate, keep_rate and "
            f"min_keys {DEFAULT_MIN_KEYS:,}) on the same keys with seed=s, no real table; "
            f"prediction - unsampled simulation, points"
        )
        print_table(
            ["seed", *[f"{r:,}" for r in sizes]],
            [[str(s), *[pts(e) for e in err]] for s, err in seeds],
        )
    print(f"\n## Analysis speed, same trace ({keys.shape[0]:,} accesses, 3 sizes)")
    print_table(
        ["", "seconds", "ratio"],
        [
            ["unsampled simulation (baseline)", f"{t_full:.2f}", "1.00x"],
            [f"analysis, default trace (rate {r_def:.4f})", f"{seconds['zipf']:.2f}",
             f"{t_full / seconds['zipf']:.1f}x faster"],
            [f"analysis, fixed rate {args.rate:g}", f"{seconds['fixed']:.2f}",
             f"{t_full / seconds['fixed']:.1f}x faster"],
            ["real tables, one size (for scale)", f"{measured[0][1]:.2f}", ""],
        ],
        first_left=1,
    )  # fmt: skip
    return t_full / keys.shape[0]


def seed_errors(
    args: argparse.Namespace,
    work: Path,
    batches: list[np.ndarray],
    config: evdb.TableConfig,
    sizes: list[int],
    unsampled: np.ndarray,
) -> list[tuple[int, np.ndarray]]:
    """``--seeds`` more hash seeds of the default trace (1, 2, ...), recorded at its rate and
    keep_rate without a table: per seed, its predictions minus the unsampled simulation's."""
    if not args.seeds:
        return []
    header = read_trace(work / "zipf.trace").header
    rate, keep = header.floor_rate or args.rate, header.keep_rate
    out = []
    for seed in range(1, args.seeds + 1):
        log(f"zipf: seed {seed}")
        path = work / f"seed{seed}.trace"
        with KeyRecorder(
            path, table="item", config=config, rate=rate, keep_rate=keep, seed=seed
        ) as rec:
            for i, b in enumerate(batches):
                rec.record("pull", b, i, counted=np.unique(b).shape[0])
        policy = simulate(read_trace(path), sizes)
        out.append((seed, policy.hit_rate() - unsampled))
    return out


# -- analysis speed at a larger trace -------------------------------------------------------
def bench_speed(args: argparse.Namespace, unsampled_per_access: float | None) -> None:
    """A ``--speed-accesses`` Zipf(1.1) trace generated and recorded in chunks (never all in
    memory), analysed at 3 sizes; the unsampled baseline at that length is the Zipf part's
    unsampled simulation time per access times the length (the replay is linear in it), or
    with ``--speed-unsampled`` the unsampled simulation of this trace, run (its keys kept in
    an .npy on disk as they are drawn, n x 8 bytes, then read whole)."""
    if unsampled_per_access is None and not args.speed_unsampled:
        print("\n## Analysis speed at --speed-accesses: skipped (needs the zipf part's baseline)")
        return
    n, chunk = args.speed_accesses, 10_000_000
    rng = np.random.default_rng(3)
    work = Path(tempfile.mkdtemp(prefix="bench-size-"))
    conf = evdb.TableConfig(
        dim=DIM, admission=evdb.admission.Counter(min_count=2), ttl_steps=100, hbm=None
    )
    t_record = 0.0
    sizes = [5_000, 20_000, 80_000]
    log_keys = None
    if args.speed_unsampled:
        log_keys = np.lib.format.open_memmap(work / "full.npy", "w+", np.int64, (n,))
    for name, min_keys in (("zipf", DEFAULT_MIN_KEYS), ("fixed", 0)):
        rng = np.random.default_rng(3)
        with KeyRecorder(work / f"{name}.trace", table="item", config=conf, rate=args.rate,
                         min_keys=min_keys) as rec:  # fmt: skip
            step = 0
            for start in range(0, n, chunk):
                log(f"speed: {name}: recording accesses {start:,}..")
                keys = zipf_keys(rng, min(chunk, n - start))
                if log_keys is not None and name == "zipf":
                    log_keys[start : start + keys.shape[0]] = keys
                for b in batches_of(keys, args.batch):
                    counted = np.unique(b).shape[0]
                    t0 = time.perf_counter()
                    rec.record("pull", b, step, counted=counted)
                    t_record += time.perf_counter() - t0
                    step += 1
    out = []
    for name in ("zipf", "fixed"):
        log(f"speed: analysing the {name} trace")
        t0 = time.perf_counter()
        tr = read_trace(work / f"{name}.trace")
        report = size_table(tr, rows=sizes)
        secs = time.perf_counter() - t0
        assert report.policy is not None
        hit = report.policy.hit_rate()[np.isin(report.policy.rows, sizes)]
        out.append((name, tr.header.rate, tr.keys.shape[0], secs, hit))
    unsampled = None
    if log_keys is not None:
        log_keys.flush()
        del log_keys
        full = read_key_log(work / "full.npy", batch_keys=args.batch)
        log("speed: unsampled simulation")
        t0 = time.perf_counter()
        unsampled = simulate(full, sizes, config=conf).hit_rate()
        base = time.perf_counter() - t0
        del full
        how = "run in this process"
    else:
        assert unsampled_per_access is not None
        base = unsampled_per_access * n
        how = (
            f"extrapolated linearly from the Zipf part's ({unsampled_per_access * 1e6:.2f} us "
            f"per access; --speed-unsampled runs it)"
        )
    shutil.rmtree(work, ignore_errors=True)
    print(f"\n## Analysis speed: a {n:,}-access trace, 3 sizes")
    print(
        f"baseline: the unsampled simulation of this trace, {how}. Recording both traces: "
        f"{t_record:.1f} s in record()."
    )
    label = "measured" if unsampled is not None else "extrapolated"
    rows = [[f"unsampled simulation (baseline, {label})", f"{base:.1f}", "1.00x"]]
    for name, rate, kept_keys, secs, _ in out:
        label = "default trace" if name == "zipf" else f"fixed rate {args.rate:g}"
        rows.append(
            [f"analysis, {label} (rate {rate:.4f}, {kept_keys:,} keys)", f"{secs:.1f}",
             f"{base / secs:.1f}x faster"]
        )  # fmt: skip
    print_table(["", "seconds", "ratio"], rows, first_left=1)
    if unsampled is not None:
        print(f"\nhit rates at this length (default trace, fixed {args.rate:g}, unsampled):")
        print_table(
            ["dram_rows", "default", "error (pts)", f"fixed {args.rate:g}", "error (pts)",
             "unsampled"],
            [[f"{r:,}", pct(out[0][4][j]), pts(out[0][4][j] - unsampled[j]),
              pct(out[1][4][j]), pts(out[1][4][j] - unsampled[j]), pct(unsampled[j])]
             for j, r in enumerate(sizes)],
        )  # fmt: skip


# -- MovieLens ------------------------------------------------------------------------------
def movielens_batches(path: Path) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The example's user and item batches (examples/movielens.py, seed 0, 3 epochs, 512)."""
    table = np.loadtxt(path, skiprows=1, dtype=np.float64)
    t = table[np.argsort(table[:, 3], kind="stable")]
    users, items = t[:, 0].astype(np.int64), t[:, 1].astype(np.int64)
    split = int(0.8 * users.shape[0])
    rng = np.random.default_rng(0)
    ub, ib = [], []
    for _ in range(3):
        order = rng.permutation(split)
        for s in range(0, split, 512):
            b = order[s : s + 512]
            ub.append(users[b])
            ib.append(items[b])
    return ub, ib


def bench_movielens(args: argparse.Namespace) -> None:
    if not MOVIELENS.exists():
        print(f"\n## MovieLens 100K: skipped ({MOVIELENS} missing; run examples/movielens.py)")
        return
    ub, ib = movielens_batches(MOVIELENS)
    conf: dict[str, Any] = dict(admission=evdb.admission.Counter(min_count=2), ttl_steps=400)
    # the default recorder (min_keys raises the rate: these key spaces are recorded whole),
    # and fixed rates without it
    recorders = [("default", args.rate, DEFAULT_MIN_KEYS)] + [
        (f"fixed {r:g}", r, 0) for r in sorted({args.rate, 0.1, 0.5})
    ]
    work = Path(tempfile.mkdtemp(prefix="bench-size-"))
    print("\n## MovieLens 100K (the example's traffic): predicted vs measured DRAM hit rate")
    print(
        "setup: 80,000 training ratings x 3 epochs in batches of 512 (470 steps); tables: dim "
        "16, Adagrad, Counter(min_count=2), ttl_steps=400, LFU, RocksDB below (the example "
        "uses 30% of the ids as dram_rows)"
    )
    for name, batches in (("item", ib), ("user", ub)):
        distinct = np.unique(np.concatenate(batches)).shape[0]
        sizes = [max(16, round(f * distinct)) for f in (0.1, 0.3, 0.6)]
        measured = []
        for i, rows in enumerate(sizes):
            log(f"movielens: {name}, dram_rows={rows}")
            recs = (
                tuple((work / f"{name}-{j}.trace", r, m) for j, (_, r, m) in enumerate(recorders))
                if i == 0
                else ()
            )
            measured.append(
                train(str(work / f"{name}{i}"), name, batches, {**conf, "dram_rows": rows}, recs)[0]
            )
        out = []
        for k, (label, _, _) in enumerate(recorders):
            tr = read_trace(work / f"{name}-{k}.trace")
            rep = size_table(tr, rows=sizes)
            assert rep.policy is not None
            hr = rep.policy.hit_rate()[np.isin(rep.policy.rows, sizes)]
            kept = np.unique(tr.keys).shape[0]
            for j, rows in enumerate(sizes):
                out.append(
                    [f"{name}", f"{rows:,}", f"{label}: {tr.header.rate:.3g} ({kept} keys)",
                     pct(measured[j]), pct(hr[j]), pts(hr[j] - measured[j])]
                )  # fmt: skip
        print(f"\n{name}: {distinct:,} distinct ids")
        print_table(
            [
                "table",
                "dram_rows",
                "trace: rate (sampled ids)",
                "measured",
                "predicted",
                "error (pts)",
            ],
            out,
            first_left=1,
        )
    shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--accesses", type=int, default=2_000_000)
    parser.add_argument("--batch", type=int, default=8192)
    parser.add_argument(
        "--dim", type=int, default=DIM, help="overhead: the table's dim (16: the cheapest step)"
    )
    parser.add_argument("--rate", type=float, default=0.01)
    parser.add_argument("--rounds", type=int, default=8, help="overhead: rounds of 64 steps")
    parser.add_argument(
        "--speed-accesses", type=int, default=0, help="speed: a trace this long (0: skip)"
    )
    parser.add_argument(
        "--seeds", type=int, default=0, help="zipf: this many more hash seeds of the default trace"
    )
    parser.add_argument(
        "--speed-unsampled",
        action="store_true",
        help="speed: run the unsampled simulation at --speed-accesses (not extrapolate it)",
    )
    parser.add_argument("--skip", nargs="*", default=[], choices=["overhead", "zipf", "movielens"])
    args = parser.parse_args()
    print("# bench_size: evdb size's accuracy and speed, recording overhead")
    print(cpu_line())
    print(versions_line("n/a"))
    if "overhead" not in args.skip:
        bench_overhead(args, zipf_keys)
    per_access = None
    if "zipf" not in args.skip:
        per_access = bench_zipf(args)
    if args.speed_accesses:
        bench_speed(args, per_access)
    if "movielens" not in args.skip:
        bench_movielens(args)
    print()
    print(wall_line())


if __name__ == "__main__":
    main()
