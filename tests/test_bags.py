"""Bag lookups and the training-path combine: the combiners, weights, max_norm, errors."""

from __future__ import annotations

import numpy as np
import pytest

import evdb


def combine_model(x, offsets, weights, combiner, max_norm=None):
    """The combiners written out with a Python loop over bags, in float64."""
    n = x.shape[0]
    bounds = [*offsets, n]
    w = np.ones(n) if weights is None else np.asarray(weights, np.float64)
    x = x.astype(np.float64)
    if max_norm is not None:
        norm = np.linalg.norm(x, axis=1, keepdims=True)
        x = np.where(norm > max_norm, x * max_norm / (norm + 1e-7), x)
    out = []
    for b in range(len(offsets)):
        lo, hi = bounds[b], bounds[b + 1]
        s = (x[lo:hi] * w[lo:hi, None]).sum(axis=0)
        div = {"sum": 1.0, "mean": w[lo:hi].sum(), "sqrtn": np.sqrt((w[lo:hi] ** 2).sum())}
        d = div[combiner]
        out.append(s / d if d != 0 else np.zeros(x.shape[1]))
    return np.array(out)


@pytest.fixture
def table(db):
    t = db.create_table("t", dim=5, initializer=evdb.init.Normal(0.0, 1.0, seed=2))
    rng = np.random.default_rng(0)
    t.upsert(np.arange(20), rng.standard_normal((20, 5)) * 3)
    return t


KEYS = np.array([1, 2, 2, 30, 5, 7, 1, 40, 41, 3], dtype=np.int64)  # 30, 40, 41 have no row
OFFSETS = [0, 3, 3, 4, 8]  # bags of 3, 0 (empty), 1, 4, 2 keys


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("max_norm", [None, 1.5])
def test_bag_lookup_matches_the_combiner_model(table, combiner, weighted, max_norm) -> None:
    weights = np.linspace(-1, 2, KEYS.shape[0]).astype(np.float32) if weighted else None
    got = table.lookup(KEYS, OFFSETS, weights, combiner, max_norm)
    per_key = table.lookup(KEYS)  # defaults for 30, 40, 41 included
    want = combine_model(per_key, OFFSETS, weights, combiner, max_norm)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert (got[1] == 0).all()  # the empty bag
    assert len(table) == 20  # a lookup creates nothing


def test_mean_is_the_default_combiner_and_zero_weight_bags_give_zeros(table) -> None:
    np.testing.assert_allclose(
        table.lookup(KEYS, OFFSETS), table.lookup(KEYS, OFFSETS, combiner="mean"), rtol=0
    )
    w = np.ones(KEYS.shape[0], np.float32)
    w[:3] = 0.0
    assert (table.lookup(KEYS, OFFSETS, w, "mean")[0] == 0).all()


def test_max_norm_without_offsets_clips_each_row_and_leaves_the_store(table) -> None:
    before = table.lookup(np.arange(20))
    clipped = table.lookup(np.arange(20), max_norm=1.0)
    norms = np.linalg.norm(clipped, axis=1)
    assert norms.max() <= 1.0 + 1e-6
    small = np.linalg.norm(before, axis=1) <= 1.0
    np.testing.assert_array_equal(clipped[small], before[small])
    np.testing.assert_array_equal(table.lookup(np.arange(20)), before)


def test_bag_lookup_accepts_out(table) -> None:
    out = np.empty((5, 5), np.float32)
    assert table.lookup(KEYS, OFFSETS, out=out) is out
    with pytest.raises(ValueError, match=r"shape \(5, 5\)"):
        table.lookup(KEYS, OFFSETS, out=np.empty((10, 5), np.float32))


