"""Sizing (evdb.sizing): stack distances, the LRU curve, and the miniature simulation of
evdb's own policy against real tables."""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import evdb
from evdb.sizing import (
    PolicyCurve,
    lru_curve,
    miniature_config,
    simulate,
    size_table,
    trace_accesses,
)
from evdb.sizing_kernels import stack_distances, stack_distances_reference
from evdb.tools.cli import cli as cli_group
from evdb.trace import KeyRecorder, Trace, read_trace


def brute_lru_hits(keys: list[int], rows: int) -> int:
    """Hits of an LRU cache of ``rows`` rows, simulated key by key."""
    cache: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for k in keys:
        if k in cache:
            hits += 1
            cache.move_to_end(k)
        else:
            cache[k] = None
            if len(cache) > rows:
                cache.popitem(last=False)
    return hits


def test_stack_distances_by_hand() -> None:
    ids = np.array([0, 1, 0, 2, 1, 1, 0], dtype=np.int64)
    want = [-1, -1, 1, -1, 2, 0, 2]
    assert stack_distances_reference(ids).tolist() == want
    assert stack_distances(ids, 3).tolist() == want


@pytest.mark.parametrize("alphabet", [1, 3, 20, 200])
@pytest.mark.parametrize("seed", range(3))
def test_stack_distances_equal_brute_force(alphabet: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    ids = (rng.zipf(1.3, 2000) % alphabet).astype(np.int64)
    np.testing.assert_array_equal(stack_distances(ids, alphabet), stack_distances_reference(ids))


def _trace(batches: list[np.ndarray], rate: float = 1.0) -> Trace:
    from evdb.trace import TraceHeader, config_digest

    lengths = np.array([b.shape[0] for b in batches], dtype=np.int64)
    bounds = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return Trace(
        TraceHeader("t", None, config_digest(None), rate, 0),
        np.concatenate(batches).astype(np.int64),
        bounds,
        np.zeros(len(batches), dtype=np.uint8),
        np.arange(len(batches), dtype=np.int64),
        lengths,
        np.array([np.unique(b).shape[0] for b in batches], dtype=np.int64),
    )


def test_lru_curve_equals_brute_force_lru() -> None:
    rng = np.random.default_rng(4)
    batches = [(rng.zipf(1.2, 40) % 300).astype(np.int64) for _ in range(60)]
    tr = _trace(batches)
    keys, _ = trace_accesses(tr)
    # each batch's repeats are one access, as Table.pull counts them
    assert keys.shape[0] == sum(np.unique(b).shape[0] for b in batches)
    curve = lru_curve(tr)
    for rows in (1, 2, 5, 17, 64, 150, 300, 1000):
        want = brute_lru_hits(keys.tolist(), rows) / keys.shape[0]
        assert curve.hit_rate([rows])[0] == pytest.approx(want, abs=1e-12)
    for target in (0.1, 0.3, 0.5):
        r = curve.rows_for(target)
        assert r is not None
        assert brute_lru_hits(keys.tolist(), r) / keys.shape[0] >= target - 1e-12
        assert brute_lru_hits(keys.tolist(), r - 1) / keys.shape[0] < target
    assert curve.rows_for(0.999) is None  # first accesses miss at any size


def test_mrc_hist_counts_in_torchrec_form() -> None:
    rng = np.random.default_rng(5)
    tr = _trace([(rng.zipf(1.2, 50) % 400).astype(np.int64) for _ in range(80)])
    curve = lru_curve(tr)
    hist = curve.mrc_hist_counts(n_bins=10)
    assert hist.shape == (10,) and int(hist.sum()) == curve.distances.shape[0]
    # bin i holds the distances in [edges[i], edges[i+1]): a cache of edges[i] rows hits
    # exactly the reuses of the bins before it (TorchRec's estimate_cache_miss_rate)
    edges = np.linspace(0, curve.distinct_estimate, 11)
    for i in range(10):
        assert int(hist[:i].sum()) == np.count_nonzero(curve.distances < edges[i])
    stats = curve.torchrec_stats(n_batches=80, n_bins=10)
    assert stats["height"] == curve.distinct_estimate
    assert 0.0 <= stats["cacheability"] <= 1.0


def test_policy_curve_rows_for_interpolates() -> None:
    curve = PolicyCurve(
        np.array([100, 200, 400]),
        np.array([1, 2, 4]),
        {"pull": np.array([50, 80, 95]), "lookup": np.zeros(3, dtype=np.int64)},
        {"pull": np.array([50, 20, 5]), "lookup": np.zeros(3, dtype=np.int64)},
    )
    assert curve.rows_for(0.5) == 100
    assert curve.rows_for(0.9) == 334  # 200 + (0.9 - 0.8) / (0.95 - 0.8) * 200, rounded up
    assert curve.rows_for(0.99) is None
    assert np.isnan(curve.hit_rate("lookup")).all()


CONFIGS: dict[str, dict[str, Any]] = {
    "lfu+counter+ttl+disk": dict(
        admission=evdb.admission.Counter(min_count=2), ttl_steps=15, dram_rows=120
    ),
    "lru+no-disk": dict(dram=evdb.DramConfig(capacity_rows=300, eviction="lru"), disk=False),
    "lru+ttl+disk": dict(dram=evdb.DramConfig(capacity_rows=90, eviction="lru"), ttl_steps=5),
    "bloom+lfu+disk": dict(
        admission=evdb.admission.Bloom(min_count=3, capacity=1000), dram_rows=150
    ),
}


def train_and_record(path: Path, trace: Path, rate: float, **table_args: Any) -> dict[str, int]:
    """A real table trained with pull and push (Adagrad, dim 8) on Zipf batches, its keys
    recorded by hand around each pull and lookup; returns its DRAM tier's counters."""
    rng = np.random.default_rng(7)
    with evdb.open(path) as db:
        t = db.create_table("item", dim=8, optimizer=evdb.optim.Adagrad(lr=0.1), **table_args)
        with KeyRecorder.for_table(t, trace, rate=rate) as rec:
            for _ in range(120):
                keys = (rng.zipf(1.15, 256) % 4000).astype(np.int64)
                rec.record("pull", keys, db.step)
                p = t.pull(keys)
                t.push(p, rng.standard_normal((p.keys.shape[0], 8)).astype(np.float32))
                db.advance(int(rng.integers(1, 3)))
        dram = t.stats()["tiers"]["dram"]
        return {"hits": int(dram["hits"]), "misses": int(dram["misses"]), "rows": len(t)}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_unsampled_simulation_equals_a_real_table(tmp_path: Path, name: str) -> None:
    args = CONFIGS[name]
    real = train_and_record(tmp_path / "db", tmp_path / "t", 1.0, **args)
    tr = read_trace(tmp_path / "t")
    rows = tr.header.config["dram"]["capacity_rows"]  # type: ignore[index]
    got = simulate(tr, [rows])
    assert (int(got.hits["pull"][0]), int(got.misses["pull"][0])) == (
        real["hits"],
        real["misses"],
    )


def test_lookups_are_replayed_and_counted_apart(tmp_path: Path) -> None:
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("item", dim=4, dram_rows=50)
        with KeyRecorder.for_table(t, tmp_path / "t", rate=1.0) as rec:
            for s in range(20):
                keys = np.arange(s * 10, s * 10 + 40, dtype=np.int64)
                rec.record("pull", keys, db.step)
                t.pull(keys)
                look = np.arange(0, 80, 7, dtype=np.int64)
                rec.record("lookup", look, db.step)
                t.lookup(look)
                db.advance()
        real = t.stats()["tiers"]["dram"]
    tr = read_trace(tmp_path / "t")
    got = simulate(tr, [50])
    assert got.hits["lookup"][0] + got.misses["lookup"][0] == 20 * look.shape[0]
    assert got.hits["pull"][0] + got.misses["pull"][0] == 20 * 40
    both = got.hits["pull"][0] + got.hits["lookup"][0]
    assert both == real["hits"]  # the real table counts both in one counter today


def test_miniature_config_scales_what_grows_with_keys() -> None:
    conf = evdb.TableConfig(
        dim=64,
        admission=evdb.admission.Counter(min_count=2, max_pending=100_000),
        ttl_steps=10,
        dram=evdb.DramConfig(capacity_rows=50_000, eviction="lru", half_life_steps=7),
        hbm=None,
    )
    mini = miniature_config(conf, 20_000, 0.01)
    assert mini.dram.capacity_rows == 200 and mini.dram.eviction == "lru"
    assert mini.dram.half_life_steps == 7 and mini.ttl_steps == 10 and mini.dim == 1
    assert mini.admission == evdb.admission.Counter(min_count=2, max_pending=1000)


def test_sampled_curve_is_close_to_unsampled(tmp_path: Path) -> None:
    """At 20% sampling the miniatures land within a point of the full simulation (the
    bench measures 1% on larger traces)."""
    rng = np.random.default_rng(11)
    keys = (rng.zipf(1.1, 400 * 512) % 200_000).astype(np.int64)
    np.savez(tmp_path / "log.npz", key=keys, step=np.repeat(np.arange(400), 512))
    conf = evdb.TableConfig(dim=4, admission=evdb.admission.Counter(min_count=2), ttl_steps=100)
    from evdb.sizing_logs import read_key_log

    full = read_key_log(tmp_path / "log.npz")
    part = read_key_log(tmp_path / "log.npz", rate=0.2, min_keys=0)
    sizes = [500, 2000, 8000]
    a = simulate(full, sizes, config=conf).hit_rate()
    b = simulate(part, sizes, config=conf).hit_rate()
    assert np.abs(a - b).max() < 0.01, (a, b)  # measured: 0.3 points
    la, lb = lru_curve(full).hit_rate(sizes), lru_curve(part).hit_rate(sizes)
    # LRU below ~2 batches' distinct keys is coarser (2.9 points at 500 rows): the
    # SHARDS-adj correction counts the hot keys a sample lacks as distance-0 reuses
    assert np.abs(la - lb).max() < 0.04, (la, lb)


def test_size_report_and_cli(tmp_path: Path) -> None:
    real = train_and_record(tmp_path / "db", tmp_path / "t", 1.0, dram_rows=200)
    report = size_table(read_trace(tmp_path / "t"), rows=[100, 400])
    d = report.to_dict(n_bins=8)
    assert d["current_dram_rows"] == 200
    assert [c["dram_rows"] for c in d["curve"]] == [100, 200, 400]
    want = real["hits"] / (real["hits"] + real["misses"])
    assert d["current_hit_rate"]["dram"] == pytest.approx(want, abs=1e-6)
    assert len(d["torchrec"]["mrc_hist_counts"]) == 8
    assert set(d["targets"]) == {"0.9", "0.95", "0.99"}

    def cli(*args: object) -> Any:
        """evdb size in this process (click's runner: the same exit codes and streams)."""
        done = CliRunner().invoke(cli_group, ["size", *map(str, args)])
        done.returncode = done.exit_code
        return done

    done = cli(tmp_path / "t", "--rows", "100,400", "--bins", "8", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["current_hit_rate"] == d["current_hit_rate"]
    done = cli(tmp_path / "t", "--rows", "100", "--target", "0.5")
    assert done.returncode == 0, done.stderr
    assert "DRAM hit rate now" in done.stdout and "50%" in done.stdout
    np.save(tmp_path / "keys.npy", np.arange(1000, dtype=np.int64) % 37)
    done = cli(tmp_path / "keys.npy")  # a bare key log: no configuration
    assert done.returncode == 2 and "pass config=" in done.stderr
    done = cli(tmp_path / "keys.npy", "--lru-only", "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["curve"] == []
    done = cli(tmp_path / "keys.npy", "--db", tmp_path / "db", "--table", "item", "--rows", "9")
    assert done.returncode == 0, done.stderr
    np.savez(tmp_path / "log.npz", item=np.arange(10))
    done = cli(tmp_path / "log.npz", "--db", tmp_path / "db", "--table", "item")
    assert done.returncode == 2 and "--column: " in done.stderr and "no array 'key'" in done.stderr
    with evdb.open(tmp_path / "db2") as db:
        db.create_table("user", dim=4)
    done = cli(tmp_path / "t", "--db", tmp_path / "db2", "--table", "user")
    assert done.returncode == 2 and "recorded from table 'item', not 'user'" in done.stderr
    cut = tmp_path / "cut"
    cut.write_bytes((tmp_path / "t").read_bytes()[:-100])
    done = cli(cut)
    assert done.returncode == 3 and "truncated" in done.stderr
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        done = cli(tmp_path / "t", "--lru-only", "--plot", tmp_path / "c.png")
        assert done.returncode == 2 and "--plot needs matplotlib" in done.stderr
    else:
        done = cli(tmp_path / "t", "--rows", "100", "--plot", tmp_path / "c.png")
        assert done.returncode == 0 and (tmp_path / "c.png").stat().st_size > 0


def test_table_trace_replays_exactly(tmp_path: Path) -> None:
    """Table.trace(recorder) records what pull and lookup count; the unsampled replay gives
    the real DRAM tier's pull and lookup hits and misses exactly."""
    rng = np.random.default_rng(3)
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table(
            "item", dim=8, admission=evdb.admission.Counter(min_count=2), ttl_steps=15,
            dram_rows=120,
        )  # fmt: skip
        rec = KeyRecorder.for_table(t, tmp_path / "t", rate=1.0)
        t.trace(rec)
        for _ in range(80):
            keys = (rng.zipf(1.15, 256) % 4000).astype(np.int64)
            p = t.pull(keys)
            t.push(p, np.zeros((p.keys.shape[0], 8), dtype=np.float32))
            t.lookup(keys[:50])
            db.advance()
        t.trace(None)
        rec.close()
        real = t.stats()["tiers"]["dram"]
    got = simulate(read_trace(tmp_path / "t", table=None), [120])
    for op in ("pull", "lookup"):
        assert (got.hits[op][0], got.misses[op][0]) == (real[f"{op}_hits"], real[f"{op}_misses"])


def test_the_replay_runs_numba_on_one_thread_and_gives_the_setting_back() -> None:
    import numba

    from evdb.sizing_kernels import one_thread

    before = numba.get_num_threads()
    with pytest.raises(RuntimeError), one_thread():
        assert numba.get_num_threads() == 1
        raise RuntimeError("a replay that fails")
    assert numba.get_num_threads() == before
