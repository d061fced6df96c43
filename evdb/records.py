"""The one canonical row layout, shared by every tier, checkpoint and export.

A row record is, little-endian and packed (no padding)::

    value[dim] <f4 | slots[n_slots] <f4 | freq <u4 | last_step <i8 | version <u8 | flags u1

``freq`` counts training pulls (saturating at 2**32 - 1), ``last_step`` is the global step of the
last pull/push/upsert, ``version`` the table-wide mutation counter when the row last changed,
``flags`` per-row bits (``FROZEN``: the optimizer leaves the row as it is).
The key is not part of the record: it is the record's address (the index key, the RocksDB key).
The values may be stored narrower (``record_dtype``'s ``value``): ``<f2`` float16, or ``<u2``
bfloat16 bit patterns (the top half of the float32, rounded to nearest even), what a
half-precision table's rows are on disk: they widen back to the same float32 exactly. The
slots may be stored narrower the same way (``record_dtype``'s ``slot``: a table's
``slot_dtype``).

Tiers keep the fields as separate column arrays (:class:`RecordBatch`) so kernels see plain
float32 matrices; ``pack``/``unpack`` convert a whole batch with numpy views, never per row.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from evdb._types import Float32Array, Int64Array
from evdb.errors import CorruptDataError
from evdb.kernels import backend

FREQ_MAX = np.iinfo(np.uint32).max
FROZEN = np.uint8(1)
FIELDS = ("values", "slots", "freq", "last_step", "version", "flags")
_NO_FLAGS = np.zeros(0, dtype=np.uint8)  # the default: all flags clear


BFLOAT16 = "<u2"  # record_dtype's value type of bfloat16 bit patterns


def record_dtype(dim: int, n_slots: int, value: str = "<f4", slot: str = "<f4") -> np.dtype:
    """The packed little-endian structured dtype of one record (``value="<f2"``: the same
    layout with float16 values, ``"<u2"``: bfloat16 bits, which the disk tier may store;
    ``slot`` likewise for the optimizer's slots)."""
    return np.dtype(
        [
            ("value", value, (dim,)),
            ("slots", slot, (n_slots,)),
            ("freq", "<u4"),
            ("last_step", "<i8"),
            ("version", "<u8"),
            ("flags", "u1"),
        ]
    )


@dataclass
class RecordBatch:
    """Column view of n records.

    values (n, dim) float32, slots (n, n_slots) float32, freq (n,) uint32,
    last_step (n,) int64, version (n,) uint64, flags (n,) uint8 (zeros when not given).
    """

    values: Float32Array
    slots: Float32Array
    freq: np.ndarray
    last_step: Int64Array
    version: np.ndarray
    flags: np.ndarray = field(default_factory=lambda: _NO_FLAGS)

    def __post_init__(self) -> None:
        if self.flags is _NO_FLAGS:
            self.flags = np.zeros(self.values.shape[0], dtype=np.uint8)

    def __len__(self) -> int:
        return int(self.values.shape[0])

    def take(self, which: np.ndarray) -> RecordBatch:
        """The records selected by a bool mask or an index array."""
        return RecordBatch(
            values=self.values[which],
            slots=self.slots[which],
            freq=self.freq[which],
            last_step=self.last_step[which],
            version=self.version[which],
            flags=self.flags[which],
        )

    def pack(self, value: str = "<f4", slot: str = "<f4") -> np.ndarray:
        """Return the records as a (n,) structured array of ``record_dtype`` (canonical bytes;
        ``value`` and ``slot`` as in ``record_dtype``, values and slots cast to them)."""
        dim, n_slots = self.values.shape[1], self.slots.shape[1]
        out = np.empty(len(self), dtype=record_dtype(dim, n_slots, value, slot))
        _store(out, "value", self.values, value)
        _store(out, "slots", self.slots, slot)
        out["freq"] = self.freq
        out["last_step"] = self.last_step
        out["version"] = self.version
        out["flags"] = self.flags
        return out

    @classmethod
    def unpack(
        cls,
        data: np.ndarray | bytes,
        dim: int,
        n_slots: int,
        value: str = "<f4",
        where: str = "",
        slot: str = "<f4",
    ) -> RecordBatch:
        """Read records from canonical bytes (or a structured array of ``record_dtype``);
        values and slots come back float32 whatever ``value`` and ``slot`` they were stored
        as. ``where`` names the source in errors."""
        dtype = record_dtype(dim, n_slots, value, slot)
        if isinstance(data, (bytes, bytearray, memoryview)):
            if len(data) % dtype.itemsize:
                raise CorruptDataError(
                    f"{where}record bytes: {len(data)} is not a multiple of the record size "
                    f"{dtype.itemsize} (dim={dim}, slots={n_slots})"
                )
            data = np.frombuffer(data, dtype=dtype)
        elif data.dtype != dtype:
            raise CorruptDataError(f"records have dtype {data.dtype}, expected {dtype}")
        n = data.shape[0]
        return cls(
            values=_widened(data["value"], value).reshape(n, dim),
            slots=_widened(data["slots"], slot).reshape(n, n_slots),
            freq=data["freq"].astype(np.uint32),
            last_step=data["last_step"].astype(np.int64),
            version=data["version"].astype(np.uint64),
            flags=data["flags"].astype(np.uint8),
        )


def _store(out: np.ndarray, name: str, x: np.ndarray, as_type: str) -> None:
    if as_type == BFLOAT16:
        out[name] = bfloat16_nearest(x)
    else:
        with np.errstate(over="ignore"):  # float16 overflow: the disk tier counts it
            out[name] = x


def _widened(stored: np.ndarray, as_type: str) -> np.ndarray:
    """float32 of a stored field (exact: bfloat16 bits shifted, float16 cast)."""
    if as_type == BFLOAT16:
        return (stored.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return np.ascontiguousarray(stored, dtype=np.float32)


def bfloat16_nearest(values: np.ndarray) -> np.ndarray:
    """uint16 bfloat16 bit patterns of float32 values, rounded to nearest even (exact for
    values a bfloat16 table holds); NaN stays a quiet NaN (the kernels' ``round_rows``)."""
    x = np.ascontiguousarray(values, dtype=np.float32)
    out = np.empty(x.shape, dtype=np.uint16)
    # The cpu kernel, the whole batch as one row: rounding to nearest is elementwise, and one
    # row runs the serial driver, one pass on this thread (30k rows of dim 64: 0.45 ms; the
    # numpy rule's passes over uint64 copies took 11 ms, the kernel's parallel driver 8 ms
    # median on a loaded 2-core machine, its workers' wake-up). NaN: the same quiet NaN.
    one = np.zeros(1, dtype=np.int64)
    backend("cpu").round_rows(x.reshape(1, -1), one, one, 0, 0, False, out.reshape(1, -1))
    return out
