"""Bag and optimizer kernels x every accelerated backend == the numpy reference."""

from __future__ import annotations

import numpy as np
import pytest

from .test_parity import empty_index, random_keys

INF = float("inf")
RTOL, ATOL = 2e-5, 2e-6


def random_bags(rng: np.random.Generator, n_bags: int, max_len: int) -> np.ndarray:
    """bounds (B + 1,) with some empty bags."""
    lengths = rng.integers(0, max_len + 1, n_bags)
    lengths[rng.random(n_bags) < 0.15] = 0
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def weights_for(rng: np.random.Generator, bounds: np.ndarray, weighted: bool) -> np.ndarray:
    n = int(bounds[-1])
    if not weighted:
        return np.ones(n, np.float32)
    w = rng.uniform(-0.5, 2.0, n).astype(np.float32)
    if bounds.shape[0] > 3:  # one non-empty bag whose weights sum to zero
        b = int(np.flatnonzero(np.diff(bounds) >= 2)[0]) if (np.diff(bounds) >= 2).any() else -1
        if b >= 0:
            w[bounds[b] : bounds[b + 1]] = 0.0
    return w


@pytest.mark.parametrize("combiner", [0, 1, 2])
@pytest.mark.parametrize("max_norm", [INF, 0.5])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("init_kind", [0, 1, 2, 3])
@pytest.mark.parametrize("n_bags", [300, 12_000])  # ~30k keys: the parallel driver
def test_probe_gather_combine_matches_reference(
    kernels, reference, rng, combiner, max_norm, weighted, init_kind, n_bags
) -> None:
    dim = 9
    stored = random_keys(rng, 500)
    values = rng.standard_normal((stored.shape[0], dim)).astype(np.float32)
    last_step = rng.integers(0, 10, stored.shape[0]).astype(np.int64)
    bounds = random_bags(rng, n_bags, 6)
    pool = np.concatenate([stored, random_keys(rng, 100)])  # some keys were never stored
    keys = pool[rng.integers(0, pool.shape[0], int(bounds[-1]))]  # duplicates inside bags too
    weights = weights_for(rng, bounds, weighted)
    outs = []
    for mod in (reference, kernels):
        slots = empty_index(2048)
        mod.hash_insert(slots, stored, np.arange(stored.shape[0], dtype=np.int64))
        out = np.full((bounds.shape[0] - 1, dim), np.nan, np.float32)
        missing = mod.probe_gather_combine(
            slots,
            values,
            last_step,
            keys,
            bounds,
            weights,
            4,
            combiner,
            max_norm,
            init_kind,
            np.uint64(3),
            -0.25,
            0.5,
            out,
        )
        outs.append((missing, out))
    assert outs[1][0] == outs[0][0] > 0
    np.testing.assert_allclose(outs[1][1], outs[0][1], rtol=RTOL, atol=ATOL)
    empty = np.diff(bounds) == 0
    assert (outs[1][1][empty] == 0).all()


