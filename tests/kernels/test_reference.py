"""The reference kernels against small cases worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evdb.kernels import backend

ref = backend("reference")


def test_unique_inverse_orders_by_first_occurrence() -> None:
    keys = np.array([7, 9, 7, 4, 9], dtype=np.int64)
    u, inv, cnt = np.empty(5, np.int64), np.empty(5, np.int64), np.zeros(5, np.int64)
    scratch = np.full((16, 2), -1, np.int64)
    n = ref.unique_inverse(keys, scratch, u, inv, cnt)
    assert n == 3
    assert u[:3].tolist() == [7, 9, 4]
    assert inv.tolist() == [0, 1, 0, 2, 1]
    assert cnt[:3].tolist() == [2, 2, 1]


def test_probe_gather_treats_rows_older_than_min_live_step_as_missing() -> None:
    slots = np.zeros((8, 2), np.int64)
    slots[:, 1] = -1
    ref.hash_insert(slots, np.array([10, 20], np.int64), np.array([0, 1], np.int64))
    values = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    last_step = np.array([5, 3], np.int64)
    out = np.zeros((3, 2), np.float32)
    rows = np.empty(3, np.int64)
    missing = ref.probe_gather(slots, values, last_step, np.array([20, 10, 30]), 4, out, rows)
    assert missing == 2  # 20 is expired (3 < 4), 30 is absent
    assert rows.tolist() == [-1, 0, -1]
    assert out.tolist() == [[0, 0], [1, 2], [0, 0]]


def test_sketch_add_saturates_and_reads_min_over_the_batch() -> None:
    counters = np.zeros(3, np.uint8)
    est = np.empty(2, np.int64)
    # width 3, one hash: two keys; whatever positions they get, totals are clipped at 255.
    ref.sketch_add(counters, np.array([1, 2], np.int64), np.array([200, 100]), 1, 0, est)
    assert counters.max() <= 255
    assert counters.sum() in (255, 300)  # same counter (clipped) or two counters
    assert (est >= [200, 100]).all()  # never below the true count


@pytest.mark.parametrize("lfu", [True, False])
@pytest.mark.parametrize("min_live", [-(2**63), 100, 2500])
def test_victim_candidates_follow_the_rule_row_by_row(lfu: bool, min_live: int) -> None:
    # Candidates, expiry and scores, written out row by row in Python.
    h, step, half_life = 5000, 2000, 300
    rng = np.random.default_rng(min_live % 97 + lfu)
    is_live, is_pinned, is_protected = (rng.random(h) < p for p in (0.8, 0.2, 0.1))
    freq = rng.integers(0, 2**32, h, dtype=np.uint64).astype(np.uint32)
    freq[: h // 2] = rng.integers(0, 20, h // 2).astype(np.uint32)  # small counts, ties
    last_step = rng.integers(-50, 3000, h).astype(np.int64)
    out = (np.full(h, -7, np.int64), np.full(h, np.nan), np.zeros(h, bool))
    m = ref.victim_candidates(
        is_live, is_pinned, is_protected, freq, last_step, step, half_life, min_live, lfu, *out
    )
    rows, scores, expired = (o[:m] for o in out)
    dead = last_step < min_live
    want = [
        r for r in range(h) if is_live[r] and not is_protected[r] and (not is_pinned[r] or dead[r])
    ]
    np.testing.assert_array_equal(rows, want)
    np.testing.assert_array_equal(expired, dead[want])
    expect = [
        -math.inf
        if dead[r]
        else float(freq[r]) * 2.0 ** (-max(step - int(last_step[r]), 0) / half_life)
        if lfu
        else float(last_step[r])
        for r in want
    ]
    np.testing.assert_allclose(scores, expect, rtol=1e-12)


def test_merge_newest_keeps_the_newer_row_of_a_key() -> None:
    a = (np.array([1, 3, 5]), np.array([[1.0], [3.0], [5.0]], np.float32), np.array([1, 1, 1]))
    b = (np.array([3, 4]), np.array([[30.0], [40.0]], np.float32), np.array([2, 2]))
    out = (np.empty(5, np.int64), np.empty((5, 1), np.float32), np.empty(5, np.int64))
    removed = np.empty(5, bool)
    m = ref.merge_newest(*a, np.zeros(3, bool), *b, np.array([True, False]), *out, removed)
    assert m == 4
    assert out[0][:4].tolist() == [1, 3, 4, 5]
    assert out[1][:4, 0].tolist() == [1.0, 30.0, 40.0, 5.0]
    assert out[2][:4].tolist() == [1, 2, 2, 1]
    assert removed[:4].tolist() == [False, True, False, False]
