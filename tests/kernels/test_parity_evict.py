"""victim_candidates (the DRAM tier's eviction scan): numba against the numpy reference, and
the reference against the rule written out element by element."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evdb.kernels.cpu.evict import victim_candidates as cpu_candidates
from evdb.kernels.reference.evict import victim_candidates as reference_candidates


def columns(rng: np.random.Generator, h: int):
    is_live = rng.random(h) < 0.8
    is_pinned = rng.random(h) < 0.2
    is_protected = rng.random(h) < 0.1
    freq = rng.integers(0, 2**32, h, dtype=np.uint64).astype(np.uint32)
    freq[: h // 2] = rng.integers(0, 20, h // 2).astype(np.uint32)  # small counts, ties
    last_step = rng.integers(-50, 3000, h).astype(np.int64)
    return is_live, is_pinned, is_protected, freq, last_step


@pytest.mark.parametrize("h", [0, 1, 17, 5000])
@pytest.mark.parametrize("lfu", [True, False])
@pytest.mark.parametrize("min_live", [-(2**63), 100, 2500])
def test_victim_candidates_match_reference(h: int, lfu: bool, min_live: int) -> None:
    rng = np.random.default_rng(h * 31 + lfu + min_live % 97)
    cols = columns(rng, h)
    step, half_life = 2000, 300
    outs = []
    for kernel in (reference_candidates, cpu_candidates):
        out = (np.full(h, -7, np.int64), np.full(h, np.nan), np.zeros(h, bool))
        m = kernel(*cols, step, half_life, min_live, lfu, *out)
        outs.append([o[:m] for o in out])
    (rows, scores, expired), (c_rows, c_scores, c_expired) = outs
    np.testing.assert_array_equal(c_rows, rows)
    np.testing.assert_array_equal(c_expired, expired)
    np.testing.assert_allclose(c_scores, scores, rtol=1e-12)

    # The reference follows the rule: candidates, expiry and scores, row by row in Python.
    is_live, is_pinned, is_protected, freq, last_step = cols
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
