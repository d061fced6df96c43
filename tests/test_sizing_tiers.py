"""evdb size over an HBM tier, and sizes replayed on a subsample of a trace (evdb.sizing)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import evdb
from evdb.config import HbmConfig
from evdb.sizing import (
    MINIATURE_ROWS,
    candidate_rows,
    lru_curve,
    simulate,
    size_table,
    size_thresholds,
)
from evdb.trace import KeyRecorder, Trace, read_trace
from evdb.trace_sample import FULL


def _train(path: Path, trace: Path, steps: int = 100, **table_args: Any) -> dict[str, Any]:
    """A real table trained on Zipf batches, every key recorded; its tiers' counters."""
    rng = np.random.default_rng(11)
    with evdb.open(path) as db:
        t = db.create_table("item", dim=4, optimizer=evdb.optim.Adagrad(lr=0.1), **table_args)
        with KeyRecorder.for_table(t, trace, rate=1.0) as rec:
            for _ in range(steps):
                keys = (rng.zipf(1.15, 256) % 3000).astype(np.int64)
                rec.record("pull", keys, db.step)
                p = t.pull(keys)
                t.push(p, rng.standard_normal((p.keys.shape[0], 4)).astype(np.float32))
                db.advance(int(rng.integers(1, 3)))
        return t.stats()["tiers"]  # type: ignore[no-any-return]


HBM = dict(
    hbm=HbmConfig(40, device="cpu"), dram_rows=150, admission=evdb.admission.Counter(min_count=2)
)


@pytest.mark.parametrize("tier", ["hbm", "dram"])
def test_unsampled_two_level_simulation_equals_a_real_table(tmp_path: Path, tier: str) -> None:
    real = _train(tmp_path / "db", tmp_path / "t", **HBM)
    tr = read_trace(tmp_path / "t")
    got = simulate(tr, [40 if tier == "hbm" else 150], tier=tier)
    assert got.hbm_hits is not None and got.hbm_misses is not None
    assert (int(got.hbm_hits["pull"][0]), int(got.hbm_misses["pull"][0])) == (
        real["hbm"]["pull_hits"],
        real["hbm"]["pull_misses"],
    )
    assert (int(got.hits["pull"][0]), int(got.misses["pull"][0])) == (
        real["dram"]["pull_hits"],
        real["dram"]["pull_misses"],
    )
    dram_rate = real["dram"]["pull_hits"] / (
        real["dram"]["pull_hits"] + real["dram"]["pull_misses"]
    )
    assert got.dram_tier_hit_rate()[0] == pytest.approx(dram_rate)


def test_hbm_sizing_report(tmp_path: Path) -> None:
    _train(tmp_path / "db", tmp_path / "t", steps=40, **HBM)
    report = size_table(read_trace(tmp_path / "t"), rows=[10, 40, 160], tier="hbm").to_dict()
    assert report["tier"] == "hbm" and report["current_hbm_rows"] == 40
    hbm = [c["hbm_hit_rate"] for c in report["curve"]]
    assert [c["hbm_rows"] for c in report["curve"]] == [10, 40, 160]
    assert hbm == sorted(hbm) and hbm[0] < hbm[-1]  # a bigger HBM answers more
    assert all(c["hbm_or_dram_hit_rate"] >= c["hbm_hit_rate"] for c in report["curve"])
    assert set(report["current_hit_rate"]) == {"hbm", "dram"}
    with pytest.raises(evdb.InvalidArgumentError, match="HBM tier"):
        _train(tmp_path / "db2", tmp_path / "t2", steps=2, dram_rows=50)
        size_table(read_trace(tmp_path / "t2"), tier="hbm")


def test_hbm_default_grid_stops_at_dram_rows(tmp_path: Path) -> None:
    """An HBM tier caches DRAM's rows: its default sizes go up to dram_rows (150), not to
    the trace's distinct keys (about 1,500), where the DRAM grid goes."""
    _train(tmp_path / "db", tmp_path / "t", steps=20, **HBM)
    tr = read_trace(tmp_path / "t")
    hbm = size_table(tr, tier="hbm").to_dict()
    rows = [c["hbm_rows"] for c in hbm["curve"]]
    assert max(rows) == 150 and 40 in rows and len(rows) >= 10
    dram = size_table(tr, simulate_policy=False)
    assert dram.distinct > 1000  # the DRAM grid would have gone there
    assert candidate_rows(lru_curve(tr))[-1] > 1000


