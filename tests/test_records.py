"""The canonical record layout against golden bytes written with ``struct`` (not numpy)."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from evdb.errors import CorruptDataError
from evdb.records import RecordBatch, record_dtype

GOLDEN = Path(__file__).parent / "data" / "records_dim3_slots2.bin"
FIELDS = [
    ((1.5, -2.0, 0.25), (0.1, 7.0), 3, 42, 9, 0),
    ((0.0, 1e-3, -1e30), (0.0, 0.0), 2**32 - 1, -5, 2**64 - 1, 1),
]


def golden_batch() -> RecordBatch:
    return RecordBatch(
        values=np.array([f[0] for f in FIELDS], dtype=np.float32),
        slots=np.array([f[1] for f in FIELDS], dtype=np.float32),
        freq=np.array([f[2] for f in FIELDS], dtype=np.uint32),
        last_step=np.array([f[3] for f in FIELDS], dtype=np.int64),
        version=np.array([f[4] for f in FIELDS], dtype=np.uint64),
        flags=np.array([f[5] for f in FIELDS], dtype=np.uint8),
    )


def test_record_is_packed_little_endian_in_the_documented_order() -> None:
    assert record_dtype(3, 2).itemsize == struct.calcsize("<3f2fIqQB") == 41
    assert golden_batch().pack().tobytes() == GOLDEN.read_bytes()


def test_unpack_of_golden_bytes_gives_every_field_back() -> None:
    batch = RecordBatch.unpack(GOLDEN.read_bytes(), dim=3, n_slots=2)
    want = golden_batch()
    for name in ("values", "slots", "freq", "last_step", "version", "flags"):
        np.testing.assert_array_equal(getattr(batch, name), getattr(want, name))
        assert getattr(batch, name).dtype == getattr(want, name).dtype


def test_round_trip_without_slots_and_empty() -> None:
    rng = np.random.default_rng(0)
    batch = RecordBatch(
        values=rng.standard_normal((5, 4)).astype(np.float32),
        slots=np.empty((5, 0), np.float32),
        freq=np.arange(5, dtype=np.uint32),
        last_step=np.arange(5, dtype=np.int64) - 2,
        version=np.arange(5, dtype=np.uint64),
    )
    back = RecordBatch.unpack(batch.pack().tobytes(), 4, 0)
    np.testing.assert_array_equal(back.values, batch.values)
    assert len(RecordBatch.unpack(b"", 4, 0)) == 0


def test_truncated_bytes_are_rejected_with_the_sizes() -> None:
    with pytest.raises(CorruptDataError, match="not a multiple of the record size 41"):
        RecordBatch.unpack(GOLDEN.read_bytes()[:-1], dim=3, n_slots=2)