@pytest.mark.parametrize("combiner", [0, 1, 2])
@pytest.mark.parametrize("max_norm", [INF, 1.0])
@pytest.mark.parametrize("n_bags", [60, 12_000])  # ~25k positions: gather_combine in parallel
def test_gather_combine_and_backward_match_reference(
    kernels, reference, rng, combiner, max_norm, n_bags
) -> None:
    dim, u = 7, 40 if n_bags < 1000 else 4000  # a few positions per key, as in a real batch
    rows = rng.standard_normal((u, dim)).astype(np.float32)
    bounds = random_bags(rng, n_bags, 5)
    inverse = rng.integers(0, u, int(bounds[-1])).astype(np.int64)
    weights = weights_for(rng, bounds, True)
    grad_out = rng.standard_normal((bounds.shape[0] - 1, dim)).astype(np.float32)
    outs = []
    for mod in (reference, kernels):
        out = np.empty((bounds.shape[0] - 1, dim), np.float32)
        mod.gather_combine(rows, inverse, bounds, weights, combiner, max_norm, out)
        grad = np.full((u, dim), np.nan, np.float32)
        mod.combine_backward(grad_out, rows, inverse, bounds, weights, combiner, max_norm, grad)
        outs.append((out, grad))
    np.testing.assert_allclose(outs[1][0], outs[0][0], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(outs[1][1], outs[0][1], rtol=RTOL, atol=ATOL)


def test_group_positions_matches_reference(kernels, reference, rng) -> None:
    inverse = rng.integers(0, 50, 1000).astype(np.int64)
    counts = np.bincount(inverse, minlength=60)
    bounds = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    outs = []
    for mod in (reference, kernels):
        out = np.empty(1000, np.int64)
        mod.group_positions(inverse, bounds, out)
        outs.append(out)
    np.testing.assert_array_equal(outs[1], outs[0])


HYPER = {
    0: [0.1, 0.01, 0.05],  # SGD: lr, weight_decay, group_lasso
    1: [0.1, 1e-10, 0.01, 0.05],  # Adagrad
    2: [0.01, 0.9, 0.999, 1e-8],  # Adam: step size, betas, eps
    3: [0.1, -0.5, 0.01, 0.1],  # FTRL
    4: [0.1, -0.5, 0.5, 0.1],  # group FTRL: l1 large enough to zero some rows
    5: [0.1, 1.0, 0.9, 0.1],  # Adagrad decay, decaying this step
    6: [0.1, 1e-8],  # row-wise Adagrad
}
SLOTS = {0: 0, 1: 1, 2: 2, 3: 2, 4: 2, 5: 1, 6: -1}  # blocks of dim (-1: one column)


@pytest.mark.parametrize("kind", sorted(HYPER))
@pytest.mark.parametrize("per_position", [False, True])
@pytest.mark.parametrize("size", ["small", "large"])  # large: the parallel driver
def test_segment_sum_apply_matches_reference(
    kernels, reference, rng, kind, per_position, size
) -> None:
    dim, n_rows, u = (6, 30, 12) if size == "small" else (6, 40_000, 20_000)
    n_slots = 1 if SLOTS[kind] == -1 else SLOTS[kind] * dim
    values = rng.standard_normal((n_rows, dim)).astype(np.float32)
    slots = rng.uniform(0.1, 1.0, (n_rows, n_slots)).astype(np.float32)
    if kind in (3, 4):  # z may be any sign; n must stay positive
        slots[:, dim:] = rng.standard_normal((n_rows, dim))
    rows = rng.permutation(n_rows)[:u].astype(np.int64)
    rows[3] = -1  # a key without a row: its gradient is dropped
    if per_position:
        n_pos = 40 if size == "small" else 50_000
        inverse = rng.integers(0, u, n_pos).astype(np.int64)
        counts = np.bincount(inverse, minlength=u)
        bounds = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        positions = np.argsort(inverse, kind="stable").astype(np.int64)
        grads = rng.standard_normal((n_pos, dim)).astype(np.float32)
    else:
        bounds = np.arange(u + 1, dtype=np.int64)
        positions = np.arange(u, dtype=np.int64)
        grads = rng.standard_normal((u, dim)).astype(np.float32)
    hyper = np.array(HYPER[kind] + [0.0] * (8 - len(HYPER[kind])))
    outs = []
    for mod in (reference, kernels):
        v, s = values.copy(), slots.copy()
        mod.segment_sum_apply(grads, positions, bounds, rows, kind, hyper, v, s)
        outs.append((v, s))
    np.testing.assert_allclose(outs[1][0], outs[0][0], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(outs[1][1], outs[0][1], rtol=RTOL, atol=ATOL)
    untouched = np.setdiff1d(np.arange(n_rows), rows[rows >= 0])
    np.testing.assert_array_equal(outs[1][0][untouched], values[untouched])
    assert not np.array_equal(outs[1][0], values)