def test_pulled_combine_equals_lookup_combine(table) -> None:
    p = table.pull(KEYS)
    for combiner in ("sum", "mean", "sqrtn"):
        np.testing.assert_allclose(
            p.combine(OFFSETS, combiner=combiner, max_norm=2.0),
            table.lookup(KEYS, OFFSETS, combiner=combiner, max_norm=2.0),
            rtol=1e-6,
            atol=1e-7,
        )


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("max_norm", [None, 1.5])
def test_combine_backward_is_the_gradient_of_combine(table, combiner, max_norm) -> None:
    # Central differences of L = sum(G * combine(rows)) with respect to every row element.
    p = table.pull(KEYS)
    weights = np.linspace(0.5, 2, KEYS.shape[0]).astype(np.float32)
    g_out = np.random.default_rng(1).standard_normal((len(OFFSETS), 5)).astype(np.float32)
    got = p.combine_backward(g_out, OFFSETS, weights, combiner, max_norm)
    want = np.zeros_like(got, dtype=np.float64)
    rows = p.rows.astype(np.float64)
    h = 1e-3
    for u in range(rows.shape[0]):
        for j in range(rows.shape[1]):
            for sign in (1, -1):
                r = rows.copy()
                r[u, j] += sign * h
                x = r[p.inverse]
                want[u, j] += (
                    sign
                    * (g_out * combine_model(x, OFFSETS, weights, combiner, max_norm)).sum()
                    / (2 * h)
                )
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize(
    "kwargs,error,message",
    [
        (dict(offsets=[1, 3]), ValueError, r"offsets\[0\] must be 0, got 1"),
        (dict(offsets=[0, 5, 4]), ValueError, r"offsets\[2\] = 4 < offsets\[1\] = 5"),
        (dict(offsets=[0, 11]), ValueError, r"offsets\[1\] = 11 is past the end of keys"),
        (dict(offsets=[[0]]), ValueError, "offsets must be 1-D"),
        (dict(offsets=[0.0, 1.5]), TypeError, "offsets must hold integers"),
        (dict(offsets=[0], weights=np.ones(3)), ValueError, r"weights must have shape \(10,\)"),
        (
            dict(offsets=[0], weights=[1.0] * 9 + [np.nan]),
            ValueError,
            r"weights\[9\] = nan is not finite",
        ),
        (dict(offsets=[0], combiner="max"), ValueError, "combiner must be one of"),
        (dict(offsets=[0], max_norm=0), ValueError, "max_norm must be a finite number > 0"),
        (dict(weights=np.ones(10)), ValueError, "weights and combiner need offsets"),
    ],
)
def test_bad_bag_arguments_are_named(table, kwargs, error, message) -> None:
    with pytest.raises(error, match=message):
        table.lookup(KEYS, **kwargs)
    p = table.pull(KEYS)
    with pytest.raises(error, match=message):
        p.combine(**{"offsets": None, **kwargs})


def test_bag_lookup_of_string_keys(db) -> None:
    t = db.create_table("w", dim=2, key_type="str", initializer=evdb.init.Zeros())
    t.upsert(["a", "b"], [[1.0, 2.0], [3.0, 4.0]])
    got = t.lookup(["a", "b", "zz", "b"], [0, 2], combiner="sum")
    assert got.tolist() == [[4.0, 6.0], [3.0, 4.0]]


def test_combine_backward_rejects_bad_grad_out(table) -> None:
    p = table.pull(KEYS)
    bad = np.ones((len(OFFSETS), 5))
    bad[2, 3] = np.nan
    with pytest.raises(ValueError, match=r"grad_out\[2, 3\] = nan is not finite"):
        p.combine_backward(bad, OFFSETS)
    with pytest.raises(ValueError, match=r"grad_out must have shape \(5, 5\)"):
        p.combine_backward(np.ones((4, 5)), OFFSETS)


def test_bag_lookup_uses_a_constant_default_value(db) -> None:
    t = db.create_table("c", dim=2, default_value=-3.0, initializer=evdb.init.Ones())
    t.upsert([1], [[1.0, 1.0]])
    got = t.lookup([1, 99, 98], [0, 1], combiner="sum")  # 99, 98 have no row: -3 each
    assert got.tolist() == [[1.0, 1.0], [-6.0, -6.0]]


def test_empty_offsets_need_no_keys(table) -> None:
    assert table.lookup(np.empty(0, np.int64), np.empty(0, np.int64)).shape == (0, 5)
    with pytest.raises(ValueError, match="offsets is empty but there are 10 keys"):
        table.lookup(KEYS, np.empty(0, np.int64))
