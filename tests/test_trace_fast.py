"""A pull's keys recorded in its dedup pass (``unique_sampled``, ``Deduper.unique_sampled``,
``KeyRecorder.record_kept``): the same dedup as ``unique_inverse``, the same kept keys as
``sample_keys``, and byte for byte the trace file ``KeyRecorder.record`` writes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import evdb
from evdb.dedup import Deduper
from evdb.kernels import backend, reference
from evdb.sizing_kernels import sample_keys_reference, sample_threshold
from evdb.table import DEDUP_FIRST_KEYS
from evdb.trace import KeyRecorder, salt_of
from evdb.trace_sample import FULL, key_hashes


def _batch(rng: np.random.Generator, n: int) -> np.ndarray:
    """n keys, few or many repeats, some near the int64 edges."""
    space = int(rng.choice([3, 50, 10**4, 2**62]))
    keys = rng.integers(-space, space, n, dtype=np.int64)
    if n:
        keys[rng.integers(0, n, 2)] = [np.iinfo(np.int64).min, np.iinfo(np.int64).max]
    return keys


@pytest.mark.parametrize("seed", range(6))
def test_unique_sampled_matches_its_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    salt = salt_of(seed * 7919)
    for n in (0, 1, 2, 17, int(rng.integers(100, 3000))):
        keys = _batch(rng, n)
        for threshold in (0, 1, sample_threshold(0.01), sample_threshold(0.4), FULL):
            scratch = np.full((max(16, 1 << (2 * n).bit_length()), 2), -1, np.int64)
            outs = [np.empty(n, np.int64) for _ in range(4)] + [np.empty(n, np.uint64)]
            args = (keys, np.uint64(salt), np.uint64(threshold), scratch)
            u, k, m = backend("cpu").unique_sampled(*args, *outs)
            want = [np.empty(n, np.int64) for _ in range(4)] + [np.empty(n, np.uint64)]
            assert reference.unique_sampled(*args, *want) == (u, k, m)
            uniq, inverse, counts, kept, hashes = (
                want[0][:u], want[1], want[2][:u], want[3][:k], want[4][:m]
            )  # fmt: skip
            np.testing.assert_array_equal(outs[0][:u], uniq)
            np.testing.assert_array_equal(outs[1], inverse)
            np.testing.assert_array_equal(outs[2][:u], counts)
            np.testing.assert_array_equal(outs[3][:k], kept)
            np.testing.assert_array_equal(outs[4][:m], hashes)
            assert (scratch[:, 1] == -1).all()  # left empty for the next call
            # the reference is the dedup kernels' and the sampling kernel's specification
            ref = [np.empty(n, np.int64), np.empty(n, np.int64), np.zeros(n, np.int64)]
            assert reference.unique_inverse(keys, scratch, *ref) == u
            np.testing.assert_array_equal(ref[0][:u], uniq)
            np.testing.assert_array_equal(ref[1], inverse)
            np.testing.assert_array_equal(kept, sample_keys_reference(keys, salt, threshold))
            h = key_hashes(uniq, salt)
            np.testing.assert_array_equal(hashes, h[h < np.uint64(threshold)])


def test_deduper_unique_sampled_is_unique_plus_the_kept_keys() -> None:
    rng = np.random.default_rng(4)
    d, plain = Deduper(), Deduper()
    salt, threshold = salt_of(3), sample_threshold(0.3)
    for n in (5, 3000, 40, 0, 2500):  # the scratch grows, then serves smaller batches
        keys = _batch(rng, n)
        uniq, inverse, counts, kept, hashes = d.unique_sampled(
            keys, np.uint64(salt), np.uint64(threshold)
        )
        want = plain.unique(keys, keep=True)
        for got, exp in zip((uniq, inverse, counts), want, strict=True):
            np.testing.assert_array_equal(got, exp)
        np.testing.assert_array_equal(kept, sample_keys_reference(keys, salt, threshold))
        assert hashes.shape[0] == np.count_nonzero(key_hashes(uniq, salt) < np.uint64(threshold))


def _file_pair(tmp_path: Path, batches: list[np.ndarray], **kw: object) -> tuple[bytes, bytes]:
    """The trace files of ``record`` and of ``Deduper.unique_sampled`` + ``record_kept``."""
    d = Deduper()
    plain = KeyRecorder(tmp_path / "plain", table="x", **kw)  # type: ignore[arg-type]
    fast = KeyRecorder(tmp_path / "fast", table="x", **kw)  # type: ignore[arg-type]
    with plain, fast:
        for i, b in enumerate(batches):
            uniq, _, _, kept, hashes = d.unique_sampled(b, *fast.sampling)
            fast.record_kept("pull", kept, hashes, b.shape[0], i, uniq.shape[0])
            plain.record("pull", b, i, counted=np.unique(b).shape[0])
            assert fast.rate == plain.rate  # the threshold falls call by call alike
    return (tmp_path / "plain").read_bytes(), (tmp_path / "fast").read_bytes()


@pytest.mark.parametrize(
    "kw",
    [
        {"rate": 0.01, "min_keys": 0},
        {"rate": 0.2, "min_keys": 0, "seed": 5},
        {"rate": 1.0, "min_keys": 0},
        {"rate": 0.01, "min_keys": 300},  # the threshold falls, with probes backing off
        {"rate": 0.01, "min_keys": 300, "keep_rate": 0.3, "seed": 2**63 + 1},
        {"rate": 0.05, "min_keys": 10**6},  # never falls: every key kept
    ],
)
def test_the_fast_path_writes_the_plain_paths_bytes(tmp_path: Path, kw: dict) -> None:
    rng = np.random.default_rng(len(str(kw)))
    batches = []
    for i in range(120):  # a key space that grows, then stays (probes back off), empty calls
        n = 0 if i % 17 == 5 else int(rng.integers(1, 700))
        space = 500 * (1 + min(i, 40))
        batches.append(rng.zipf(1.2, n).astype(np.int64) % space * 7919 - space)
    plain, fast = _file_pair(tmp_path, batches, **kw)
    assert len(plain) > 200 and plain == fast


def test_a_pull_records_the_trace_record_would(tmp_path: Path) -> None:
    """Table.pull with a recorder attached (small batches in the dedup pass, a big one by
    ``record``) writes the file a second recorder fed the same keys by hand writes."""
    rng = np.random.default_rng(8)
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("item", dim=2, dram_rows=4000)
        kw = dict(rate=0.05, min_keys=400, seed=3)
        auto = KeyRecorder.for_table(t, tmp_path / "auto", **kw)  # type: ignore[arg-type]
        hand = KeyRecorder.for_table(t, tmp_path / "hand", **kw)  # type: ignore[arg-type]
        t.trace(auto)
        for i in range(40):
            n = DEDUP_FIRST_KEYS + 5 if i == 20 else int(rng.integers(0, 600))
            keys = rng.zipf(1.3, n).astype(np.int64) % (300 * (i + 1))
            p = t.pull(keys)
            hand.record("pull", keys, db.step, counted=p.keys.shape[0])
            t.push(p, np.zeros((p.keys.shape[0], 2), dtype=np.float32))
            db.advance()
        t.trace(None)
        auto.close()
        hand.close()
        assert auto.batches == 40
    assert (tmp_path / "auto").read_bytes() == (tmp_path / "hand").read_bytes()
