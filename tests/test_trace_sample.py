"""Fixed-size spatial sampling (evdb.trace_sample): a recorder's min_keys raises its rate until
it has kept that many distinct keys, and a reader drops what was kept before the threshold
fell; a trace's subsample is the trace a lower rate would have recorded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from evdb.errors import InvalidArgumentError
from evdb.trace import KeyRecorder, read_trace, salt_of
from evdb.trace_sample import FULL, SmallestHashes, SmallestHashesReference, key_hashes


def _record(path: Path, batches: list[np.ndarray], **kw: object) -> None:
    with KeyRecorder(path, table="x", **kw) as rec:  # type: ignore[arg-type]
        for i, b in enumerate(batches):
            rec.record("pull", b, i)


def _expected(batches: list[np.ndarray], seed: int, min_keys: int, rate: float) -> int:
    """Brute force: the threshold fixed-size SHARDS ends with over every key seen."""
    h = np.unique(key_hashes(np.concatenate(batches), salt_of(seed)))
    if h.shape[0] < min_keys:
        return FULL
    return max(round(rate * FULL), int(h[min_keys - 1]) + 1)


@pytest.mark.parametrize("seed", [0, 7])
def test_min_keys_keeps_the_smallest_hashes_and_every_access_of_them(
    tmp_path: Path, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    # the key space grows batch by batch, so the threshold falls while recording
    batches = [rng.integers(0, 2_000 * (i + 1), 500).astype(np.int64) for i in range(30)]
    _record(tmp_path / "t", batches, rate=0.01, min_keys=300, seed=seed)
    tr = read_trace(tmp_path / "t")
    threshold = _expected(batches, seed, 300, 0.01)
    assert threshold < FULL // 10  # the rate did fall, and not to the floor
    assert tr.header.rate == threshold / FULL and tr.header.floor_rate == 0.01
    for (_, _, got), b in zip(tr.batches(), batches, strict=True):
        want = b[key_hashes(b, salt_of(seed)) < np.uint64(threshold)]
        np.testing.assert_array_equal(got, want)  # every access of a kept key, in order
    assert np.unique(tr.keys).shape[0] == 300


def test_a_small_key_space_is_recorded_whole(tmp_path: Path) -> None:
    batches = [np.arange(i, i + 400, dtype=np.int64) for i in range(0, 1000, 100)]
    _record(tmp_path / "t", batches, rate=0.01, min_keys=5_000)
    tr = read_trace(tmp_path / "t")
    assert tr.header.rate == 1.0
    np.testing.assert_array_equal(tr.keys, np.concatenate(batches))


def test_the_rate_floor_gives_the_fixed_rate_trace(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    batches = [rng.integers(0, 10**7, 5_000).astype(np.int64) for _ in range(20)]
    _record(tmp_path / "a", batches, rate=0.05, min_keys=100)
    _record(tmp_path / "b", batches, rate=0.05, min_keys=0)
    a, b = read_trace(tmp_path / "a"), read_trace(tmp_path / "b")
    assert a.header.rate == b.header.rate == 0.05  # at the floor: the rate asked for
    np.testing.assert_array_equal(a.keys, b.keys)
    np.testing.assert_array_equal(a.bounds, b.bounds)


def test_an_incomplete_trace_settles_the_same_way(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    batches = [rng.integers(0, 10**6, 300).astype(np.int64) for _ in range(12)]
    _record(tmp_path / "whole", batches, rate=0.01, min_keys=200)
    rec = KeyRecorder(tmp_path / "cut", table="x", rate=0.01, min_keys=200)
    for i, b in enumerate(batches):
        rec.record("pull", b, i)
    rec.flush()  # no end record: as if the process died here
    cut = read_trace(tmp_path / "cut", allow_incomplete=True)
    whole = read_trace(tmp_path / "whole")
    assert not cut.complete and cut.header.rate == whole.header.rate
    np.testing.assert_array_equal(cut.keys, whole.keys)
    rec.close()


@pytest.mark.parametrize("impl", [SmallestHashes, SmallestHashesReference])
@pytest.mark.parametrize("shift", [0, 9])  # 9: every hash in one probe run (collisions)
def test_smallest_hashes_against_a_sort(impl: type, shift: int) -> None:
    rng = np.random.default_rng(5 + shift)
    s = impl(64, floor=1000)
    seen: list[np.ndarray] = []
    for _ in range(60):
        h = rng.integers(0, FULL >> shift, 50, dtype=np.int64).astype(np.uint64) << np.uint64(shift)
        h = np.concatenate([h, h[:5], rng.choice(np.concatenate(seen), 5) if seen else h[:1]])
        kept = h[h < np.uint64(s.threshold)]  # the recorder hands over the kept ones only
        s.add(kept)
        seen.append(h)
        want = np.unique(np.concatenate(seen))[:64]
        got = s.sorted_hashes() if impl is SmallestHashes else s.hashes
        np.testing.assert_array_equal(got, want)
        full = want.shape[0] == 64
        assert s.threshold == (max(1000, int(want[-1]) + 1) if full else FULL)


def test_subsample_equals_recording_at_the_lower_rate(tmp_path: Path) -> None:
    rng = np.random.default_rng(6)
    batches = [rng.integers(0, 10**6, 2_000).astype(np.int64) for _ in range(10)]
    _record(tmp_path / "hi", batches, rate=0.2, min_keys=0, seed=2)
    _record(tmp_path / "lo", batches, rate=0.05, min_keys=0, seed=2)
    hi, lo = read_trace(tmp_path / "hi"), read_trace(tmp_path / "lo")
    sub = hi.subsample(round(0.05 * FULL))
    assert round(sub.header.rate * FULL) == round(lo.header.rate * FULL)
    np.testing.assert_array_equal(sub.keys, lo.keys)
    np.testing.assert_array_equal(sub.bounds, lo.bounds)
    np.testing.assert_array_equal(sub.seen, lo.seen)


def test_for_table_raises_the_rate_to_the_tables_own_size(tmp_path: Path) -> None:
    """A recorder for a table keeps CURRENT_SIZE_ROWS rows' worth of its smaller cache tier
    (with min_keys; a fixed rate stays as asked, and so does an unbounded table's)."""
    import evdb
    from evdb.config import HbmConfig
    from evdb.trace import CURRENT_SIZE_ROWS

    with evdb.open(tmp_path / "db") as db:
        small = db.create_table("small", dim=4, dram_rows=4 * CURRENT_SIZE_ROWS)
        hbm = db.create_table(
            "hbm", dim=4, dram_rows=10**6, hbm=HbmConfig(2 * CURRENT_SIZE_ROWS, device="cpu")
        )
        big = db.create_table("big", dim=4, dram_rows=10**6)
        free = db.create_table("free", dim=4)
        got = {
            name: KeyRecorder.for_table(t, tmp_path / name, rate=0.01, **kw)
            for name, t, kw in [
                ("small", small, {}),
                ("fixed", small, {"min_keys": 0}),
                ("hbm", hbm, {}),
                ("big", big, {}),
                ("free", free, {}),
            ]
        }
        rates = {name: rec.header.keep_rate or rec.header.rate for name, rec in got.items()}
        floors = {rec.header.rate for rec in got.values()}
        for rec in got.values():
            rec.close()
    assert rates == {"small": 0.25, "fixed": 0.01, "hbm": 0.5, "big": 0.01, "free": 0.01}
    assert floors == {0.01}  # the rate asked for stays the floor of the analysis


def test_for_tables_raise_is_not_a_floor_for_larger_sizes(tmp_path: Path) -> None:
    """The keys for_table keeps for the table's own size settle at its keep_rate, not lower,
    while evdb size may still subsample a larger size's miniature down towards the rate
    asked for (a raised rate was the floor: every size replayed all the kept keys)."""
    import evdb
    from evdb.sizing import MINIATURE_ROWS, size_thresholds
    from evdb.trace import CURRENT_SIZE_ROWS

    rows = 4 * CURRENT_SIZE_ROWS  # keep_rate 0.25
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("t", dim=4, dram_rows=rows)
        with KeyRecorder.for_table(t, tmp_path / "t.trace", rate=0.01) as rec:
            for b in range(50):  # 200,000 distinct keys: min_keys alone would fall to ~0.16
                keys = np.arange(b * 4000, (b + 1) * 4000, dtype=np.int64)
                rec.record("pull", keys, b)
    tr = read_trace(tmp_path / "t.trace")
    assert (tr.header.rate, tr.header.floor_rate, tr.header.keep_rate) == (0.25, 0.01, 0.25)
    assert np.unique(tr.keys).shape[0] > 0.24 * 200_000
    own, larger = size_thresholds(tr, [rows, 64 * rows]).tolist()
    assert own == round(0.25 * FULL)  # its own size: every key kept
    assert round(0.01 * FULL) <= larger < own and larger * 64 * rows >= MINIATURE_ROWS * FULL


@pytest.mark.parametrize("keep_rate", [0, 1.5, "0.5", True])
def test_a_bad_keep_rate_is_refused_naming_it(tmp_path: Path, keep_rate: object) -> None:
    with pytest.raises(InvalidArgumentError, match="keep_rate must be None or a number"):
        KeyRecorder(tmp_path / "t.trace", table="t", keep_rate=keep_rate)  # type: ignore[arg-type]
    assert not (tmp_path / "t.trace").exists()  # refused before the file is made


def test_a_key_space_that_stops_growing_is_probed_less_and_settles_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same keys call after call: the smallest hashes are probed on one call in up to
    PROBE_EVERY (each probe that finds nothing new doubles the wait); new keys after that
    lower the threshold within PROBE_EVERY calls; the trace read is the brute force's."""
    from evdb.trace import PROBE_EVERY

    probes: list[int] = []
    add = SmallestHashes.add

    def counting(self: SmallestHashes, hashes: np.ndarray, n: int | None = None) -> int:
        probes.append(calls)
        return add(self, hashes, n)

    monkeypatch.setattr(SmallestHashes, "add", counting)
    rng = np.random.default_rng(4)
    steady = [rng.integers(0, 3_000, 500).astype(np.int64) for _ in range(8)]
    grown = [rng.integers(0, 30_000, 500).astype(np.int64) for _ in range(8)]
    batches = [steady[i % 8] for i in range(400)] + [grown[i % 8] for i in range(200)]
    with KeyRecorder(tmp_path / "t", table="x", rate=0.001, min_keys=200) as rec:
        for calls, b in enumerate(batches):
            rec.record("pull", b, calls)
            if calls == 399:
                before = rec.rate
        after = rec.rate
    steady_probes = [c for c in probes if 100 <= c < 400]
    assert len(steady_probes) <= 300 // PROBE_EVERY + 1  # not one a call
    assert after < before  # the grown key space lowered it
    want = _expected(batches, 0, 200, 0.001)
    assert after * FULL == want  # the recorder's own threshold reached it, not only the reader
    tr = read_trace(tmp_path / "t")
    assert tr.header.rate == want / FULL
    np.testing.assert_array_equal(
        tr.keys, np.concatenate([b[key_hashes(b, salt_of(0)) < np.uint64(want)] for b in batches])
    )
