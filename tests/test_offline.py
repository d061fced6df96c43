"""evdb.offline: compaction of a closed database by rule, against a plain-numpy model of the
records, and the read-only summary."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import evdb
from evdb import offline

N, DIM, STEPS = 600, 4, 6


@dataclass
class Model:
    """What the test says every row holds: keys (n,), values (n, dim), freq (n,), last (n,)."""

    keys: np.ndarray
    values: np.ndarray
    freq: np.ndarray
    last: np.ndarray
    step: int

    def expected(
        self,
        ttl_steps: int | None = None,
        l2_threshold: float | None = None,
        min_freq: int | None = None,
        step: int | None = None,
    ) -> dict[str, np.ndarray]:
        """Per rule, the keys it removes (a key matching several counts under the first)."""
        at = self.step if step is None else step
        n = self.keys.shape[0]
        ttl = (at - self.last > ttl_steps) if ttl_steps is not None else np.zeros(n, bool)
        l2 = np.zeros(n, bool)
        if l2_threshold is not None:
            l2 = np.sqrt((self.values.astype(np.float64) ** 2).sum(axis=1)) < l2_threshold
        freq = (self.freq < min_freq) if min_freq is not None else np.zeros(n, bool)
        return {
            "ttl": self.keys[ttl],
            "l2": self.keys[l2 & ~ttl],
            "min_freq": self.keys[freq & ~ttl & ~l2],
        }


def build(path: Path, *, disk: bool = True, seed: int = 0) -> Model:
    """A table "t" (no TTL or L2 threshold of its own) whose values, freq and last_step the
    test knows: an upsert of every key at step 0, then a random batch pulled at each step."""
    rng = np.random.default_rng(seed)
    keys = np.arange(N, dtype=np.int64) * 7 - 1000  # negative keys too
    values = (rng.normal(size=(N, DIM)) * rng.uniform(0.05, 2.0, size=(N, 1))).astype(np.float32)
    freq = np.zeros(N, dtype=np.int64)
    last = np.zeros(N, dtype=np.int64)
    with evdb.open(path) as db:
        t = db.create_table("t", dim=DIM, dram_rows=64 if disk else None, disk=disk)
        t.upsert(keys, values)
        for step in range(1, STEPS + 1):
            db.advance()
            at = rng.choice(N, size=150, replace=True)  # duplicates: freq counts occurrences
            t.pull(keys[at])
            np.add.at(freq, at, 1)
            last[np.unique(at)] = step
        db.create_table("other", dim=2).upsert([1, 2], [[0.0, 0.0], [1.0, 1.0]])
    return Model(keys, values, freq, last, STEPS)


def stored(path: Path, table: str = "t") -> dict[str, np.ndarray]:
    """Every stored record of a table (expired ones too), sorted by key."""
    with evdb.open(path, read_only=True) as db:
        parts = list(db.table(table).records(1000))  # expired rows too
    keys = np.concatenate([k for k, _ in parts])
    order = np.argsort(keys)
    return {
        "keys": keys[order],
        "values": np.concatenate([r.values for _, r in parts])[order],
        "freq": np.concatenate([r.freq for _, r in parts]).astype(np.int64)[order],
        "last": np.concatenate([r.last_step for _, r in parts])[order],
    }


def digest(path: Path) -> dict[str, str]:
    """Every file of the directory and a hash of its bytes."""
    out = {}
    for root, _, files in os.walk(path):
        for name in files:
            full = Path(root) / name
            out[str(full.relative_to(path))] = hashlib.sha256(full.read_bytes()).hexdigest()
    return out


@pytest.fixture(params=[True, False], ids=["disk", "dram-only"])
def db_model(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, Model]:
    path = tmp_path / "db"
    model = build(path, disk=request.param)
    # The model is what the table holds: the rules below are judged over these records.
    rec = stored(path)
    order = np.argsort(model.keys)
    assert np.array_equal(rec["keys"], model.keys[order])
    assert np.array_equal(rec["values"], model.values[order])
    assert np.array_equal(rec["freq"], model.freq[order])
    assert np.array_equal(rec["last"], model.last[order])
    return path, model


RULES: list[dict[str, Any]] = [
    {"ttl_steps": 2},
    {"ttl_steps": 0},
    {"ttl_steps": 2, "step": 4},
    {"l2_threshold": 1.0},
    {"min_freq": 2},
    {"ttl_steps": 3, "l2_threshold": 1.5, "min_freq": 1},
]


@pytest.mark.parametrize("rules", RULES, ids=lambda r: ",".join(f"{k}={v}" for k, v in r.items()))
def test_each_rule_removes_exactly_what_numpy_says(
    db_model: tuple[Path, Model], rules: dict[str, Any]
) -> None:
    path, model = db_model
    want = model.expected(**rules)
    gone = np.concatenate(list(want.values()))
    assert 0 < gone.shape[0] < N  # the case removes some rows and keeps some

    report = offline.compact(path, "t", **rules)

    t = report["tables"]["t"]
    assert report["dry_run"] is False
    assert t["removed"] == {rule: int(k.shape[0]) for rule, k in want.items()}
    assert t["rows_before"] == N
    assert t["kept"] == N - gone.shape[0]
    assert t["rows_before"] == t["kept"] + sum(t["removed"].values())
    assert set(report["tables"]) == {"t"}  # only the table named
    after = stored(path)
    assert np.array_equal(after["keys"], np.setdiff1d(model.keys, gone))
    keep = np.isin(model.keys, after["keys"])
    order = np.argsort(model.keys[keep])
    assert np.array_equal(after["values"], model.values[keep][order])  # the rest untouched
    with evdb.open(path, read_only=True) as db:
        assert len(db.table("t")) == t["kept"]
        assert db.table("t").contains(gone).sum() == 0
        assert len(db.table("other")) == 2
        assert db.step == STEPS


def test_counts_add_up_over_tables(db_model: tuple[Path, Model]) -> None:
    path, _ = db_model
    report = offline.compact(path, l2_threshold=1.0)
    assert set(report["tables"]) == {"t", "other"}
    assert report["tables"]["other"]["removed"] == {"ttl": 0, "l2": 1, "min_freq": 0}
    assert report["rows_before"] == N + 2
    assert report["rows_before"] == report["kept"] + sum(report["removed"].values())
    for rule in offline.RULES:
        assert report["removed"][rule] == sum(t["removed"][rule] for t in report["tables"].values())
    assert report["tables"]["t"]["rules"] == {
        "ttl_steps": None,
        "l2_threshold": 1.0,
        "min_freq": None,
    }


def test_dry_run_counts_the_same_and_changes_nothing(db_model: tuple[Path, Model]) -> None:
    path, _ = db_model
    rules = {"ttl_steps": 3, "l2_threshold": 1.5, "min_freq": 1}
    before = digest(path)
    dry = offline.compact(path, **rules, dry_run=True)
    assert digest(path) == before
    assert stored(path)["keys"].shape[0] == N
    real = offline.compact(path, **rules)
    assert dry["dry_run"] is True
    assert {k: v for k, v in dry.items() if k != "dry_run"} == {
        k: v for k, v in real.items() if k != "dry_run"
    }


def test_defaults_come_from_the_table_config(tmp_path: Path) -> None:
    path = tmp_path / "db"
    with evdb.open(path) as db:
        t = db.create_table("t", dim=2, ttl_steps=3, l2_threshold=0.5, dram_rows=2)
        t.upsert([1, 2, 3], [[1.0, 1.0], [0.1, 0.1], [2.0, 0.0]])  # step 0; 2 is weak
        db.advance(2)
        t.upsert([4, 5], [[1.0, 0.0], [0.0, 0.2]])  # step 2; 5 is weak
    report = offline.compact(path, dry_run=True)  # step 2: nothing expired yet
    assert report["tables"]["t"]["removed"] == {"ttl": 0, "l2": 2, "min_freq": 0}
    assert report["tables"]["t"]["rules"]["ttl_steps"] == 3
    report = offline.compact(path, step=4, dry_run=True)  # 4 - 0 > 3: 1, 2, 3 expire
    assert report["step"] == 4
    assert report["tables"]["t"]["removed"] == {"ttl": 3, "l2": 1, "min_freq": 0}
    report = offline.compact(path, step=4, ttl_steps=10)  # an override wins
    assert report["tables"]["t"]["removed"] == {"ttl": 0, "l2": 2, "min_freq": 0}
    with evdb.open(path, read_only=True) as db:
        assert db.step == 2  # step= judges TTL; it does not move the clock
        assert db.table("t").contains([1, 2, 3, 4, 5]).tolist() == [True, False, True, True, False]


def test_expired_rows_are_reclaimed_and_space_returns(tmp_path: Path) -> None:
    path = tmp_path / "db"
    with evdb.open(path) as db:
        t = db.create_table("t", dim=16, ttl_steps=5, dram_rows=100)
        t.upsert(np.arange(20_000), np.ones((20_000, 16), dtype=np.float32))
        db.advance(10)
        t.upsert(np.arange(100), np.ones((100, 16), dtype=np.float32))
        assert len(t) == 100
    before = offline.info(path)["tables"]["t"]["stats"]["tiers"]["rocksdb"]
    report = offline.compact(path)
    t = report["tables"]["t"]
    # (eviction already dropped a few expired rows during the second upsert)
    assert t["removed"]["ttl"] == t["rows_before"] - 100 > 19_000
    assert t["kept"] == 100
    after = offline.info(path)["tables"]["t"]["stats"]["tiers"]["rocksdb"]
    assert after["rows"] == 100 < before["rows"]
    assert after["bytes"] < before["bytes"] / 10  # the manual compaction dropped them


def test_string_keyed_table(tmp_path: Path) -> None:
    path = tmp_path / "db"
    with evdb.open(path) as db:
        db.create_table("words", dim=2, key_type="str").upsert(
            ["a", "b", "c"], [[0.0, 0.0], [1.0, 1.0], [0.0, 0.01]]
        )
    report = offline.compact(path, "words", l2_threshold=0.5)
    assert report["tables"]["words"]["removed"]["l2"] == 2
    with evdb.open(path, read_only=True) as db:
        assert db.table("words").contains(["a", "b", "c"]).tolist() == [False, True, False]


def test_progress_reports_rows_scanned(db_model: tuple[Path, Model]) -> None:
    path, _ = db_model
    calls: list[tuple[int, int]] = []
    offline.compact(path, min_freq=1, dry_run=True, progress=lambda d, t: calls.append((d, t)))
    done = [d for d, _ in calls]
    assert done == sorted(done) and calls[-1] == (N + 2, N + 2)
    assert {t for _, t in calls} == {N + 2}


@pytest.mark.parametrize(
    "kwargs, arg",
    [
        ({"ttl_steps": -1}, "ttl_steps"),
        ({"ttl_steps": 1.5}, "ttl_steps"),
        ({"ttl_steps": True}, "ttl_steps"),
        ({"min_freq": -2}, "min_freq"),
        ({"min_freq": "3"}, "min_freq"),
        ({"step": -1}, "step"),
        ({"step": 2**63}, "step"),
        ({"l2_threshold": -0.1}, "l2_threshold"),
        ({"l2_threshold": float("nan")}, "l2_threshold"),
        ({"l2_threshold": "1"}, "l2_threshold"),
        ({"dry_run": 1}, "dry_run"),
        ({"progress": 3}, "progress"),
        ({"table": 3}, "table"),
    ],
)
def test_bad_arguments_change_nothing(tmp_path: Path, kwargs: dict[str, Any], arg: str) -> None:
    path = tmp_path / "db"
    with evdb.open(path) as db:
        db.create_table("t", dim=2).upsert([1], [[0.0, 0.0]])
    before = digest(path)
    with pytest.raises(evdb.InvalidArgumentError, match=rf"^{arg}\b"):
        offline.compact(path, **{"min_freq": 5, **kwargs})
    assert digest(path) == before


def test_not_found(tmp_path: Path) -> None:
    path = tmp_path / "db"
    with evdb.open(path) as db:
        db.create_table("t", dim=2)
    with pytest.raises(evdb.TableNotFoundError, match="nope"):
        offline.compact(path, "nope")
    missing = tmp_path / "missing"
    for call in (offline.compact, offline.info):
        with pytest.raises(FileNotFoundError, match="not an evdb database"):
            call(missing)
    assert not missing.exists()  # never created
    with pytest.raises(evdb.InvalidArgumentError, match=r"^path"):
        offline.compact(123)  # type: ignore[arg-type]


def test_a_checkpoint_is_compacted_only_dry(tmp_path: Path) -> None:
    path, ckpt = tmp_path / "db", tmp_path / "ckpt"
    with evdb.open(path) as db:
        db.create_table("t", dim=2).upsert([1, 2], [[0.0, 0.0], [1.0, 1.0]])
        db.checkpoint(ckpt)
    before = digest(ckpt)
    with pytest.raises(evdb.InvalidArgumentError, match="is a checkpoint"):
        offline.compact(ckpt, l2_threshold=0.5)
    assert offline.compact(ckpt, l2_threshold=0.5, dry_run=True)["removed"]["l2"] == 1
    assert digest(ckpt) == before
    evdb.verify(ckpt)


def test_info(tmp_path: Path) -> None:
    path = tmp_path / "db"
    with evdb.open(path) as db:
        t = db.create_table("t", dim=3, ttl_steps=7, key_type="str")
        t.upsert(["x", "y"], np.ones((2, 3)))
        db.advance(4)
        db.checkpoint(tmp_path / "full")
        t.upsert(["z"], np.ones((1, 3)))
        db.checkpoint(tmp_path / "incr", base=tmp_path / "full")
    before = digest(path)
    out = offline.info(path)
    assert digest(path) == before
    assert out["path"] == str(path) and out["step"] == 4 and out["checkpoint"] is None
    table = out["tables"]["t"]
    assert (table["dim"], table["key_type"], table["rows"]) == (3, "str", 3)
    assert table["config"]["ttl_steps"] == 7
    assert table["stats"]["rows"] == 3
    full = offline.info(tmp_path / "full")
    assert full["checkpoint"]["kind"] == "full" and full["tables"]["t"]["rows"] == 2
    incr = offline.info(tmp_path / "incr")
    assert incr["checkpoint"]["kind"] == "incremental"
    assert incr["checkpoint"]["base"] == str((tmp_path / "full").resolve())
    assert incr["tables"]["t"] == {"rows": 3, "changed_rows": 1}
