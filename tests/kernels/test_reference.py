"""The reference kernels against small cases worked out by hand."""

from __future__ import annotations

import numpy as np

from evdb.kernels import reference as ref


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
