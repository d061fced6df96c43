"""Table.neighbors: the streamed top-k equals the plain reference on random tables (cached,
on disk, expired rows, HBM on top), ties go by key, bad input changes nothing, and the GloVe
neighbours of common words are the sensible ones a brute-force numpy search finds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import evdb
from evdb.neighbors import neighbors_reference

_SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
DATA = _SHARED if _SHARED.is_dir() else Path(__file__).resolve().parent / "data" / "shared"
GLOVE = DATA / "glove" / "glove.6B.50d.top10k.txt"

METRICS = ("cosine", "dot", "l2")


def _assert_same(got: tuple, want: tuple) -> None:
    np.testing.assert_allclose(got[1], want[1], rtol=1e-4, atol=1e-4)
    assert got[0].tolist() == want[0].tolist()


@pytest.fixture
def db(tmp_path: Path):
    with evdb.open(tmp_path / "db") as d:
        yield d


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("layout", ["dram", "spilled", "hbm"])
def test_random_tables_equal_the_reference(db, seed: int, layout: str) -> None:
    rng = np.random.default_rng(seed)
    n, dim = int(rng.integers(1, 700)), int(rng.integers(1, 17))
    opts: dict = {"disk": False}
    if layout == "spilled":
        opts = {"dram_rows": max(8, n // 4)}
    elif layout == "hbm":
        hbm = evdb.HbmConfig(capacity_rows=max(8, n // 3), device="cpu")
        opts = {"hbm": hbm, "dram_rows": max(8, n // 2)}
    t = db.create_table("t", dim=dim, **opts)
    keys = rng.choice(1 << 40, n, replace=False) - (1 << 39)
    t.upsert(keys, rng.normal(size=(n, dim)).astype(np.float32))
    db.flush()
    for metric in METRICS:
        for k in (1, 5, n + 3):
            query = int(keys[rng.integers(n)])
            _assert_same(t.neighbors(query, k, metric), neighbors_reference(t, query, k, metric))
            vec = rng.normal(size=dim)
            _assert_same(t.neighbors(vec, k, metric), neighbors_reference(t, vec, k, metric))


def test_the_query_key_is_left_out_and_a_vector_query_keeps_it(db) -> None:
    t = db.create_table("t", dim=3, disk=False)
    t.upsert([1, 2, 3], [[1, 0, 0], [0.9, 0.1, 0], [0, 1, 0]])
    keys, _ = t.neighbors(1, k=2)
    assert keys.tolist() == [2, 3]
    keys, _ = t.neighbors([1, 0, 0], k=2)
    assert keys.tolist() == [1, 2]
    keys, dist = t.neighbors([0, 1, 0], k=3, metric="l2")
    assert keys.tolist() == [3, 2, 1] and dist[0] == 0 and dist[2] == pytest.approx(np.sqrt(2))


def test_ties_go_by_key_across_chunks_and_tiers(db) -> None:
    # Small integers: every dot product is exact in float32, so the ties are real ties.
    t = db.create_table("t", dim=2, dram_rows=40)
    keys = np.arange(3000, 0, -1, dtype=np.int64) * 3
    values = np.tile(np.array([[1, 2], [2, 1], [1, 1]], np.float32), (1000, 1))
    t.upsert(keys, values)
    db.flush()
    got = t.neighbors([1, 2], k=7, metric="dot")
    want = sorted(int(k) for k, v in zip(keys, values, strict=True) if (v == [1, 2]).all())[:7]
    assert got[0].tolist() == want and got[1].tolist() == [5.0] * 7
    _assert_same(got, neighbors_reference(t, [1, 2], 7, "dot"))


def test_expired_rows_are_not_neighbours(db) -> None:
    t = db.create_table("t", dim=2, ttl_steps=5, dram_rows=16)
    t.upsert(np.arange(50), np.ones((50, 2), np.float32))
    db.advance(10)
    t.upsert(np.arange(50, 60), np.ones((10, 2), np.float32))
    db.flush()
    keys, _ = t.neighbors([1, 1], k=100)
    assert sorted(keys.tolist()) == list(range(50, 60))


def test_a_missing_key_queries_with_its_default_value(db) -> None:
    t = db.create_table("t", dim=4, initializer=evdb.init.Normal(std=1.0, seed=1), disk=False)
    t.upsert(np.arange(100), np.random.default_rng(0).normal(size=(100, 4)).astype(np.float32))
    got = t.neighbors(12345, k=3)
    _assert_same(got, t.neighbors(t.lookup([12345])[0], k=3))


def test_str_tables_take_and_return_strings(db) -> None:
    t = db.create_table("w", dim=2, key_type="str", keep_strings=True, disk=False)
    t.upsert(["a", "b", "c"], [[1, 0], [0.8, 0.2], [0, 1]])
    keys, _ = t.neighbors("a", k=2, as_strings=True)
    assert keys == ["b", "c"]
    plain = db.create_table("p", dim=2, disk=False)
    with pytest.raises(evdb.InvalidArgumentError, match="keep_strings"):
        plain.neighbors([1, 0], as_strings=True)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"query": 1, "k": 0}, "k must be an int >= 1, got 0"),
        ({"query": 1, "k": True}, "k must be an int"),
        ({"query": 1, "k": 2.0}, "k must be an int"),
        ({"query": 1, "metric": "euclid"}, "metric must be one of"),
        ({"query": [1.0, 2.0]}, r"query: a vector must have shape \(3,\)"),
        ({"query": [1.0, float("nan"), 2.0]}, r"query\[1\] is not finite"),
        ({"query": [1.0, 1e39, 2.0]}, r"query\[1\] is outside float32's range"),
        ({"query": [0.0, 0.0, 0.0]}, "zero vector"),
        ({"query": "word"}, "query.* is str 'word'; this table takes integer keys"),
        ({"query": None}, "query must be a key or a vector"),
        ({"query": True}, "query must be a key or a vector"),
        ({"query": [[1.0, 2.0, 3.0]]}, "shape"),
    ],
)
def test_bad_input_names_the_argument(db, kwargs: dict, match: str) -> None:
    t = db.create_table("t", dim=3, disk=False)
    t.upsert([1, 2], np.ones((2, 3), np.float32))
    before = t.stats()
    with pytest.raises((evdb.InvalidArgumentError, evdb.InvalidTypeError), match=match):
        t.neighbors(**kwargs)
    assert t.stats() == before


def test_glove_neighbours_are_sensible_and_equal_brute_force(db) -> None:
    if not GLOVE.exists():
        pytest.skip(f"{GLOVE} is not on this machine")
    evdb.import_vectors(db, "glove", GLOVE, "glove", dram_rows=2000)
    db.flush()
    t = db.table("glove")
    words: list[str] = []
    matrix = []
    with GLOVE.open(encoding="utf-8") as f:
        for line in f:
            word, *rest = line.rstrip("\n").split(" ")
            words.append(word)
            matrix.append(np.array(rest, dtype=np.float32))
    m = np.stack(matrix)
    unit = m / np.linalg.norm(m, axis=1, keepdims=True)
    index = {w: i for i, w in enumerate(words)}
    expect = {"king": {"queen", "prince"}, "france": {"paris", "french"}, "monday": {"tuesday"}}
    for word, must in expect.items():
        got, scores = t.neighbors(word, k=10, as_strings=True)
        assert must <= set(got), (word, got)
        sims = unit @ unit[index[word]]
        sims[index[word]] = -np.inf
        want = np.argsort(-sims, kind="stable")[:10]
        assert got == [words[i] for i in want]
        np.testing.assert_allclose(scores, sims[want], rtol=1e-5)


def test_memory_stays_at_a_chunk_whatever_the_table_size(tmp_path: Path) -> None:
    """The scan streams: a table four times larger peaks at about the same memory (numpy's
    and the RocksDB tier's allocations, as tracemalloc sees them), below its values' bytes."""
    import tracemalloc

    peaks = []
    for n in (60_000, 240_000):
        with evdb.open(tmp_path / f"db{n}") as db:
            t = db.create_table("t", dim=32, dram_rows=2000)
            rng = np.random.default_rng(n)
            for start in range(0, n, 30_000):
                t.upsert(np.arange(start, start + 30_000), rng.normal(size=(30_000, 32)))
            db.flush()
            t.neighbors(np.ones(32), 10)  # first call: one-off allocations out of the way
            tracemalloc.start()
            try:
                t.neighbors(np.ones(32), 10)
                peaks.append(tracemalloc.get_traced_memory()[1])
            finally:
                tracemalloc.stop()
    assert peaks[1] < 1.5 * peaks[0], peaks
    assert peaks[1] < 240_000 * 32 * 4, peaks
