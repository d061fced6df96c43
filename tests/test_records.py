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


def _bfloat16_nearest_numpy(values: np.ndarray) -> np.ndarray:
    """The plain-numpy rule: add 0x7FFF plus the kept half's lowest bit, keep the top half;
    NaN keeps its sign and top payload bits, made quiet."""
    u = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    top = (u + np.uint64(0x7FFF) + ((u >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)
    out = top.astype(np.uint16)
    nan = np.isnan(values)
    out[nan] = (u[nan] >> np.uint64(16)).astype(np.uint16) | np.uint16(0x0040)
    return out


def awkward_float32(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """float32 of every kind: random bit patterns (NaNs with payloads, infinities,
    subnormals, both zeros), exact ties between two bfloat16s, and values that round to inf."""
    bits = rng.integers(0, 2**32, shape, dtype=np.uint64).astype(np.uint32)
    pick = rng.integers(0, 6, shape)
    tie = (bits & np.uint32(0xFFFF0000)) | np.uint32(0x8000)  # halfway, odd and even tops
    bits = np.where(pick == 1, tie, bits)
    subnormal = bits & np.uint32(0x807FFFFF)  # exponent 0
    bits = np.where(pick == 2, subnormal, bits)
    near_max = np.uint32(0x7F7F8000) | (bits & np.uint32(0x80007FFF))  # rounds to +-inf
    bits = np.where(pick == 3, near_max, bits)
    nan = np.uint32(0x7F800001) | (bits & np.uint32(0x807FFFFF))  # signalling and quiet
    bits = np.where(pick == 4, nan, bits)
    return bits.view(np.float32)


def test_bfloat16_nearest_is_the_numpy_rule_bit_for_bit() -> None:
    from evdb.kernels.reference.lowp import narrow
    from evdb.records import bfloat16_nearest

    rng = np.random.default_rng(7)
    x = awkward_float32(rng, (3000, 37))
    want = _bfloat16_nearest_numpy(x)
    widened = (want.astype(np.uint32) << np.uint32(16)).view(np.float32)
    assert np.isnan(x).sum() > 1000 and (np.isinf(widened) & np.isfinite(x)).sum() > 1000
    got = bfloat16_nearest(x)
    assert got.dtype == np.uint16 and got.shape == x.shape
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, narrow(x, "bfloat16", None))  # the kernels' reference
    # any layout and float type in: a strided view, float64 (rounded to float32 first), empty
    np.testing.assert_array_equal(bfloat16_nearest(x[:, ::3]), want[:, ::3])
    with np.errstate(invalid="ignore"):  # signalling NaNs turn quiet, as rounding makes them
        wide = x[:50].astype(np.float64)
    np.testing.assert_array_equal(bfloat16_nearest(wide), want[:50])
    assert bfloat16_nearest(np.empty((0, 4), np.float32)).shape == (0, 4)


def test_a_bfloat16_record_round_trip_keeps_every_stored_value() -> None:
    # what a half table spills is bfloat16 already: packed and unpacked it comes back exactly
    rng = np.random.default_rng(8)
    x = awkward_float32(rng, (500, 6))
    stored = (_bfloat16_nearest_numpy(x).astype(np.uint32) << 16).view(np.float32)
    batch = RecordBatch(
        values=stored[:, :4],
        slots=np.ascontiguousarray(stored[:, 4:]),
        freq=np.arange(500, dtype=np.uint32),
        last_step=np.arange(500, dtype=np.int64),
        version=np.arange(500, dtype=np.uint64),
    )
    raw = batch.pack(value="<u2", slot="<u2").tobytes()
    back = RecordBatch.unpack(raw, 4, 2, value="<u2", slot="<u2")
    for name in ("values", "slots"):
        got, want = getattr(back, name).view(np.uint32), getattr(batch, name).view(np.uint32)
        nan = np.isnan(getattr(batch, name))
        np.testing.assert_array_equal(got[~nan], want[~nan])
        np.testing.assert_array_equal(got[nan] | np.uint32(0x00400000), want[nan])
