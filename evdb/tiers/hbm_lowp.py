"""The HBM tier on a CUDA device over half-precision rows: ``DeviceCache`` whose values
column holds bfloat16 (uint16 bit patterns) or float16, for a table created with
``dtype="bfloat16"`` / ``"float16"`` and ``hbm_rows`` on a device.

It is the device twin of ``LowpColumnCache`` (emulated HBM and DRAM; both are
``HalfRowsCache``): only the values column changes (2 bytes a value), and the slots column
with ``slot_dtype`` (then in the values' format; else float32; metadata as it is), only the
methods that touch them are overridden, and every answer is float32:

* lookups, bag combines and pulls run the widening kernels of ``cuda/lowp.cu``
  (``probe_gather_widened``, ``probe_gather_combine_widened``, ``widen_rows``), into a
  device ``out`` (the device path) or a device buffer copied to the host once;
* a push is ``segment_sum_apply_lowp``: the update in float64, written back rounded with the
  table's rounding (stochastic by default, bits of (seed, key, step, column)); half slots are
  rounded with the row, as columns dim.. of its record;
* rows cross the bus in the table's dtype, one copy per column: ``read`` copies the values'
  (and half slots') 2-byte bits to the host and widens them there, ``write`` (and so
  ``insert`` and ``put``) and ``assign`` round on the host to nearest even and copy the bits
  up. Widening is exact and rounding a value the format holds gives that value, so a row
  evicted into DRAM, promoted back, checkpointed or reopened keeps its bits, slots included;
  the host kernels are the ones ``LowpColumnCache`` runs, so both tiers store the same bits
  for the same values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import numpy as np

from evdb._types import Float32Array, Int64Array
from evdb.bags import Bags
from evdb.config import DramConfig
from evdb.kernels import backend
from evdb.kernels.reference.lowp import storage_dtype
from evdb.records import FREQ_MAX, RecordBatch
from evdb.tiers.cache import ColumnCache
from evdb.tiers.cache_lowp import HalfRowsCache
from evdb.tiers.hbm import DeviceCache, on_device

__all__ = ["DeviceLowpCache"]

_cpu = backend("cpu")


class DeviceLowpCache(HalfRowsCache, DeviceCache):
    """``DeviceCache`` with values (and, with ``slot_dtype``, slots) stored on the device in
    ``dtype`` (see the module).

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
    Others as ``DeviceCache``.
    """

    def __init__(
        self,
        dim: int,
        n_slots: int,
        config: DramConfig,
        *,
        device_id: int,
        cupy: Any,
        kernels: ModuleType,
        dtype: str,
        stochastic: bool,
        seed: int,
        slot_dtype: str = "float32",
    ) -> None:
        self._check_half(dtype, slot_dtype)
        super().__init__(
            dim, n_slots, config, device_id=device_id, cupy=cupy, kernels=kernels,
            value_dtype=storage_dtype(dtype),
        )  # fmt: skip
        with self._device_ctx():
            self._set_half(dtype, stochastic, seed, slot_dtype)
            # the stamps' values argument: stamp_gather_pulled copies no column of a dim-0 row
            self._no_values = cupy.empty((0, 0), dtype=np.float32)

    # -- values across the bus: 2 bytes a value, converted on the host ------------------------
    def _halved(self, values: Float32Array) -> np.ndarray:
        """float32 host rows (values or half slots) rounded to nearest even into the storage
        dtype (host)."""
        v = np.ascontiguousarray(values, dtype=np.float32)
        out = np.empty(v.shape, dtype=self.values.dtype)
        rows = np.arange(v.shape[0], dtype=np.int64)
        _cpu.round_rows(v, rows, rows, 0, 0, False, out)
        return out

    def _widened_host(self, half: np.ndarray) -> Float32Array:
        out = np.empty(half.shape, dtype=np.float32)
        _cpu.widen_rows(half, np.arange(half.shape[0], dtype=np.int64), out)
        return out

    def _widened(self, rows: Any) -> Any:
        """Device rows (device handles, all >= 0) widened to a new float32 device array."""
        out = self._cp.empty((rows.shape[0], self.dim), dtype=np.float32)
        self.kernels.widen_rows(self.values, rows, out)
        return out

    @property
    def _half_slots(self) -> bool:
        return self.slot_dtype != "float32"

    @on_device
    def write(self, rows: Int64Array, records: RecordBatch) -> None:
        halved = {"values": self._halved(records.values)}
        if self._half_slots:
            halved["slots"] = self._halved(records.slots)
        ColumnCache.write(self, rows, dataclasses.replace(records, **halved))

    @on_device
    def read(self, rows: Int64Array) -> RecordBatch:
        records = ColumnCache.read(self, rows)
        records.values = self._widened_host(records.values)
        if self._half_slots:
            records.slots = self._widened_host(records.slots)
        return records

    @on_device
    def assign(
        self, rows: Int64Array, values: Float32Array, step: int, version: int, freeze: bool | None
    ) -> None:
        ColumnCache.assign(self, rows, self._halved(values), step, version, freeze)

    # -- reads and the training path (a device out: the device path) ------------------------
    @on_device
    def lookup(self, keys: Any, min_live_step: int, out: Any, out_rows: Any) -> int:
        on_host = not isinstance(out, self._cp.ndarray)
        dev_out = self._cp.empty(out.shape, dtype=np.float32) if on_host else out
        dev_rows = self._cp.empty(out_rows.shape, dtype=np.int64) if on_host else out_rows
        missing = self.kernels.probe_gather_widened(
            self.index.slots, self.values, self.last_step, self._dev(keys), min_live_step,
            dev_out, dev_rows,
        )  # fmt: skip
        if on_host:
            out[:] = self._host(dev_out)
            out_rows[:] = self._host(dev_rows)
        return int(missing)

    @on_device
    def lookup_bags(
        self,
        keys: Any,
        bags: Bags,
        min_live_step: int,
        defaults: tuple[int, int, float, float],
        out: Any,
    ) -> None:
        kind, seed, a, b = defaults
        on_host = not isinstance(out, self._cp.ndarray)
        dev_out = self._cp.empty(out.shape, dtype=np.float32) if on_host else out
        self.kernels.probe_gather_combine_widened(
            self.index.slots, self.values, self.last_step, self._dev(keys),
            self._dev(bags.bounds), self._dev(bags.weights), min_live_step, bags.combiner,
            bags.max_norm, kind, np.uint64(seed), a, b, dev_out,
        )  # fmt: skip
        if on_host:
            out[:] = self._host(dev_out)

    @on_device
    def pull_rows(self, rows: Any, counts: Any, step: int, version: int, out: Any) -> int:
        # Two launches where the float32 tier has one: the stamps (with a dim-0 copy, as
        # reference.lowp.stamp_widen_pulled specifies it), then each found row widened into out
        on_host = not isinstance(out, self._cp.ndarray)
        dev_out = self._cp.empty(out.shape, dtype=np.float32) if on_host else out
        r = self._dev(rows)
        n = int(
            self.kernels.stamp_gather_pulled(
                r, self._dev(counts), step, version, int(FREQ_MAX), self.freq, self.last_step,
                self.version, self.is_dirty, self.is_pinned, self._no_values,
                self._cp.empty((r.shape[0], 0), dtype=np.float32),
            )
        )  # fmt: skip
        self.kernels.widen_rows(self.values, r, dev_out)
        if on_host:
            found = rows >= 0  # rows without a row keep what out held, as the stamps' copy
            out[found] = self._host(dev_out)[found]
        self._note_pulled(rows, n)
        return n

    @on_device
    def gather_into(self, out: Any, at: Any, rows: Any) -> None:
        """``out[at] = values[rows]`` widened, on the device (rows just written)."""
        if rows.shape[0]:
            out[self._dev(at)] = self._widened(self._dev(rows))

    # -- whole-tier reads -------------------------------------------------------------------
    @on_device
    def live_blocks(
        self, min_live_step: int, block_rows: int
    ) -> Iterator[tuple[Float32Array, Int64Array]]:
        high = self.alloc.high_water
        for start in range(0, high, block_rows):
            end = min(start + block_rows, high)
            live = self.is_live[start:end] & (self.last_step[start:end] >= min_live_step)
            if bool(live.any()):
                rows = start + self._cp.flatnonzero(live)
                yield (
                    self._widened_host(self._host(self.values[rows])),
                    self._host(self.row_keys[rows]),
                )

    @on_device
    def doomed(self, min_live_step: int, l2_threshold: float | None) -> tuple[Int64Array, int]:
        live = self.live_rows()
        r = self._dev(live)
        expired = self.last_step[r] < min_live_step
        drop = expired.copy()
        if l2_threshold is not None:
            keep = ~expired
            norms = self._cp.linalg.norm(self._widened(r[keep]), axis=1)
            drop[keep] = norms < l2_threshold
            drop |= expired
        return live[self._host(drop)], int(self._cp.count_nonzero(expired))
