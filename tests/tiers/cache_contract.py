"""``CacheContract``: every test a tier in the cache role (``evdb.tiers.base.CacheTier``) must
pass, written once, against a plain-numpy model of what each operation means. Each
implementation's file subclasses it and provides the ``cache`` fixture (a tier holding
``DIM`` values and ``SLOTS`` slots, unbounded unless a test asks for capacity)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from evdb.bags import parse_bags
from evdb.optim import SGD
from evdb.records import FIELDS, FREQ_MAX, FROZEN, RecordBatch
from evdb.tiers.base import CacheTier
from tests.tiers.contract import DIM, TierContract, assert_same, records

Factory = Callable[..., CacheTier]  # make(capacity_rows=None) -> an empty cache tier


def filled(cache: CacheTier, n: int, seed: int = 0) -> tuple[np.ndarray, RecordBatch, np.ndarray]:
    keys = np.random.default_rng(seed).permutation(np.arange(n, dtype=np.int64) * 7 - 300)
    recs = records(n, seed)
    recs.last_step[:] = np.arange(n)  # step i: a floor of m keeps the last n - m live
    recs.freq[:] = np.minimum(recs.freq, FREQ_MAX - 10)
    rows = cache.insert(keys, recs)
    return keys, recs, rows


class CacheContract(TierContract):
    """The cache role, on top of the ``Tier`` contract (``cache`` is the ``tier`` too)."""

    @pytest.fixture
    def tier(self, cache: CacheTier) -> CacheTier:
        return cache

    def test_insert_locate_read_every_field(self, cache: CacheTier) -> None:
        keys, recs, rows = filled(cache, 40)
        np.testing.assert_array_equal(cache.locate(keys), rows)
        assert (cache.locate(np.array([10**12], np.int64)) == -1).all()
        assert_same(cache.read(rows[::-1]), recs.take(np.arange(40)[::-1]))
        np.testing.assert_array_equal(cache.keys_of(rows), keys)
        np.testing.assert_array_equal(cache.last_steps(rows), recs.last_step)
        assert sorted(cache.live_rows().tolist()) == sorted(rows.tolist())

    def test_lookup_gathers_live_rows_and_reports_misses(self, cache: CacheTier) -> None:
        keys, recs, rows = filled(cache, 50)
        probe = np.concatenate([keys, np.array([10**12, -(10**12)], np.int64)])
        out = np.full((probe.shape[0], DIM), 7.0, np.float32)
        out_rows = np.empty(probe.shape[0], np.int64)
        floor = 20  # rows stamped at steps 0..19 have expired
        missing = cache.lookup(probe, floor, out, out_rows)
        live = np.concatenate([recs.last_step >= floor, [False, False]])
        assert missing == int((~live).sum())
        np.testing.assert_array_equal(out[live], np.concatenate([recs.values])[live[:50]])
        np.testing.assert_array_equal(out_rows[live], rows[live[:50]])
        assert (out_rows[~live] == -1).all()

    @pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
    def test_lookup_bags_combines_with_defaults(self, cache: CacheTier, combiner: str) -> None:
        keys, recs, _ = filled(cache, 30, seed=3)
        rng = np.random.default_rng(1)
        probe = np.concatenate([rng.choice(keys, 40), np.array([10**12], np.int64)])
        offsets = np.array([0, 5, 5, 17, 30], np.int64)
        weights = rng.random(probe.shape[0]).astype(np.float32)
        bags = parse_bags(probe.shape[0], offsets, weights, combiner, 2.0)
        out = np.empty((bags.n_bags, DIM), np.float32)
        cache.lookup_bags(probe, bags, 10, (0, 0, 0.5, 0.0), out)  # default: constant 0.5
        by_key = dict(zip(keys.tolist(), range(30), strict=True))
        expect = np.zeros((bags.n_bags, DIM))
        for b in range(bags.n_bags):
            lo, hi = bags.bounds[b], bags.bounds[b + 1]
            acc, wsum, w2 = np.zeros(DIM), 0.0, 0.0
            for i in range(lo, hi):
                j = by_key.get(int(probe[i]))
                live = j is not None and recs.last_step[j] >= 10
                row = recs.values[j].astype(np.float64) if live else np.full(DIM, 0.5)
                norm = np.linalg.norm(row)
                if norm > 2.0:
                    row = row * (2.0 / norm)
                acc += weights[i] * row
                wsum += weights[i]
                w2 += weights[i] ** 2
            if combiner == "mean" and wsum > 0:
                acc /= wsum
            elif combiner == "sqrtn" and w2 > 0:
                acc /= np.sqrt(w2)
            expect[b] = acc
        np.testing.assert_allclose(out, expect, rtol=1e-5, atol=1e-5)

    def test_pull_rows_stamps_pins_and_gathers(self, cache: CacheTier) -> None:
        _keys, recs, rows = filled(cache, 20)
        pick = np.array([rows[3], -1, rows[7], rows[0]], np.int64)
        counts = np.array([2, 5, 1, 4], np.int64)
        out = np.zeros((4, DIM), np.float32)
        assert cache.pull_rows(pick, counts, 99, 1234, out) == 3
        got = cache.read(pick[pick >= 0])
        np.testing.assert_array_equal(got.freq, recs.freq[[3, 7, 0]] + np.array([2, 1, 4]))
        assert (got.last_step == 99).all() and (got.version == 1234).all()
        np.testing.assert_array_equal(out[[0, 2, 3]], recs.values[[3, 7, 0]])
        assert cache.dirty(pick[pick >= 0]).all()
        assert cache.pinned(pick[pick >= 0]).all() and not cache.pinned(rows[[1, 2]]).any()
        cache.unpin_all()
        assert not cache.pinned(rows).any()

    def test_pull_rows_saturates_freq(self, cache: CacheTier) -> None:
        recs = records(1)
        recs.freq[:] = FREQ_MAX - 1
        rows = cache.insert(np.array([5], np.int64), recs)
        cache.pull_rows(rows, np.array([9], np.int64), 1, 1, np.empty((1, DIM), np.float32))
        assert cache.read(rows).freq[0] == FREQ_MAX

    def test_apply_updates_rows_in_place_and_leaves_frozen_ones(self, cache: CacheTier) -> None:
        _keys, recs, rows = filled(cache, 6)
        cache.assign(rows, recs.values, 0, 0, False)  # none frozen
        cache.assign(rows[[2]], recs.values[[2]], 0, 0, True)  # but row 2
        pick = np.array([rows[0], rows[2], -1, rows[5]], np.int64)
        grads = np.random.default_rng(2).standard_normal((5, DIM)).astype(np.float32)
        positions = np.array([0, 4, 1, 2, 3], np.int64)
        bounds = np.array([0, 2, 3, 4, 5], np.int64)  # row 0 sums grads 0 and 4
        sgd = SGD(lr=0.5)
        dropped, frozen = cache.apply(
            pick, grads, positions, bounds, sgd.code, sgd.hyper(7, 1), 7, 77
        )
        assert (dropped, frozen) == (1, 1)
        got = cache.read(rows)
        np.testing.assert_allclose(
            got.values[0], recs.values[0] - 0.5 * (grads[0] + grads[4]), rtol=1e-6
        )
        np.testing.assert_allclose(got.values[5], recs.values[5] - 0.5 * grads[3], rtol=1e-6)
        np.testing.assert_array_equal(got.values[[1, 2, 3, 4]], recs.values[[1, 2, 3, 4]])
        assert got.flags[2] == FROZEN
        assert got.version[[0, 5]].tolist() == [77, 77] and got.last_step[[0, 5]].tolist() == [7, 7]

    def test_assign_sets_values_and_flags(self, cache: CacheTier) -> None:
        _keys, recs, rows = filled(cache, 4)
        v = np.ones((2, DIM), np.float32)
        cache.mark_written(rows, recs.last_step)  # clean
        cache.assign(rows[:2], v, 50, 60, True)
        got = cache.read(rows)
        np.testing.assert_array_equal(got.values[:2], v)
        assert got.last_step[:2].tolist() == [50, 50] and got.version[:2].tolist() == [60, 60]
        assert got.flags[:2].tolist() == [FROZEN, FROZEN]
        assert cache.dirty(rows).tolist() == [True, True, False, False]
        cache.assign(rows[:1], v[:1], 51, 61, None)
        assert cache.read(rows[:1]).flags[0] == FROZEN  # None keeps the flag
        cache.assign(rows[:1], v[:1], 52, 62, False)
        assert cache.read(rows[:1]).flags[0] == 0

    def test_remove_rows_frees_them(self, cache: CacheTier) -> None:
        keys, _, rows = filled(cache, 10)
        frees = cache.frees
        cache.remove_rows(rows[[1, 4]])
        assert cache.frees > frees and len(cache) == 8
        assert (cache.locate(keys[[1, 4]]) == -1).all()

    def test_victims_spare_pinned_and_protected_rows(self, make: Factory) -> None:
        cache = make(capacity_rows=10)
        keys = np.arange(20, dtype=np.int64)
        recs = records(20)
        recs.freq[:] = np.arange(20)  # LFU: the low keys go first
        recs.last_step[:] = 5
        rows = cache.insert(keys, recs)
        cache.pin(rows[[0]])
        victims, expired = cache.choose_victims(5, 0, protect=rows[[1]])
        assert len(cache) - victims.shape[0] <= 10
        assert rows[0] not in victims and rows[1] not in victims
        assert not expired.any()
        assert set(cache.keys_of(victims).tolist()) <= set(range(2, 20))

    def test_victims_take_expired_rows_first(self, make: Factory) -> None:
        cache = make(capacity_rows=10)
        recs = records(12)
        recs.last_step[:] = [0, 0] + [100] * 10
        recs.freq[:] = 10**6
        rows = cache.insert(np.arange(12, dtype=np.int64), recs)
        victims, expired = cache.choose_victims(100, 50)
        assert set(rows[:2].tolist()) <= set(victims.tolist())
        np.testing.assert_array_equal(expired, np.isin(victims, rows[:2]))

    def test_chain_bookkeeping(self, cache: CacheTier) -> None:
        _keys, recs, rows = filled(cache, 10)
        assert sorted(cache.dirty_rows().tolist()) == sorted(rows.tolist())
        cache.mark_written(rows[:6], recs.last_step[:6])
        assert sorted(cache.dirty_rows().tolist()) == sorted(rows[6:].tolist())
        has, step = cache.copies_below(rows)
        assert has.tolist() == [True] * 6 + [False] * 4
        np.testing.assert_array_equal(step[:6], recs.last_step[:6])
        assert cache.shadowed_count() == 6 and cache.shadowed_count(min_live_step=3) == 3
        assert cache.live_count(0) == 10 and cache.live_count(7) == 3
        cache.mark_dirty(rows[:1])
        assert cache.dirty(rows[:1]).all()
        assert cache.eviction_counts() == (0, 0)
        cache.count_evictions(np.array([True, False, False]))
        assert cache.eviction_counts() == (2, 1)

    def test_doomed_rows_by_ttl_and_l2(self, cache: CacheTier) -> None:
        _keys, recs, rows = filled(cache, 20)
        norms = np.linalg.norm(recs.values, axis=1)
        threshold = float(np.median(norms))
        doomed, n_expired = cache.doomed(5, threshold)
        expect = (recs.last_step < 5) | (norms < threshold)
        assert sorted(doomed.tolist()) == sorted(rows[expect].tolist())
        assert n_expired == 5

    def test_live_blocks_yield_each_live_row_once(self, cache: CacheTier) -> None:
        keys, recs, rows = filled(cache, 100)
        cache.remove_rows(rows[:10])
        seen_keys, seen_values = [], []
        for values, block_keys in cache.live_blocks(30, 16):
            seen_keys.append(np.array(block_keys))
            seen_values.append(np.array(values))
        got_keys = np.concatenate(seen_keys)
        live = np.arange(100) >= 30
        assert sorted(got_keys.tolist()) == sorted(keys[live].tolist())
        order = {k: i for i, k in enumerate(keys.tolist())}
        np.testing.assert_array_equal(
            np.concatenate(seen_values), recs.values[[order[k] for k in got_keys.tolist()]]
        )

    def test_every_record_field_survives_write(self, cache: CacheTier) -> None:
        _keys, _recs, rows = filled(cache, 8)
        other = records(8, seed=11)
        cache.write(rows, other)
        got = cache.read(rows)
        for name in FIELDS:
            np.testing.assert_array_equal(getattr(got, name), getattr(other, name), err_msg=name)
