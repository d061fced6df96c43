"""Key traces (evdb.trace): spatial sampling, the file format, and its refusals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import evdb
from evdb.sizing_kernels import (
    sample_into,
    sample_keys,
    sample_keys_reference,
    sample_sparse_into,
    sample_threshold,
)
from evdb.sizing_logs import open_trace, read_key_log
from evdb.trace import KeyRecorder, read_trace


@pytest.fixture
def db(tmp_path: Path):  # type: ignore[no-untyped-def]
    with evdb.open(tmp_path / "db") as d:
        yield d


def record_training(
    db: evdb.Database, table: evdb.Table, rec: KeyRecorder, steps: int, seed: int = 0
) -> None:
    """What Table.pull and Table.lookup will do with a recorder attached, done by hand."""
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        keys = rng.zipf(1.2, 512).astype(np.int64)
        rec.record("pull", keys, db.step)
        p = table.pull(keys)
        table.push(p, np.zeros((p.keys.shape[0], table.dim), dtype=np.float32))
        look = rng.integers(0, 100, 16).astype(np.int64)
        rec.record("lookup", look, db.step)
        table.lookup(look)
        db.advance()


@pytest.mark.parametrize("seed", [0, 1, 2**63 + 5])
def test_sampling_kernel_matches_reference(seed: int) -> None:
    rng = np.random.default_rng(seed % 2**32)
    keys = np.concatenate(
        [
            rng.integers(-(2**63), 2**63 - 1, 20_000, dtype=np.int64),
            np.array([0, -1, 2**63 - 1, -(2**63)], dtype=np.int64),
        ]
    )
    for rate in (1e-4, 0.01, 0.5, 1.0):
        t = sample_threshold(rate)
        np.testing.assert_array_equal(
            sample_keys(keys, seed, t), sample_keys_reference(keys, seed, t)
        )
    for rate in (1e-4, 0.01, 0.03):  # both kernels, at rates either would take
        t = sample_threshold(rate)
        dense, sparse = np.empty_like(keys), np.empty_like(keys)
        n = sample_into(keys, np.uint64(seed), np.uint64(t), dense)
        scratch = np.empty(keys.shape[0], dtype=np.uint64)
        m = sample_sparse_into(keys, np.uint64(seed), np.uint64(t), sparse, scratch)
        np.testing.assert_array_equal(sparse[:m], dense[:n])
        np.testing.assert_array_equal(sparse[:m], sample_keys_reference(keys, seed, t))
    strided = keys[::3]  # a view of the caller's array, not contiguous
    t = sample_threshold(0.3)
    np.testing.assert_array_equal(sample_keys(strided, 7, t), sample_keys_reference(strided, 7, t))


def test_sampling_is_spatial_and_near_the_rate(tmp_path: Path) -> None:
    keys = np.arange(200_000, dtype=np.int64)
    with KeyRecorder(tmp_path / "t", table="x", rate=0.01, seed=3, min_keys=0) as rec:
        rec.record("pull", keys, 0)
        rec.record("pull", keys[::-1].copy(), 1)  # the same keys again: the same ones kept
        rec.record("pull", np.repeat(keys[:1000], 3), 2)
    tr = read_trace(tmp_path / "t")
    first, second, third = (k for _, _, k in tr.batches())
    assert 0.009 < first.shape[0] / keys.shape[0] < 0.011
    assert set(first.tolist()) == set(second.tolist())
    kept = set(first.tolist())
    assert third.tolist() == [k for k in np.repeat(keys[:1000], 3).tolist() if k in kept]
    assert tr.seen.tolist() == [200_000, 200_000, 3000]
    other = sample_keys(keys, 4 ^ 0x9E3779B97F4A7C15, sample_threshold(0.01))
    assert set(other.tolist()) != kept  # another seed keeps other keys


def test_round_trip_around_a_real_table(db: evdb.Database, tmp_path: Path) -> None:
    t = db.create_table("item", dim=4, dram_rows=64)
    with KeyRecorder.for_table(t, tmp_path / "item.trace", rate=1.0) as rec:
        record_training(db, t, rec, steps=5)
        assert rec.batches == 10
    tr = read_trace(tmp_path / "item.trace", table=t)
    assert tr.complete and tr.n_batches == 10
    assert tr.header.table == "item" and tr.header.rate == 1.0
    assert tr.header.config == t.config.to_dict()
    assert tr.steps.tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert [op for op, _, _ in tr.batches()] == ["pull", "lookup"] * 5
    assert np.diff(tr.bounds).tolist() == [512, 16] * 5
    assert tr.counted.tolist() == [-1, 16] * 5  # a lookup counts every position
    rng = np.random.default_rng(0)
    first = rng.zipf(1.2, 512).astype(np.int64)
    np.testing.assert_array_equal(tr.keys[:512], first)


def test_chunks_and_empty_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import evdb.trace as trace_mod

    monkeypatch.setattr(trace_mod, "_CHUNK_KEYS", 100)  # many chunks
    rng = np.random.default_rng(1)
    with KeyRecorder(tmp_path / "t", table="x", rate=0.05, min_keys=0) as rec:
        batches = [rng.integers(0, 10**6, 300).astype(np.int64) for _ in range(40)]
        for i, b in enumerate(batches):
            rec.record("pull", b, i)
        rec.record("pull", np.zeros(0, dtype=np.int64), 40, counted=0)  # kept nothing
    tr = read_trace(tmp_path / "t")
    want = [
        sample_keys_reference(b, 0 ^ 0x9E3779B97F4A7C15, sample_threshold(0.05)) for b in batches
    ]
    assert tr.n_batches == 41 and int(tr.seen.sum()) == 40 * 300  # every call is a batch
    np.testing.assert_array_equal(tr.keys, np.concatenate(want))
    assert np.diff(tr.bounds).tolist() == [w.shape[0] for w in want] + [0]
    assert tr.steps.tolist() == list(range(41))
    assert tr.counted_total("pull") is None  # 40 calls did not say
    assert tr.counted.tolist() == [-1] * 40 + [0]


def _complete_trace(tmp_path: Path) -> Path:
    path = tmp_path / "t"
    with KeyRecorder(path, table="item", config={"dim": 4}, rate=1.0) as rec:
        rec.record("pull", np.arange(10, dtype=np.int64), 0)
        rec.flush()  # one chunk written
        rec.record("pull", np.arange(5, dtype=np.int64), 1)
    return path


@pytest.mark.parametrize("cut", [3, 20, -30, -60, -1, -28])
def test_truncated_trace_is_refused(tmp_path: Path, cut: int) -> None:
    path = _complete_trace(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[:cut])
    with pytest.raises(evdb.CorruptDataError, match=r"truncated|magic|checksum"):
        read_trace(path)


def test_trace_without_end_record(tmp_path: Path) -> None:
    path = _complete_trace(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[:-32])  # the end record: "END!" + 3 u64 + crc
    with pytest.raises(evdb.CorruptDataError, match="no end record"):
        read_trace(path)
    tr = read_trace(path, allow_incomplete=True)
    assert not tr.complete and tr.keys.tolist() == [*range(10), *range(5)]
    rec = KeyRecorder(tmp_path / "open", table="x", rate=1.0)  # never closed: a crash
    rec.record("pull", np.arange(3, dtype=np.int64), 0)
    rec.flush()
    assert read_trace(tmp_path / "open", allow_incomplete=True).keys.tolist() == [0, 1, 2]
    rec.close()


def test_flipped_byte_is_refused(tmp_path: Path) -> None:
    path = _complete_trace(tmp_path)
    data = bytearray(path.read_bytes())
    data[-40] ^= 0xFF  # inside the second chunk's keys
    path.write_bytes(bytes(data))
    with pytest.raises(evdb.CorruptDataError, match="checksum"):
        read_trace(path)


def test_trace_from_another_table_is_refused(db: evdb.Database, tmp_path: Path) -> None:
    item = db.create_table("item", dim=4)
    user = db.create_table("user", dim=4)
    with KeyRecorder.for_table(item, tmp_path / "item.trace", rate=1.0) as rec:
        rec.record("pull", np.arange(4, dtype=np.int64), 0)
    with pytest.raises(evdb.InvalidArgumentError, match="recorded from table 'item', not 'user'"):
        read_trace(tmp_path / "item.trace", table=user)
    db.drop_table("item")
    other = db.create_table("item", dim=8)  # same name, another configuration
    with pytest.raises(evdb.InvalidArgumentError, match="another table called 'item'"):
        read_trace(tmp_path / "item.trace", table=other)


def test_recorder_refusals(tmp_path: Path) -> None:
    with pytest.raises(evdb.InvalidArgumentError, match="rate"):
        KeyRecorder(tmp_path / "a", table="x", rate=0.0)
    rec = KeyRecorder(tmp_path / "a", table="x")
    with pytest.raises(FileExistsError):
        KeyRecorder(tmp_path / "a", table="x")
    with pytest.raises(evdb.InvalidArgumentError, match="op must be one of"):
        rec.record("push", np.arange(3, dtype=np.int64), 0)
    with pytest.raises(evdb.InvalidArgumentError, match="1-d int64"):
        rec.record("pull", np.arange(3, dtype=np.int32), 0)
    rec.close()
    with pytest.raises(evdb.InvalidArgumentError, match="closed"):
        rec.record("pull", np.arange(3, dtype=np.int64), 0)
    (tmp_path / "junk").write_bytes(b"not a trace at all")
    with pytest.raises(evdb.CorruptDataError, match="bad magic"):
        read_trace(tmp_path / "junk")


def test_user_key_logs(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    keys = rng.integers(0, 50_000, 10_000).astype(np.int64)
    steps = np.repeat(np.arange(100), 100)
    np.save(tmp_path / "k.npy", keys)
    tr = read_key_log(tmp_path / "k.npy", batch_keys=1000)
    assert tr.n_batches == 10 and tr.steps.tolist() == list(range(10))
    np.testing.assert_array_equal(tr.keys, keys)
    np.savez(tmp_path / "k.npz", key=keys, step=steps)
    sampled = open_trace(tmp_path / "k.npz", rate=0.1, seed=5, min_keys=0)
    with KeyRecorder(tmp_path / "same", table="", rate=0.1, seed=5, min_keys=0) as rec:
        for s in range(100):
            rec.record("pull", keys[steps == s], s)
    rec_trace = read_trace(tmp_path / "same")
    np.testing.assert_array_equal(sampled.keys, rec_trace.keys)  # a log samples as a recorder
    np.testing.assert_array_equal(sampled.steps, rec_trace.steps)
    np.testing.assert_array_equal(sampled.bounds, rec_trace.bounds)
    distinct = [np.unique(keys[steps == s]).shape[0] for s in range(100)]
    assert sampled.counted.tolist() == distinct  # what Table.pull would count
    np.savez(tmp_path / "bad.npz", key=keys, step=steps[::-1])
    with pytest.raises(evdb.InvalidArgumentError, match="must not decrease"):
        read_key_log(tmp_path / "bad.npz")
    with pytest.raises(evdb.InvalidArgumentError, match="no array 'item'"):
        read_key_log(tmp_path / "k.npz", column="item")


@pytest.mark.parametrize("min_keys", [500, 5_000, 50_000])
def test_key_log_keeps_min_keys_as_a_recorder(tmp_path: Path, min_keys: int) -> None:
    """A log read with ``min_keys`` keeps what a recorder with it would have, read back:
    the same keys, batches and rates (the threshold raised to ``min_keys`` distinct keys,
    the whole log when it has fewer, the floor when the rate alone keeps enough)."""
    rng = np.random.default_rng(min_keys)
    keys = (rng.zipf(1.2, 20_000) % 30_000).astype(np.int64)
    steps = np.repeat(np.arange(200), 100)
    np.savez(tmp_path / "k.npz", key=keys, step=steps)
    log = read_key_log(tmp_path / "k.npz", rate=0.05, seed=3, min_keys=min_keys)
    with KeyRecorder(tmp_path / "r", table="", rate=0.05, seed=3, min_keys=min_keys) as rec:
        for s in range(200):
            rec.record("pull", keys[steps == s], s)
    want = read_trace(tmp_path / "r")
    np.testing.assert_array_equal(log.keys, want.keys)
    np.testing.assert_array_equal(log.bounds, want.bounds)
    assert (log.header.rate, log.header.floor_rate) == (want.header.rate, 0.05)
    distinct = np.unique(log.keys).shape[0]
    assert distinct >= min(min_keys, np.unique(keys).shape[0]) or log.header.rate == 0.05
    with pytest.raises(evdb.InvalidArgumentError, match="min_keys must be an int >= 0, got -1"):
        read_key_log(tmp_path / "k.npz", rate=0.05, min_keys=-1)


def test_parquet_key_log(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    keys = np.arange(1000, dtype=np.int64) % 77
    pq.write_table(pa.table({"item_id": keys, "ts": np.arange(1000) // 10}), tmp_path / "k.parquet")
    tr = read_key_log(tmp_path / "k.parquet", column="item_id", step_column="ts")
    assert tr.n_batches == 100
    np.testing.assert_array_equal(tr.keys, keys)


def test_strided_keys_are_recorded(tmp_path: Path) -> None:
    keys = np.arange(100_000, dtype=np.int64)
    with KeyRecorder(tmp_path / "t", table="x", rate=0.1, seed=9, min_keys=0) as rec:
        rec.record("pull", keys[::3], 0)  # a view of the caller's array
    want = sample_keys_reference(keys[::3].copy(), 9 ^ 0x9E3779B97F4A7C15, sample_threshold(0.1))
    np.testing.assert_array_equal(read_trace(tmp_path / "t").keys, want)


def test_a_learning_rate_schedule_does_not_make_the_trace_another_tables(tmp_path: Path) -> None:
    with evdb.open(tmp_path / "db") as db:
        t = db.create_table("t", dim=2, optimizer=evdb.optim.SGD(lr=0.1))
        with KeyRecorder.for_table(t, tmp_path / "t.trace", rate=1.0) as rec:
            t.trace(rec)
            t.push(t.pull([1, 2]), np.zeros((2, 2), np.float32))
            t.learning_rate = 0.01  # a schedule, while recording
        assert read_trace(tmp_path / "t.trace", table=t).n_batches == 1
        other = db.create_table("u", dim=2, optimizer=evdb.optim.Adagrad(lr=0.1))
        with pytest.raises(evdb.InvalidArgumentError, match=r"another table|recorded from table"):
            read_trace(tmp_path / "t.trace", table=other)


def test_a_chunk_that_fails_to_be_written_is_raised_on_the_callers_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks are written on the recorder's thread (trace_format.ChunkWriter); a failed
    write is raised by the next flush or close, which leaves the file without its end."""
    import evdb.trace_format as writer_mod

    def full_disk(*args: object) -> None:
        raise OSError(28, "No space left on device")

    rec = KeyRecorder(tmp_path / "t", table="x", rate=1.0)
    rec.record("pull", np.arange(10, dtype=np.int64), 0)
    rec.flush()  # written
    monkeypatch.setattr(writer_mod, "write_chunk", full_disk)
    rec.record("pull", np.arange(5, dtype=np.int64), 1)
    with pytest.raises(OSError, match="No space left"):
        rec.flush()
    with pytest.raises(OSError, match="No space left"):
        rec.close()
    with pytest.raises(evdb.InvalidArgumentError, match="is closed"):
        rec.record("pull", np.arange(5, dtype=np.int64), 2)
    tr = read_trace(tmp_path / "t", allow_incomplete=True)  # the chunk written before
    assert tr.keys.tolist() == list(range(10)) and not tr.complete
