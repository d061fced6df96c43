"""Victims gathered straight into packed records: the kernel against its reference, and the
bytes against ``RecordBatch.pack``."""

from __future__ import annotations

import numpy as np
import pytest

from evdb.kernels.cpu import pack as cpu_pack
from evdb.kernels.reference import pack as ref_pack
from evdb.records import BFLOAT16, RecordBatch, record_dtype
from evdb.tiers.writeback import gather_packed, pack_records


def random_columns(rng: np.random.Generator, cap: int, dim: int, n_slots: int) -> RecordBatch:
    return RecordBatch(
        values=rng.standard_normal((cap, dim), dtype=np.float32),
        slots=rng.standard_normal((cap, n_slots), dtype=np.float32),
        freq=rng.integers(0, 2**32, cap, dtype=np.uint32, endpoint=False),
        last_step=rng.integers(-(2**63), 2**63 - 1, cap, dtype=np.int64),
        version=rng.integers(0, 2**64 - 1, cap, dtype=np.uint64),
        flags=rng.integers(0, 256, cap, dtype=np.uint8),
    )


@pytest.mark.parametrize(("dim", "n_slots"), [(1, 0), (16, 1), (64, 64), (7, 3)])
def test_the_kernel_writes_the_references_bytes(dim: int, n_slots: int) -> None:
    rng = np.random.default_rng(dim * 31 + n_slots)
    cols = random_columns(rng, 500, dim, n_slots)
    rows = rng.integers(0, 500, 300)  # repeats, any order
    mine = np.zeros(300, dtype=record_dtype(dim, n_slots))
    spec = np.ones(300, dtype=record_dtype(dim, n_slots))  # every byte must be written
    args = (cols.values, cols.slots, cols.freq, cols.last_step, cols.version, cols.flags, rows)
    cpu_pack.gather_records(*args, mine)
    ref_pack.gather_records(*args, spec)
    assert mine.tobytes() == spec.tobytes()
    assert spec.tobytes() == cols.take(rows).pack().tobytes()


@pytest.mark.parametrize("value", ["<f4", "<f2", BFLOAT16])
def test_gather_packed_equals_take_then_pack(value: str) -> None:
    rng = np.random.default_rng(7)
    cols = random_columns(rng, 1000, 8, 2)
    rows = np.sort(rng.choice(1000, 400, replace=False))
    got = gather_packed(cols, rows, value)
    assert got.dtype == record_dtype(8, 2, value)
    assert got.tobytes() == cols.take(rows).pack(value).tobytes()
    assert pack_records(cols.take(rows), value).tobytes() == got.tobytes()
    assert gather_packed(cols, rows[:0], value).shape == (0,)
