"""The kernels' own log and sin/cos (cpu/libm.py) against numpy's, and the initializer paths
that use them against each other, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from evdb.kernels.cpu import init
from evdb.kernels.cpu.libm import cos_sin_turns, log_positive
from tests.kernels.test_parity import random_keys


@njit
def _logs(x):  # type: ignore[no-untyped-def]
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        out[i] = log_positive(x[i])
    return out


@njit
def _cos_sin(u):  # type: ignore[no-untyped-def]
    c = np.empty_like(u)
    s = np.empty_like(u)
    for i in range(u.shape[0]):
        c[i], s[i] = cos_sin_turns(u[i])
    return c, s


def test_log_is_within_an_ulp_of_numpy(rng) -> None:
    # every binade a uniform draw can land in, both sides of sqrt(2) (where the mantissa is
    # halved) and of 1, and the draws' own extremes
    x = np.concatenate(
        [
            np.exp2(rng.uniform(-60.0, 10.0, 200_000)),
            np.nextafter(np.sqrt(2.0), [0.0, 3.0]) * 2.0 ** np.array([-1.0, 0.0]),
            1.0 + np.array([-1e-15, -(2**-53), 2**-52, 1e-9, -1e-9]),
            [1.0, 0.5, 2**-54, 1.0 - 2**-53, np.finfo(np.float64).tiny],
        ]
    )
    got, want = _logs(x), np.log(x)
    assert np.all(np.abs(got - want) <= np.spacing(np.abs(want)) + 1e-300), x[
        np.argmax(np.abs(got - want) / np.spacing(np.abs(want)))
    ]


@pytest.mark.parametrize("near", [0.0, 0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0])
def test_cos_sin_of_turns_match_numpy_in_every_octant(rng, near) -> None:
    # each quarter turn and the octant edges where the reduction changes its quarter
    u = np.clip(near + rng.uniform(-0.13, 0.13, 100_000), 0.0, 1.0)
    u = np.concatenate([u, np.nextafter(near, [-1.0, 2.0]).clip(0.0, 1.0), [near]])
    c, s = _cos_sin(u)
    t = 2.0 * np.pi * u
    # numpy takes cos of 2 pi u rounded (up to 4.4e-16 off the turn itself): an absolute
    # allowance for that, and 2 ulp
    for got, want in ((c, np.cos(t)), (s, np.sin(t))):
        err = np.abs(got - want)
        assert np.all(err <= 2 * np.spacing(np.abs(want)) + 1e-15), u[np.argmax(err)]


@njit
def _default_rows(kind, seed, a, b, keys, dim):  # type: ignore[no-untyped-def]
    out = np.empty((keys.shape[0], dim), np.float32)
    for i in range(keys.shape[0]):
        init.default_row(kind, seed, a, b, np.uint64(keys[i]), out, i)
    return out


@pytest.mark.parametrize("dim", [1, 7, 64])
@pytest.mark.parametrize("kind", [1, 2, 3])
def test_default_row_equals_what_fill_writes_serial_and_parallel(rng, kind, dim) -> None:
    # A combine reads a missing key's default through default_row; a pull creates the row
    # through fill_*: the two must agree bit for bit, on the vectorised pairs, the odd last
    # column and the truncated redraws alike, whichever fill driver runs.
    keys = random_keys(rng, 3000)
    seed, a, b = np.uint64(5), 0.25, 1.5
    want = _default_rows(kind, seed, a, b, keys, dim)
    for variant in ("serial", "parallel"):
        out = np.empty((keys.shape[0], dim), np.float32)
        if kind == 1:
            getattr(init, f"_fill_uniform_{variant}")(keys, seed, a, b, out)
        else:
            getattr(init, f"_fill_normal_{variant}")(keys, seed, a, b, kind == 3, out)
        np.testing.assert_array_equal(out, want)
    if kind == 3:
        assert np.abs(want - a).max() <= 2 * b  # the redraws ran and landed within


@pytest.mark.parametrize("mean,std", [(0.0, 1.0), (300.0, 1e-4), (-1.0, 1e-7)])
def test_truncated_normal_redraws_every_element_beyond_two_std(rng, mean, std) -> None:
    # The kernel looks for elements to redraw among the float32 values it wrote; where the
    # mean dwarfs std, rounding moves a value by more than the gap between 2 std and |z| std,
    # and an element that needs its redraw must still get it (as the reference does).
    from evdb.kernels import reference

    keys = random_keys(rng, 3000)
    got = np.empty((keys.shape[0], 64), np.float32)
    want = np.empty_like(got)
    init.fill_normal(keys, np.uint64(3), mean, std, True, got)
    reference.fill_normal(keys, np.uint64(3), mean, std, True, want)
    # bit for bit but for the rare float64 ulp of libm's log/cos against numpy's (about one
    # value in 20 million); a missed redraw changes ~1% of these values
    assert np.count_nonzero(got != want) <= 2
