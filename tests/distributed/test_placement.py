"""Each placement's formula, against a plain-Python reference, and its balance."""

from __future__ import annotations

import numpy as np
import pytest

import evdb
from evdb.distributed import Placement

M64 = (1 << 64) - 1


def fmix64_py(key: int) -> int:
    """murmur3's fmix64 in Python integers (the reference)."""
    h = key & M64
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & M64
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) & M64
    h ^= h >> 33
    return h


def hash_owner_py(key: int, shards: int, buckets: int) -> int:
    bucket = fmix64_py(key) % buckets
    return next(
        r for r in range(shards) if r * buckets // shards <= bucket < (r + 1) * buckets // shards
    )


def div_owner_py(key: int, shards: int, num_ids: int) -> int:
    """TF's div strategy: the first num_ids % shards shards hold one id more."""
    ipp, extras = divmod(num_ids, shards)
    return max(key // (ipp + 1), (key - extras) // ipp)


EDGE = [0, 1, -1, 2**63 - 1, -(2**63), 12345678901234, -987654321]


@pytest.mark.parametrize("shards,buckets", [(1, 1024), (2, 1024), (3, 1000), (7, 64), (8, 8)])
def test_hash_placement_matches_the_formula(shards: int, buckets: int) -> None:
    rng = np.random.default_rng(shards)
    keys = np.concatenate([EDGE, rng.integers(-(2**63), 2**63 - 1, 500, dtype=np.int64)])
    got = Placement("hash", buckets=buckets).owners(keys.astype(np.int64), shards)
    want = [hash_owner_py(int(k), shards, buckets) for k in keys]
    assert got.tolist() == want


@pytest.mark.parametrize("shards", [1, 2, 3, 5])
def test_mod_placement_uses_pythons_sign_convention(shards: int) -> None:
    keys = np.array(EDGE + list(range(-20, 20)), dtype=np.int64)
    assert Placement("mod").owners(keys, shards).tolist() == [int(k) % shards for k in keys]


@pytest.mark.parametrize("num_ids,shards", [(10, 3), (11, 3), (12, 4), (7, 7), (100, 6)])
def test_div_placement_matches_tfs_formula(num_ids: int, shards: int) -> None:
    keys = np.arange(num_ids, dtype=np.int64)
    got = Placement("div", num_ids=num_ids).owners(keys, shards)
    assert got.tolist() == [div_owner_py(k, shards, num_ids) for k in range(num_ids)]
    assert (np.diff(got) >= 0).all()  # contiguous ranges
    sizes = np.bincount(got, minlength=shards)
    assert sizes.max() - sizes.min() <= 1


def test_div_placement_names_the_first_key_outside_its_id_space() -> None:
    with pytest.raises(evdb.InvalidArgumentError, match=r"keys\[2\] = 10 is outside .* \[0, 10\)"):
        Placement("div", num_ids=10).owners(np.array([0, 9, 10, -1]), 3)


@pytest.mark.parametrize(
    "ids",
    [
        np.arange(200_000),  # sequential
        np.arange(200_000) * 8,  # strided
        np.arange(200_000) * 1024,  # strided by the bucket count
        10**12 + np.arange(200_000),  # clustered far from 0
    ],
    ids=["sequential", "stride8", "stride1024", "clustered"],
)
def test_hash_placement_stays_even_where_mod_piles_up(ids: np.ndarray) -> None:
    counts = np.bincount(Placement("hash").owners(ids, 8), minlength=8)
    assert counts.max() / counts.mean() < 1.05
    if (ids[1] - ids[0]) % 8 == 0:
        mod = np.bincount(Placement("mod").owners(ids, 8), minlength=8)
        assert mod.max() / mod.mean() == 8.0  # everything on shard 0: what "mod" does


def test_a_new_world_size_moves_whole_buckets() -> None:
    p = Placement("hash", buckets=1024)
    keys = np.arange(50_000, dtype=np.int64)
    buckets = p.buckets_of(keys)
    for shards in (2, 3, 5, 8):
        owners = p.owners(keys, shards)
        per_bucket = {}
        for b, o in zip(buckets.tolist(), owners.tolist(), strict=True):
            assert per_bucket.setdefault(b, o) == o  # one owner per bucket


def test_bad_placements_are_refused() -> None:
    with pytest.raises(evdb.ConfigError, match="placement must be one of"):
        Placement("range")  # type: ignore[arg-type]
    with pytest.raises(evdb.ConfigError, match="num_ids"):
        Placement("div")
    with pytest.raises(evdb.ConfigError, match="buckets must be an int >= 1"):
        Placement("hash", buckets=0)
    with pytest.raises(evdb.ConfigError, match="4 hash buckets cannot be spread over 8"):
        Placement("hash", buckets=4).owners(np.arange(3), 8)
