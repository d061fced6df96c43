"""merge_newest (the follower's overlay merge): numba against the numpy reference."""

from __future__ import annotations

import numpy as np
import pytest

from evdb.kernels.cpu.merge import merge_newest as cpu_merge
from evdb.kernels.reference.merge import merge_newest as reference_merge


def rows(rng: np.random.Generator, n: int, pool: int, dim: int):
    keys = np.sort(rng.choice(np.arange(-pool, pool, dtype=np.int64), n, replace=False))
    values = rng.standard_normal((n, dim)).astype(np.float32)
    steps = rng.integers(0, 100, n).astype(np.int64)
    removed = rng.random(n) < 0.2
    return keys, values, steps, removed


@pytest.mark.parametrize(
    "na,nb,pool", [(0, 0, 10), (0, 5, 10), (7, 0, 10), (50, 40, 60), (3000, 2000, 4000)]
)
def test_merge_newest_matches_reference(na: int, nb: int, pool: int) -> None:
    rng = np.random.default_rng(na * 7 + nb)
    dim = 5
    a, b = rows(rng, na, pool, dim), rows(rng, nb, pool, dim)
    outs = []
    for merge in (reference_merge, cpu_merge):
        out = (
            np.empty(na + nb, np.int64),
            np.empty((na + nb, dim), np.float32),
            np.empty(na + nb, np.int64),
            np.empty(na + nb, bool),
        )
        m = merge(*a, *b, *out)
        outs.append([o[:m] for o in out])
    for want, got in zip(*outs, strict=True):
        np.testing.assert_array_equal(got, want)
    keys = outs[0][0]
    assert keys.shape[0] == np.union1d(a[0], b[0]).shape[0] and (np.diff(keys) > 0).all()
    both = np.intersect1d(a[0], b[0])  # where both have a key, b's row wins
    at = np.searchsorted(keys, both)
    np.testing.assert_array_equal(outs[1][1][at], b[1][np.searchsorted(b[0], both)])
