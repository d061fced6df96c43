"""Initializers: pure functions of (seed, key, column), with the asked distribution."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

import evdb
from evdb.errors import ConfigError
from evdb.initializers import from_dict

MASK = 2**64 - 1
GAMMA = 0x9E3779B97F4A7C15


def mix64(x: int) -> int:
    """splitmix64's finaliser in plain Python ints: the spec the numpy code must follow."""
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & MASK
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def uniform01(seed: int, key: int, col: int, stream: int) -> float:
    salt = mix64((seed + stream * GAMMA) & MASK)
    bits = mix64((mix64((key & MASK) ^ salt) + (col + 1) * GAMMA) & MASK)
    return ((bits >> 11) + 0.5) / 2**53


ALL = [
    evdb.init.Zeros(),
    evdb.init.Ones(),
    evdb.init.Constant(0.25),
    evdb.init.Uniform(-0.5, 0.5, seed=3),
    evdb.init.Normal(0.0, 0.01, seed=1),
    evdb.init.TruncatedNormal(1.0, 2.0, seed=2),
]
KEYS = np.array([0, -1, 1, 2**63 - 1, -(2**63), 123456789], dtype=np.int64)


def test_uniform_follows_the_splitmix_counter_spec() -> None:
    init = evdb.init.Uniform(0.0, 1.0, seed=11)
    got = init.values(KEYS, 4)
    want = [[uniform01(11, k, c, 0) for c in range(4)] for k in KEYS.tolist()]
    np.testing.assert_array_equal(got, np.array(want).astype(np.float32))


def test_normal_is_box_muller_with_both_outputs() -> None:
    init = evdb.init.Normal(2.0, 3.0, seed=5)
    got = init.values(KEYS[:2], 3)
    want = []
    for k in KEYS[:2].tolist():
        row = []
        for c in range(3):
            r = math.sqrt(-2 * math.log(uniform01(5, k, c // 2, 0)))
            t = 2 * math.pi * uniform01(5, k, c // 2, 1)
            row.append(2.0 + 3.0 * r * (math.cos(t) if c % 2 == 0 else math.sin(t)))
        want.append(row)
    np.testing.assert_allclose(got, np.array(want, dtype=np.float32), rtol=1e-6)


def test_columns_of_a_normal_row_are_uncorrelated() -> None:
    # cos and sin of one Box-Muller pair are independent normals; check the pairing did not
    # couple neighbouring columns.
    v = evdb.init.Normal(0.0, 1.0, seed=6).values(np.arange(100_000, dtype=np.int64), 4)
    corr = np.corrcoef(v.T)
    assert np.abs(corr - np.eye(4)).max() < 0.02


@pytest.mark.parametrize("init", ALL, ids=lambda i: type(i).__name__)
def test_values_depend_only_on_the_key_not_on_the_batch(init) -> None:
    whole = init.values(KEYS, 8)
    for i in range(KEYS.shape[0]):
        np.testing.assert_array_equal(init.values(KEYS[i : i + 1], 8)[0], whole[i])
    np.testing.assert_array_equal(init.values(KEYS[::-1], 8), whole[::-1])
    assert whole.dtype == np.float32 and whole.shape == (KEYS.shape[0], 8)


def test_values_are_the_same_in_another_process() -> None:
    init = evdb.init.TruncatedNormal(0.0, 1.0, seed=9)
    code = (
        "import numpy as np, evdb;"
        "v = evdb.init.TruncatedNormal(0.0, 1.0, seed=9).values("
        f"np.array({KEYS.tolist()}, dtype=np.int64), 5);"
        "print(v.tobytes().hex())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == init.values(KEYS, 5).tobytes().hex()


def test_different_keys_seeds_and_columns_differ() -> None:
    init = evdb.init.Normal(0.0, 1.0, seed=0)
    v = init.values(np.arange(1000, dtype=np.int64), 16)
    assert np.unique(v, axis=0).shape[0] == 1000  # no two keys share a vector
    assert (np.diff(np.sort(v, axis=1), axis=1) > 0).mean() > 0.999  # columns are not copies
    other = evdb.init.Normal(0.0, 1.0, seed=1).values(np.arange(1000, dtype=np.int64), 16)
    assert not (v == other).any()


def test_normal_has_the_asked_mean_and_std() -> None:
    mean, std, n = 0.5, 0.01, 200_000
    v = evdb.init.Normal(mean, std, seed=4).values(np.arange(n, dtype=np.int64), 4).reshape(-1)
    se = std / math.sqrt(v.size)
    assert abs(v.mean() - mean) < 5 * se
    assert abs(v.std() - std) < 5 * std / math.sqrt(2 * v.size)
    # and is normal, not just any distribution with those moments: 95.45% within 2 std
    within = np.mean(np.abs(v - mean) < 2 * std)
    assert abs(within - 0.9545) < 0.003


def test_truncated_normal_stays_within_two_std_with_the_truncated_std() -> None:
    v = evdb.init.TruncatedNormal(1.0, 2.0, seed=8).values(np.arange(100_000, dtype=np.int64), 4)
    assert v.min() >= 1.0 - 4.0 and v.max() <= 1.0 + 4.0
    # std of N(0,1) truncated at +-2 is 0.8796
    assert abs(v.std() / 2.0 - 0.8796) < 0.005
    assert abs(v.mean() - 1.0) < 0.02


def test_uniform_covers_its_range() -> None:
    v = evdb.init.Uniform(-1.0, 3.0, seed=2).values(np.arange(50_000, dtype=np.int64), 4)
    assert v.min() >= -1.0 and v.max() < 3.0
    assert abs(v.mean() - 1.0) < 0.03
    counts, _ = np.histogram(v, bins=8, range=(-1.0, 3.0))
    assert counts.min() > 0.95 * v.size / 8


@pytest.mark.parametrize("init", ALL, ids=lambda i: type(i).__name__)
def test_to_dict_round_trips(init) -> None:
    assert from_dict(init.to_dict()) == init


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda: evdb.init.Normal(0.0, 0.0), "std must be > 0"),
        (lambda: evdb.init.Normal(0.0, float("nan")), "std must be a finite number"),
        (lambda: evdb.init.Uniform(1.0, 1.0), "low < high"),
        (lambda: evdb.init.Normal(seed=-1), "seed must be an int"),
        (lambda: from_dict({"kind": "xavier"}), "unknown kind 'xavier'"),
    ],
)
def test_bad_initializer_config_is_rejected(make, message) -> None:
    with pytest.raises(ConfigError, match=message):
        make()
