"""The RocksDB tier's key filter: the blocked Bloom kernels against their numpy reference,
no false negatives, its false-positive rate, and states saved before (format 1) still load."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evdb.errors import CorruptDataError
from evdb.kernels import backend
from evdb.kernels.cpu import bloom as cpu_bloom
from evdb.kernels.reference import bloom as ref_bloom
from evdb.tiers.keyfilter import FORMAT, KeyFilter, blocks_for

ref = backend("reference")


def random_keys(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64, endpoint=True)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_blocked_kernels_equal_the_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 200, rng.integers(1, 5)).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    seeds = rng.integers(0, 2**64 - 1, sizes.shape[0], dtype=np.uint64, endpoint=True)
    mine = np.zeros((int(sizes.sum()), ref_bloom.BLOCK_WORDS), dtype=np.uint64)
    spec = mine.copy()
    added = []
    for s in range(sizes.shape[0]):
        keys = random_keys(rng, int(rng.integers(0, 40 * sizes[s])))
        keys[: keys.shape[0] // 4] = rng.integers(-5, 5, keys.shape[0] // 4)  # repeats, 0, -1
        added.append(keys)
        cpu_bloom.blocked_bloom_add(mine, int(starts[s]), int(sizes[s]), keys, seeds[s])
        ref_bloom.blocked_bloom_add(spec, int(starts[s]), int(sizes[s]), keys, int(seeds[s]))
    np.testing.assert_array_equal(mine, spec)
    asked = np.concatenate([random_keys(rng, 3000), *added])
    rng.shuffle(asked)
    got, want = np.empty(asked.shape[0], bool), np.ones(asked.shape[0], bool)
    cpu_bloom.blocked_bloom_query(mine, starts, sizes, seeds, asked, got)
    ref_bloom.blocked_bloom_query(spec, starts, sizes, seeds, asked, want)
    np.testing.assert_array_equal(got, want)
    assert got[np.isin(asked, np.concatenate(added))].all()  # no false negatives
    assert not want.all()  # some keys were ruled out, so the comparison says something


def test_a_query_shorter_than_the_prefetch_distance_and_no_stages() -> None:
    blocks = np.zeros((3, ref_bloom.BLOCK_WORDS), dtype=np.uint64)
    starts, sizes = np.array([0], np.int64), np.array([3], np.int64)
    seeds = np.array([7], np.uint64)
    cpu_bloom.blocked_bloom_add(blocks, 0, 3, np.array([5, 9], np.int64), np.uint64(7))
    out = np.zeros(3, dtype=bool)
    cpu_bloom.blocked_bloom_query(blocks, starts, sizes, seeds, np.array([5, 9, 5], np.int64), out)
    assert out.all()
    none = np.ones(4, dtype=bool)
    empty = np.array([], np.int64)
    cpu_bloom.blocked_bloom_query(blocks, empty, empty, empty.view(np.uint64), np.arange(4), none)
    assert not none.any()


def test_stage_size_meets_its_error_rate() -> None:
    rng = np.random.default_rng(5)
    for capacity, error in [(20_000, 0.005), (20_000, 0.00125)]:
        size = blocks_for(capacity, error)
        blocks = np.zeros((size, ref_bloom.BLOCK_WORDS), dtype=np.uint64)
        cpu_bloom.blocked_bloom_add(blocks, 0, size, random_keys(rng, capacity), np.uint64(3))
        out = np.empty(400_000, dtype=bool)
        one = np.array([0], np.int64)
        others = random_keys(rng, 400_000)
        cpu_bloom.blocked_bloom_query(
            blocks, one, one + size, np.array([3], np.uint64), others, out
        )
        assert out.mean() < 1.15 * error  # (sampling error of 400,000 draws: a few percent)
        assert size * 512 < 1.25 * capacity * -math.log(error) / math.log(2) ** 2  # vs classic


def test_key_filter_grows_without_false_negatives_and_round_trips() -> None:
    f = KeyFilter()
    rng = np.random.default_rng(3)
    added = random_keys(rng, 300_000)
    for chunk in np.array_split(added, 7):
        f.add(chunk)
    assert len(f.stages) == 3  # 65,536 + 131,072 + 262,144 keys
    assert f.may_contain(added).all()
    others = random_keys(rng, 200_000)
    assert f.may_contain(others).mean() < 0.01
    assert f.nbytes < 3 * added.shape[0]  # under 3 bytes per key, the last stage half full
    g = KeyFilter()
    g.load_arrays(f.to_arrays())
    np.testing.assert_array_equal(g.may_contain(others), f.may_contain(others))
    assert g.may_contain(added).all()
    g.add(others[:10])
    assert g.may_contain(others[:10]).all()


def format_1_state(keys: np.ndarray, capacity: int, error: float) -> dict[str, np.ndarray]:
    """What the classic filter saved (git e7ced65's keyfilter): one stage holding keys."""
    words = (math.ceil(-capacity * math.log(error) / math.log(2) ** 2) + 63) // 64
    bits = np.zeros(words, dtype=np.uint64)
    ref.bloom_add(bits, keys, max(1, round(-math.log2(error))), 0x9E3779B97F4A7C15)
    return {
        "shape": np.array([[capacity, keys.shape[0], words]], dtype=np.int64),
        "error": np.array([error]),
        "bits0": bits,
    }


def test_a_state_saved_by_the_classic_filter_still_loads() -> None:
    rng = np.random.default_rng(4)
    old_keys, new_keys, others = (
        random_keys(rng, 5000),
        random_keys(rng, 5000),
        random_keys(rng, 50_000),
    )
    f = KeyFilter()
    f.load_arrays(format_1_state(old_keys, 1 << 16, 0.005))
    assert f.may_contain(old_keys).all()
    assert f.may_contain(others).mean() < 0.01
    f.add(new_keys)
    assert f.may_contain(np.concatenate([old_keys, new_keys])).all()
    saved = f.to_arrays()
    assert int(saved["format"][0]) == FORMAT and "classic_bits0" in saved
    g = KeyFilter()
    g.load_arrays(saved)
    np.testing.assert_array_equal(g.may_contain(others), f.may_contain(others))
    assert g.may_contain(old_keys).all() and g.may_contain(new_keys).all()


def test_a_damaged_state_is_refused_by_name() -> None:
    f = KeyFilter()
    f.add(np.arange(10, dtype=np.int64))
    saved = f.to_arrays()
    short = dict(saved, blocks=saved["blocks"][:-8])
    with pytest.raises(CorruptDataError, match="words saved"):
        KeyFilter().load_arrays(short)
    with pytest.raises(CorruptDataError, match="format 3"):
        KeyFilter().load_arrays(dict(saved, format=np.array([3])))
    old = format_1_state(np.arange(10, dtype=np.int64), 1 << 16, 0.005)
    with pytest.raises(CorruptDataError, match="stage 0"):
        KeyFilter().load_arrays(dict(old, bits0=old["bits0"][:-1]))
