"""The cache tier over half-precision rows: ``ColumnCache`` whose values column holds bfloat16
(uint16 bit patterns) or float16, for a table created with ``dtype="bfloat16"`` / ``"float16"``.

Only the values column changes (and the slots column, with ``slot_dtype``: then stored in the
values' format; metadata stays as it is), and only the methods that touch them are
overridden, so the float32 tier runs exactly the code it ran before.
Everything that leaves the tier is float32 (lookups, pulls, ``read``'s records, scans): widening
is exact. What enters it is rounded: a push's update in its fused kernel
(``segment_sum_apply_lowp``, stochastic by default: bits of (seed, key, step, column)), records
and upserts to nearest even. A row read out and written back (eviction, a checkpoint's restore,
a promotion from below) is therefore bit for bit the row it was: rounding a value that the
format represents exactly gives that value.

``HalfRowsCache`` holds what this tier shares with its device twin
(``evdb.tiers.hbm_lowp.DeviceLowpCache``): the rounding settings, the half slots column, the
fused update's call and the stats.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from evdb._types import Float32Array, Int64Array
from evdb.bags import Bags
from evdb.config import DramConfig
from evdb.kernels import backend
from evdb.kernels.cpu.lowp_gather import stamp_widen_pulled
from evdb.kernels.reference.lowp import storage_dtype
from evdb.records import FREQ_MAX, FROZEN
from evdb.tiers.cache import ColumnCache, Grow

__all__ = ["HalfRowsCache", "LowpColumnCache", "as_stored"]

_cpu = backend("cpu")


def as_stored(dtype: str, values: Float32Array) -> Float32Array:
    """float32 values as a ``dtype`` table stores them (rounded to nearest even, widened back):
    what a new row's pull hands the trainer must be the row the tier holds."""
    if dtype == "float32":
        return values
    n = values.shape[0]
    half = np.empty(values.shape, dtype=storage_dtype(dtype))
    rows = np.arange(n, dtype=np.int64)
    _cpu.round_rows(np.ascontiguousarray(values, np.float32), rows, rows, 0, 0, False, half)
    out = np.empty(values.shape, dtype=np.float32)
    _cpu.widen_rows(half, rows, out)
    return out


class HalfRowsCache(ColumnCache):
    """What the half-precision cache tiers share (``LowpColumnCache`` over numpy columns,
    ``DeviceLowpCache`` on a CUDA device): the rounding settings, the slots column in the
    values' format when ``slot_dtype`` says so, the fused update and the stats."""

    dtype: str
    stochastic: bool
    seed: int
    slot_dtype: str

    def _set_half(self, dtype: str, stochastic: bool, seed: int, slot_dtype: str) -> None:
        """Record how rows are stored and rounded; half slots: the slots column re-made in
        the values' dtype, grown by its dtype from here on (the columns' _fit)."""
        self.dtype = dtype
        self.stochastic = stochastic
        self.seed = int(seed)
        self.slot_dtype = slot_dtype
        if slot_dtype != "float32":
            half = self.xp.empty((0, self.n_slots), dtype=storage_dtype(slot_dtype))
            self.slots = self._grown("slots", half, self.slots.shape[0])

    @staticmethod
    def _check_half(dtype: str, slot_dtype: str) -> None:
        if dtype == "float32":
            raise ValueError("a half-precision tier stores bfloat16 or float16 rows, not float32")
        if slot_dtype not in ("float32", dtype):
            raise ValueError(f"slot_dtype: expected 'float32' or {dtype!r}, got {slot_dtype!r}")

    def _update(
        self, rows: Any, grads: Any, positions: Any, bounds: Any, optimizer: int, hyper: Any,
        step: int,
    ) -> None:  # fmt: skip
        # The kernel reads each row's key from the whole column as it reads the row (a
        # gather of the batch's keys here was a second random pass); rows -1 read nothing.
        # Half slots (the values' dtype) are rounded with the row, as columns dim..
        self.kernels.segment_sum_apply_lowp(
            grads, positions, bounds, rows, self.row_keys, optimizer, hyper, self.seed, step,
            self.stochastic, self.values, self.slots,
        )  # fmt: skip

    def stats(self) -> dict[str, Any]:
        return super().stats() | {
            "dtype": self.dtype,
            "slot_dtype": self.slot_dtype,
            "rounding": "stochastic" if self.stochastic else "nearest",
        }


