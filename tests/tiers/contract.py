"""``TierContract``: every test a tier must pass, written once; each tier's file subclasses it
and provides the ``tier`` fixture (zarr-python's ``StoreTests`` pattern)."""

from __future__ import annotations

import numpy as np

from evdb.records import FIELDS, RecordBatch
from evdb.tiers.base import Tier

DIM, SLOTS = 5, 2


def records(n: int, seed: int = 0) -> RecordBatch:
    rng = np.random.default_rng(seed)
    return RecordBatch(
        values=rng.standard_normal((n, DIM)).astype(np.float32),
        slots=rng.standard_normal((n, SLOTS)).astype(np.float32),
        freq=rng.integers(0, 2**32, n, dtype=np.uint32),
        last_step=rng.integers(-(2**40), 2**40, n),
        version=rng.integers(0, 2**63, n).astype(np.uint64),
        flags=rng.integers(0, 2, n).astype(np.uint8),
    )


def assert_same(a: RecordBatch, b: RecordBatch) -> None:
    """Every field of a record, flags included (a tier that drops one fails)."""
    for name in FIELDS:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


class TierContract:
    def test_capabilities_are_declared(self, tier: Tier) -> None:
        assert isinstance(tier.persistent, bool)
        assert isinstance(tier.device, str)

    def test_put_then_get_returns_every_field(self, tier: Tier) -> None:
        keys = np.array([0, -1, 2**63 - 1, -(2**63), 42], dtype=np.int64)
        recs = records(5)
        tier.put(keys, recs)
        assert len(tier) == 5
        found, got = tier.get(keys[::-1])
        assert found.all()
        assert_same(
            got,
            RecordBatch(*(getattr(recs, f)[::-1] for f in FIELDS)),
        )

    def test_get_reports_missing_keys(self, tier: Tier) -> None:
        tier.put(np.array([1, 2], np.int64), records(2))
        found, got = tier.get(np.array([3, 2, 4], np.int64))
        assert found.tolist() == [False, True, False]
        assert len(got) == 1

    def test_put_overwrites(self, tier: Tier) -> None:
        keys = np.array([7, 8], np.int64)
        tier.put(keys, records(2, seed=1))
        tier.put(np.array([8, 9], np.int64), records(2, seed=2))
        assert len(tier) == 3
        _, got = tier.get(np.array([8], np.int64))
        np.testing.assert_array_equal(got.values[0], records(2, seed=2).values[0])

    def test_remove_and_reuse(self, tier: Tier) -> None:
        keys = np.arange(100, dtype=np.int64)
        tier.put(keys, records(100))
        gone = tier.remove(np.array([5, 5000, 7], np.int64))
        assert gone.tolist() == [True, False, True]
        assert len(tier) == 98
        found, _ = tier.get(keys)
        assert (~found).nonzero()[0].tolist() == [5, 7]
        tier.put(np.array([1000, 1001], np.int64), records(2, seed=9))
        assert len(tier) == 100
        found, _ = tier.get(keys)
        assert found.sum() == 98

    def test_scan_visits_every_row_once(self, tier: Tier) -> None:
        keys = np.arange(-500, 500, dtype=np.int64) * 3
        recs = records(1000)
        tier.put(keys, recs)
        tier.remove(keys[:10])
        seen_keys, seen_vals = [], []
        for k, r in tier.scan(chunk_rows=77):
            assert k.shape[0] <= 77
            seen_keys.append(k)
            seen_vals.append(r.values)
        all_keys = np.concatenate(seen_keys)
        assert sorted(all_keys.tolist()) == sorted(keys[10:].tolist())
        order = np.argsort(all_keys)
        np.testing.assert_array_equal(
            np.concatenate(seen_vals)[order], recs.values[10:][np.argsort(keys[10:])]
        )

    def test_scan_survives_removal_between_chunks(self, tier: Tier) -> None:
        """compact removes rows while it scans: every row is still seen once, and a row
        removed before its chunk is not seen at all."""
        keys = np.arange(300, dtype=np.int64) * 7 - 1000
        tier.put(keys, records(300))
        seen = []
        for part, recs in tier.scan(chunk_rows=13):
            assert part.shape[0] == len(recs)
            seen.append(part)
            tier.remove(part[::2])
            later = np.setdiff1d(keys, np.concatenate(seen))[:3]  # not yet yielded
            tier.remove(later)
            seen.append(later)  # counted as seen: they must not come up again
        got = np.concatenate(seen)
        assert sorted(got.tolist()) == sorted(keys.tolist())  # each key exactly once

    def test_stats_have_rows_capacity_bytes_evictions(self, tier: Tier) -> None:
        tier.put(np.arange(10, dtype=np.int64), records(10))
        s = tier.stats()
        assert s["rows"] == 10
        assert {"capacity", "bytes", "evictions"} <= s.keys()
