"""evdb.view: a table read at an explicit step with an overlay of newer rows equals a plain
table holding the same rows (lookup plain and in bags, contains, count, records, neighbours,
samples), at the view's step and at others (TTL), whether the overlay's rows sit in one layer
or two and whether the table's rows are in DRAM or on disk."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import evdb
from evdb import view_overlay
from evdb.errors import InvalidArgumentError
from evdb.keys import hash_strings
from evdb.publish import Delta
from evdb.sampling import sample_rows
from evdb.view import Overlay, ReadableTable, Rows, TableView
from evdb.view_sample import SampleCache

DIM = 5
TTL = 6
KEYS = 300  # key space: rows, overlay rows, tombstones and misses all land in it


@dataclass
class Pair:
    """A view (a base table, an overlay of deltas over it, a step) and a plain table that
    holds the same rows, written at the same steps."""

    view: TableView
    plain: evdb.Table
    step: int
    dbs: tuple[evdb.Database, evdb.Database]

    def close(self) -> None:
        for db in self.dbs:
            db.close()


def _table(db: evdb.Database, spilled: bool, ttl: int | None) -> evdb.Table:
    opts: dict[str, Any] = {"dram_rows": 24} if spilled else {"disk": False}
    init = evdb.init.Normal(std=0.5, seed=11)
    return db.create_table("t", dim=DIM, ttl_steps=ttl, initializer=init, **opts)


def _build(
    tmp_path: Path, seed: int, *, spilled: bool = False, ttl: int | None = TTL, n_deltas: int = 4
) -> Pair:
    """Base rows at steps 0 and 1, then deltas at steps 2, 3, ...: each delta upserts some
    keys and removes others (on the plain table: upsert and delete at that step)."""
    rng = np.random.default_rng(seed)
    tmp_path.mkdir(parents=True, exist_ok=True)
    base_db = evdb.open(tmp_path / f"base{seed}")
    plain_db = evdb.open(tmp_path / f"plain{seed}")
    base, plain = _table(base_db, spilled, ttl), _table(plain_db, spilled, ttl)
    for _ in range(2):  # rows at steps 0 and 1
        keys = rng.choice(KEYS, size=60, replace=False)
        values = rng.normal(size=(60, DIM)).astype(np.float32)
        for t in (base, plain):
            t.upsert(keys, values)
        base_db.advance(1)
        plain_db.advance(1)
    deltas = []
    for i in range(n_deltas):
        step = 2 + i
        while plain_db.step < step:
            plain_db.advance(1)
        keys = np.unique(rng.choice(KEYS, size=40))
        removed = np.setdiff1d(np.unique(rng.choice(KEYS, size=12)), keys)
        values = (rng.normal(size=(keys.shape[0], DIM)) * (1 + i)).astype(np.float32)
        plain.upsert(keys, values)
        plain.delete(removed)
        deltas.append(Delta(keys, values, np.full(keys.shape[0], step, np.int64), removed))
    overlay = Overlay.empty(DIM)
    for d in deltas:  # one apply per publication, as a follower polling each one
        overlay = overlay.applied([d])
    return Pair(TableView(base, plain_db.step, overlay), plain, plain_db.step, (base_db, plain_db))


@pytest.fixture(params=[(0, False), (1, False), (2, True), (3, True)], ids=lambda p: str(p))
def pair(request, tmp_path: Path):
    seed, spilled = request.param
    p = _build(tmp_path, seed, spilled=spilled)
    yield p
    p.close()


def _random_keys(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(-5, KEYS + 5, size=n).astype(np.int64)


def test_lookup_and_contains_equal_the_plain_table_at_every_step(pair: Pair) -> None:
    rng = np.random.default_rng(1)
    keys = _random_keys(rng, 400)
    for step in (pair.step, pair.step + 1, pair.step + 3, pair.step + TTL):
        found = np.empty(keys.shape[0], dtype=bool)
        got = pair.view.lookup(keys, found=found, step=step)
        want_found = np.empty(keys.shape[0], dtype=bool)
        want = pair.plain.lookup(keys, found=want_found, step=step)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(found, want_found)
        np.testing.assert_array_equal(found, pair.plain.contains(keys, step=step))
        np.testing.assert_array_equal(
            pair.view.contains(keys, step=step), pair.plain.contains(keys, step=step)
        )
        assert pair.view.count(step=step) == pair.plain.count(step=step)
        if step == pair.step:  # the view's own step is the default
            np.testing.assert_array_equal(pair.view.lookup(keys), want)
            assert len(pair.view) == pair.plain.count(step=step)


@pytest.mark.parametrize("combiner", [None, "sum", "mean", "sqrtn"])
@pytest.mark.parametrize("max_norm", [None, 0.7])
def test_bags_with_weights_and_max_norm_equal_the_plain_table(
    pair: Pair, combiner: str | None, max_norm: float | None
) -> None:
    rng = np.random.default_rng(2)
    keys = _random_keys(rng, 300)
    cuts = np.sort(rng.integers(0, keys.shape[0], size=40))
    offsets = np.concatenate([[0], cuts])  # repeated cuts: empty bags
    weights = rng.uniform(0.1, 2, size=keys.shape[0]).astype(np.float32)
    for args in ((offsets, weights, combiner), (offsets, None, combiner), (None, None, None)):
        if args[0] is None and combiner is not None:
            continue
        found = np.empty(keys.shape[0], dtype=bool)
        got = pair.view.lookup(keys, *args, max_norm, found=found)
        want = pair.plain.lookup(keys, *args, max_norm, step=pair.step)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(found, pair.plain.contains(keys, step=pair.step))


def test_out_is_written_in_place_and_bad_arguments_raise_as_the_table_does(pair: Pair) -> None:
    keys = np.arange(0, 100, dtype=np.int64)
    out = np.empty((100, DIM), np.float32)
    assert pair.view.lookup(keys, out=out) is out
    np.testing.assert_array_equal(out, pair.plain.lookup(keys, step=pair.step))
    bags = np.empty((2, DIM), np.float32)
    assert pair.view.lookup(keys, [0, 50], out=bags) is bags
    np.testing.assert_allclose(bags, pair.plain.lookup(keys, [0, 50], step=pair.step), rtol=1e-6)
    bad: list[dict[str, Any]] = [
        {"out": np.empty((99, DIM), np.float32)},
        {"out": np.empty((100, DIM), np.float64)},
        {"found": np.empty(99, dtype=bool)},
        {"offsets": [1, 2]},
        {"weights": np.ones(100)},  # weights without offsets
        {"offsets": [0], "combiner": "max"},
        {"max_norm": -1.0},
    ]
    for kwargs in bad:
        with pytest.raises(InvalidArgumentError) as want:
            pair.plain.lookup(keys, **kwargs)
        with pytest.raises(InvalidArgumentError) as got:
            pair.view.lookup(keys, **kwargs)
        assert str(got.value) == str(want.value)


@pytest.mark.parametrize("metric", ["cosine", "dot", "l2"])
def test_neighbours_equal_the_plain_table(pair: Pair, metric: str) -> None:
    rng = np.random.default_rng(3)
    live = pair.plain.contains(np.arange(KEYS), step=pair.step)
    queries: list[Any] = [int(np.flatnonzero(live)[0]), int(np.flatnonzero(~live)[0])]
    queries.append(rng.normal(size=DIM))
    for query in queries:
        got = pair.view.neighbors(query, 7, metric)
        want = pair.plain.neighbors(query, 7, metric, step=pair.step)
        assert got[0].tolist() == want[0].tolist()
        np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-5)


def test_records_and_live_values_hold_the_plain_tables_rows(pair: Pair) -> None:
    def rows(chunks: Any) -> dict[int, tuple[list[float], int]]:
        out = {}
        for keys, recs in chunks:
            for k, v, s in zip(
                keys.tolist(), recs.values.tolist(), recs.last_step.tolist(), strict=True
            ):
                assert k not in out  # each key once
                out[k] = (v, s)
        return out

    for step in (pair.step, pair.step + 3):
        got = rows(pair.view.records(64, live_only=True, step=step))
        assert got == rows(pair.plain.records(64, live_only=True, step=step))
        values = {
            k: v
            for vals, keys in pair.view.live_values(step=step)
            for k, v in zip(keys.tolist(), vals.tolist(), strict=True)
        }
        assert values == {k: v for k, (v, _) in got.items()}
        items = {
            k: v
            for keys, vals in pair.view.items(50, step=step)
            for k, v in zip(keys.tolist(), vals.tolist(), strict=True)
        }
        assert items == values
    everything = rows(pair.view.records(64))  # expired rows too, never a tombstone
    assert set(everything) == set(rows(pair.plain.records(64)))


def test_two_layers_folded_or_not_read_the_same(tmp_path: Path, monkeypatch) -> None:
    one = _build(tmp_path / "one", 5, n_deltas=8)
    monkeypatch.setattr(view_overlay, "RECENT_ROWS", 4)  # the recent layer folds at every apply
    two = _build(tmp_path / "two", 5, n_deltas=8)
    assert one.view.overlay.older.n_rows == 0 and two.view.overlay.older.n_rows > 0
    keys = _random_keys(np.random.default_rng(4), 500)
    np.testing.assert_array_equal(one.view.lookup(keys), two.view.lookup(keys))
    np.testing.assert_array_equal(two.view.lookup(keys), two.plain.lookup(keys, step=two.step))
    assert one.view.count() == two.view.count() == two.plain.count(step=two.step)
    one.close()
    two.close()


def test_a_later_delta_wins_and_a_tombstone_hides_the_tables_row(tmp_path: Path) -> None:
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("t", dim=2, disk=False, default_value=-1.0)
        t.upsert([1, 2], [[1.0, 1.0], [2.0, 2.0]])
        row = np.array([[3.0, 3.0]], np.float32)
        first = Delta(np.array([1]), row, np.array([0]), np.array([2]))
        second = Delta(np.array([2]), row + 1, np.array([0]), np.array([1]))
        v = TableView(t, 0, Overlay.empty(2).applied([first, second]))
        assert v.lookup([1, 2, 3]).tolist() == [[-1.0, -1.0], [4.0, 4.0], [-1.0, -1.0]]
        assert v.contains([1, 2, 3]).tolist() == [False, True, False] and len(v) == 1
        assert v.overlay.rows.keys.tolist() == [1, 2]
        assert v.stats()["rows"] == 1 and v.stats()["overlay_rows"] == 2


def test_a_view_over_no_overlay_is_the_table_at_its_step(tmp_path: Path) -> None:
    p = _build(tmp_path, 6, n_deltas=0)
    plain = TableView(p.plain)
    assert plain.step == p.plain.step and plain.overlay.n_rows == 0
    keys = _random_keys(np.random.default_rng(5), 200)
    for step in (0, 3, 9):
        v = TableView(p.view.table, step)
        np.testing.assert_array_equal(v.lookup(keys), p.view.table.lookup(keys, step=step))
        assert len(v) == p.view.table.count(step=step)
    with pytest.raises(InvalidArgumentError, match="dim"):
        TableView(p.plain, 0, Overlay.empty(DIM + 1))
    p.close()


def test_str_tables_read_through_the_view(tmp_path: Path) -> None:
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("w", dim=2, key_type="str", keep_strings=True, disk=False)
        t.upsert(["cat", "dog"], [[1.0, 0.0], [0.0, 1.0]])
        hashed = hash_strings(["dog", "eel"])
        delta = Delta(np.sort(hashed), np.ones((2, 2), np.float32), np.zeros(2, np.int64),
                      np.empty(0, np.int64))  # fmt: skip
        v = TableView(t, 0, Overlay.empty(2).applied([delta]))
        assert v.lookup(["dog", "cat"]).tolist() == [[1.0, 1.0], [1.0, 0.0]]
        assert v.keeps_strings and v.strings(hashed) == ["dog", None]  # a delta has none
        keys, _ = v.neighbors("cat", 3, as_strings=True)
        assert sorted(keys, key=str) == [None, "dog"]


def test_the_sample_of_a_view_is_its_tables_with_the_overlay_merged(tmp_path: Path) -> None:
    p = _build(tmp_path, 7)
    cache = SampleCache(max_rows=10_000)
    got = cache.sample(p.view)
    want = sample_rows(p.plain)  # every row: the table is smaller than the sample
    assert got.keys.tolist() == want.keys.tolist()
    np.testing.assert_array_equal(got.values, want.values)
    np.testing.assert_array_equal(got.last_step, want.last_step)
    assert got.total == want.total == len(p.view) and got.step == p.step
    later = TableView(p.view.table, p.step + 2, p.view.overlay)
    cache.sample(later)
    assert cache.scans == 1  # the table was scanned once for both views
    p.close()


def test_table_and_view_satisfy_the_read_protocol(pair: Pair) -> None:
    assert isinstance(pair.view, ReadableTable) and isinstance(pair.plain, ReadableTable)


def test_sharded_table_satisfies_the_read_protocol() -> None:
    from evdb.distributed.table import ShardedTable

    wanted = ["step", "keeps_strings", "count", "records", "neighbors", "strings"]
    missing = [m for m in wanted if not hasattr(ShardedTable, m)]
    lookup = inspect.signature(ShardedTable.lookup).parameters
    missing += [f"lookup({p}=)" for p in ("out", "promote") if p not in lookup]
    assert missing == [], f"ShardedTable lacks {missing}"


def test_rows_merge_keeps_the_newer_row_of_a_key() -> None:
    def rows(keys: list[int], fill: float, removed: bool = False) -> Rows:
        n = len(keys)
        return Rows(np.array(keys, np.int64), np.full((n, 1), fill, np.float32),
                    np.zeros(n, np.int64), np.full(n, removed))  # fmt: skip

    merged = rows([1, 3, 5], 1.0).under(rows([2, 3, 6], 2.0, removed=True))
    assert merged.keys.tolist() == [1, 2, 3, 5, 6]
    assert merged.values[:, 0].tolist() == [1.0, 2.0, 2.0, 1.0, 2.0]
    assert merged.removed.tolist() == [False, True, True, False, True]
    assert merged.holds(np.array([0, 3, 4, 6])).tolist() == [False, True, False, True]


def test_views_at_two_steps_of_one_read_only_table_count_their_own_rows(tmp_path: Path) -> None:
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("t", dim=2, ttl_steps=2, dram_rows=8)
        t.upsert(np.arange(40), np.ones((40, 2), np.float32))  # step 0: on disk
        db.advance(2)
        t.upsert(np.arange(100, 140), np.ones((40, 2), np.float32))  # step 2
    with evdb.open(tmp_path / "db", read_only=True) as ro:
        newer, older = TableView(ro.table("t"), 4), TableView(ro.table("t"), 3)
        assert len(newer) == 40
        live = sum(k.shape[0] for k, _ in older.records(live_only=True))
        assert len(older) == live == 40  # the rows of step 0 expired at step 3