class LowpColumnCache(HalfRowsCache):
    """``ColumnCache`` (numpy columns, the cpu kernels) with values stored in ``dtype``.

    Parameters
    ----------
    dtype : str
        "bfloat16" or "float16".
    stochastic : bool
        Whether a push rounds its result stochastically (else to nearest even).
    seed : int
        The stochastic rounding's seed (the table's initializer seed).
    slot_dtype : str
        "float32" (default), or ``dtype``: the optimizer's slots stored in half precision too.
    Others as ``ColumnCache``.
    """

    def __init__(
        self,
        dim: int,
        n_slots: int,
        config: DramConfig,
        *,
        dtype: str,
        stochastic: bool,
        seed: int,
        name: str,
        device: str,
        grow: Grow | None = None,
        emulated: bool | None = None,
        slot_dtype: str = "float32",
    ) -> None:
        self._check_half(dtype, slot_dtype)
        super().__init__(
            dim, n_slots, config, name=name, device=device, xp=np, kernels=_cpu, grow=grow,
            emulated=emulated, value_dtype=storage_dtype(dtype),
        )  # fmt: skip
        self._set_half(dtype, stochastic, seed, slot_dtype)

    # -- values in and out ----------------------------------------------------------------
    def _widened(self, rows: Int64Array) -> Float32Array:
        out = np.empty((rows.shape[0], self.dim), dtype=np.float32)
        self.kernels.widen_rows(self.values, rows, out)
        return out

    def _store_nearest(self, rows: Int64Array, values: Float32Array, column: Any = None) -> None:
        v = np.ascontiguousarray(values, dtype=np.float32)
        out = self.values if column is None else column
        self.kernels.round_rows(v, rows, rows, 0, 0, False, out)

    def write(self, rows: Int64Array, records: Any) -> None:
        self._store_nearest(rows, records.values)
        if self.slot_dtype == "float32":
            self.slots[rows] = records.slots
        else:
            self._store_nearest(rows, records.slots, self.slots)
        self.freq[rows] = records.freq
        self.last_step[rows] = records.last_step
        self.version[rows] = records.version
        self.flags[rows] = records.flags

    def read(self, rows: Int64Array) -> Any:
        records = super().read(rows)
        records.values = self._widened(rows)
        if self.slot_dtype != "float32":
            records.slots = np.empty((rows.shape[0], self.n_slots), dtype=np.float32)
            self.kernels.widen_rows(self.slots, rows, records.slots)
        return records

    def assign(
        self, rows: Int64Array, values: Float32Array, step: int, version: int, freeze: bool | None
    ) -> None:
        self._store_nearest(rows, values)
        self.last_step[rows] = step
        self.version[rows] = version
        self.is_dirty[rows] = True
        if freeze is not None:
            self.flags[rows] = FROZEN if freeze else 0

    # -- reads and the training path ------------------------------------------------------
    def lookup(
        self, keys: Int64Array, min_live_step: int, out: Float32Array, out_rows: Int64Array
    ) -> int:
        return int(
            self.kernels.probe_gather_widened(
                self.index.slots, self.values, self.last_step, keys, min_live_step, out, out_rows
            )
        )

    def lookup_bags(
        self,
        keys: Int64Array,
        bags: Bags,
        min_live_step: int,
        defaults: tuple[int, int, float, float],
        out: Float32Array,
    ) -> None:
        kind, seed, a, b = defaults
        self.kernels.probe_gather_combine_widened(
            self.index.slots, self.values, self.last_step, keys, bags.bounds, bags.weights,
            min_live_step, bags.combiner, bags.max_norm, kind, np.uint64(seed), a, b, out,
        )  # fmt: skip

    def pull_rows(
        self, rows: Int64Array, counts: Int64Array, step: int, version: int, out: Float32Array
    ) -> int:
        # One pass: the stamps, and each row widened as it is copied
        n = int(
            stamp_widen_pulled(
                rows, counts, step, version, int(FREQ_MAX), self.freq, self.last_step,
                self.version, self.is_dirty, self.is_pinned, self.values, out,
            )
        )  # fmt: skip
        self._note_pulled(rows, n)
        return n

    def live_blocks(
        self, min_live_step: int, block_rows: int
    ) -> Iterator[tuple[Float32Array, Int64Array]]:
        high = self.alloc.high_water
        for start in range(0, high, block_rows):
            end = min(start + block_rows, high)
            live = self.is_live[start:end] & (self.last_step[start:end] >= min_live_step)
            if bool(live.any()):
                rows = start + np.flatnonzero(live)
                yield self._widened(rows), self.row_keys[rows]

    def doomed(self, min_live_step: int, l2_threshold: float | None) -> tuple[Int64Array, int]:
        live = self.live_rows()
        expired = self.last_step[live] < min_live_step
        drop = expired.copy()
        if l2_threshold is not None:
            keep = ~expired
            drop[keep] = np.linalg.norm(self._widened(live[keep]), axis=1) < l2_threshold
            drop |= expired
        return live[drop], int(np.count_nonzero(expired))