def _raised(trace: Trace, rate: float, floor: float) -> Trace:
    header = dataclasses.replace(trace.header, rate=rate, floor_rate=floor)
    return dataclasses.replace(trace, header=header)


@pytest.mark.parametrize("rows", [1, 100, 5_000, 300_000, 10**8])
def test_size_thresholds_halve_only_while_the_miniature_stays_big(rows: int) -> None:
    empty = np.zeros(0, dtype=np.int64)
    header = evdb.trace.TraceHeader("x", None, "", 0.5, 0, floor_rate=0.001)
    tr = Trace(header, empty, np.zeros(1, np.int64), np.zeros(0, np.uint8), empty, empty, empty)
    top, floor = FULL // 2, round(0.001 * FULL)
    for distinct in (10**6, 20_000):
        (t,) = size_thresholds(tr, [rows], distinct).tolist()
        assert floor <= t <= top
        # a subsample keeps the rows and the keys it needs, and halves no further
        assert t == top or (t * rows >= MINIATURE_ROWS * FULL and distinct * t >= 8192 * top)
        half = t // 2
        assert half < floor or half * rows < MINIATURE_ROWS * FULL or distinct * half < 8192 * top
    fixed = dataclasses.replace(tr, header=dataclasses.replace(header, floor_rate=None))
    assert size_thresholds(fixed, [rows], 10**6).tolist() == [top]  # a fixed-rate trace: never


def test_a_subsampled_size_replays_the_subsample(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(evdb.sizing, "SUBSAMPLE_KEYS", 10)  # the trace holds ~2,000 keys
    _train(tmp_path / "db", tmp_path / "t", steps=30, dram_rows=100)
    tr = _raised(read_trace(tmp_path / "t"), 1.0, 1 / 64)
    big = 40 * MINIATURE_ROWS  # its miniature needs only 1/32 of the keys
    got = simulate(tr, [100, big])
    (t_small, t_big) = size_thresholds(tr, [100, big]).tolist()
    assert t_small == FULL and t_big == FULL // 32
    alone = simulate(tr.subsample(t_big), [big])
    assert got.mini_rows[1] == alone.mini_rows[0]
    assert (got.hits["pull"][1], got.misses["pull"][1]) == (
        alone.hits["pull"][0],
        alone.misses["pull"][0],
    )
    assert got.rate[1] == pytest.approx(1 / 32)  # type: ignore[index]


def test_cli_sizes_the_hbm_tier(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from evdb.tools.cli import cli

    real = _train(tmp_path / "db", tmp_path / "t", steps=40, **HBM)
    done = CliRunner().invoke(cli, ["size", str(tmp_path / "t"), "--tier", "hbm", "--rows", "40"])
    assert done.exit_code == 0, done.stderr
    assert "current hbm_rows" in done.stdout and "HBM hit rate now" in done.stdout
    hbm = real["hbm"]["pull_hits"] / (real["hbm"]["pull_hits"] + real["hbm"]["pull_misses"])
    assert f"{100 * hbm:.2f}%" in done.stdout  # unsampled: the real table's HBM hit rate
    done = CliRunner().invoke(cli, ["size", str(tmp_path / "t"), "--tier", "hbm", "--json"])
    assert done.exit_code == 0 and '"tier": "hbm"' in done.stdout


def test_small_miniatures_are_flagged_only_when_sampled(tmp_path: Path) -> None:
    _train(tmp_path / "db", tmp_path / "t", steps=30, dram_rows=100)
    whole = read_trace(tmp_path / "t")
    report = size_table(whole, rows=[50, 100])  # rate 1: the miniatures are the table
    assert all(c["reliable"] for c in report.to_dict()["curve"])
    assert not any("miniatures of fewer" in w for w in report.warnings)
    sampled = whole.subsample(FULL // 2)  # rate 1/2: 25- and 50-row miniatures
    report = size_table(sampled, rows=[50, 100])
    assert [c["reliable"] for c in report.to_dict()["curve"]] == [False, False]
    assert any("sizes up to 100 rows" in w for w in report.warnings)
