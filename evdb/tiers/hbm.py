"""The HBM tier: the hottest rows, on top of the chain (HBM over DRAM over RocksDB).

It is the cache tier (``evdb.tiers.cache.ColumnCache``, the ``CacheTier`` role) under the
name "hbm", and takes DRAM's place at the top of the chain, with DRAM (and RocksDB under it)
as its backing tier (``evdb.tiers.chain.ChainTier``)::

    TierChain(hbm, ChainTier(TierChain(dram, rocks)))

``device=N`` (a CUDA device): ``DeviceCache``, the same ``ColumnCache`` over cupy arrays on
device N with the gpu kernels (``evdb.kernels.backend("gpu")``, the CUDA sources). Values,
slots, metadata and the hash index live in device memory, and every method runs inside
``cupy.cuda.Device(N)``. The table reaches the tier only through the ``CacheTier`` role, with
host arrays crossing it: each array crosses as one copy through a reused pinned host buffer
(``PinnedStaging``), so a promotion or a write-back of n rows is a few copies (one per
column), never one per row. Creating the tier checks its size at capacity against the
device's free memory (``ConfigError`` with both numbers); there is no fallback to the CPU.
Given device arrays instead (``lookup``, ``lookup_bags`` and ``pull_rows`` with a device
``out``, ``apply`` with device gradients), the rows stay on the device: the table's device
path (``evdb.tiers.device_path``), whose key-sized copies the tier counts in its stats.
A half-precision table's tier (``dtype="bfloat16"`` / ``"float16"``) is ``DeviceLowpCache``
(``evdb.tiers.hbm_lowp``): 2-byte values on the device (and 2-byte slots with
``slot_dtype``), answers in float32.

``device="cpu"``: **emulated HBM**, the HBM caching logic on the CPU, for tests. The rows live
in numpy columns and the cpu kernels run on them, as in the DRAM tier; what the emulation
exercises is everything above the storage: promotion from DRAM or RocksDB into a
bounded top tier, write-back of dirty victims into DRAM, pinning (a batch larger than the tier
over-commits it until its push), exact ``len`` across three levels, flush through every level,
reopen and checkpoints. CI runs the table's tests with it, and with ``device=0`` on a CPU
stand-in for cupy that runs the CUDA sources (tests/cuda_cpu).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import numpy as np

from evdb.bags import Bags
from evdb.config import DramConfig, HbmConfig, HbmDevice
from evdb.errors import ConfigError
from evdb.hashindex import index_bytes
from evdb.kernels import backend
from evdb.records import FREQ_MAX
from evdb.tiers.cache import ColumnCache
from evdb.tiers.cache_lowp import LowpColumnCache

__all__ = [
    "DeviceCache",
    "PinnedStaging",
    "device_bytes",
    "hbm_tier",
    "on_device",
    "require_device",
]

_EMULATED = "cpu"
_ADVICE = "use device='cpu' for the emulated HBM tier (tests), or no hbm_rows"
_ALIGN = 256  # bytes: each staged array starts on its own DMA-friendly boundary


def _cupy() -> Any:
    """cupy, once ``backend("gpu")`` has found it and a device (ConfigError otherwise)."""
    backend("gpu")  # raises where cupy or a CUDA device is missing
    import cupy

    return cupy


def device_kernels() -> ModuleType:
    """The kernels of a device tier: the gpu backend (tests may run it in a fast mode)."""
    return backend("gpu")


def require_device(device: HbmDevice) -> None:
    """Raise ``ConfigError`` unless an HBM tier can live on ``device`` in this process.

    ``"cpu"`` (emulated HBM) always can. A CUDA device needs cupy and that device visible
    (checked lazily: cupy is imported here, never when evdb is).
    """
    if device == _EMULATED:
        return
    try:
        cp = _cupy()
        count = int(cp.cuda.runtime.getDeviceCount())
    except ConfigError as exc:
        raise ConfigError(
            f"device={device!r}: cannot create an HBM tier here: {exc}; {_ADVICE}"
        ) from exc
    if not 0 <= int(device) < count:
        raise ConfigError(
            f"device={device!r}: cannot create an HBM tier here: cupy sees {count} CUDA "
            f"device(s), numbered from 0; {_ADVICE}"
        )


def device_bytes(
    dim: int, n_slots: int, rows: int, value_bytes: int = 4, slot_bytes: int = 4
) -> int:
    """Device memory of an HBM tier holding ``rows`` rows: its columns (values of
    ``value_bytes`` each: 4 for float32, 2 for bfloat16 or float16; slots of ``slot_bytes``
    likewise; 41 bytes of keys and metadata) and its hash index."""
    per_row = value_bytes * dim + slot_bytes * n_slots + 8 + 4 + 8 + 8 + 1 + 4 * 1 + 8
    return rows * per_row + index_bytes(rows, device=True)


class PinnedStaging:
    """Host <-> device copies through one reused pinned (page-locked) host buffer.

    An array crosses as one copy: host -> pinned staging -> device (``to_device``), or device
    -> pinned -> a fresh host array (``to_host``). The buffer grows to the largest array seen
    and is then reused, so a step allocates no pinned memory. The copies are synchronous on
    the current stream (cupy's ``set`` and ``get`` without a stream), so the buffer is free
    again when a copy returns.
    """

    def __init__(self, cupy: Any) -> None:
        self._cp = cupy
        self._buffer: np.ndarray = np.empty(0, dtype=np.uint8)
        self._memory: Any = None  # keeps the pinned allocation alive

    def _staged(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if nbytes > self._buffer.shape[0]:
            size = max(nbytes, 2 * self._buffer.shape[0], 1 << 16)
            size = -(-size // _ALIGN) * _ALIGN
            self._memory = self._cp.cuda.alloc_pinned_memory(size)
            self._buffer = np.frombuffer(self._memory, dtype=np.uint8, count=size)
        return self._buffer[:nbytes].view(dtype).reshape(shape)

    def to_device(self, host: Any) -> Any:
        """A C-contiguous device copy of a host array (a device array is returned as is)."""
        cp = self._cp
        if isinstance(host, cp.ndarray):
            return cp.ascontiguousarray(host)
        host = np.asarray(host)
        out = cp.empty(host.shape, dtype=host.dtype)
        if host.size:
            staged = self._staged(host.shape, host.dtype)
            staged[...] = host
            out.set(staged)
        return out

    def to_host(self, device: Any) -> np.ndarray:
        """A new host array holding a device array's values."""
        if not device.size:
            return np.empty(device.shape, dtype=device.dtype)
        staged = self._staged(device.shape, device.dtype)
        device.get(out=staged)
        return staged.copy()

    @property
    def nbytes(self) -> int:
        return int(self._buffer.shape[0])


def on_device(method: Callable[..., Any]) -> Callable[..., Any]:
    """method run inside its tier's ``cupy.cuda.Device``; a generator's every step too (the
    device is not left current while the caller holds a chunk)."""
    if inspect.isgeneratorfunction(method):

        @functools.wraps(method)
        def steps(self: DeviceCache, *args: Any, **kwargs: Any) -> Iterator[Any]:
            with self._device_ctx():
                it = method(self, *args, **kwargs)
            while True:
                with self._device_ctx():
                    try:
                        item = next(it)
                    except StopIteration:
                        return
                yield item

        return steps

    @functools.wraps(method)
    def call(self: DeviceCache, *args: Any, **kwargs: Any) -> Any:
        with self._device_ctx():
            return method(self, *args, **kwargs)

    return call


class DeviceCache(ColumnCache):
    """``ColumnCache`` on a CUDA device: cupy columns and index, the gpu kernels, host arrays
    in and out through ``PinnedStaging``, every method inside ``cupy.cuda.Device(id)``."""

    def __init__(
        self,
        dim: int,
        n_slots: int,
        config: DramConfig,
        *,
        device_id: int,
        cupy: Any,
        kernels: ModuleType,
        value_dtype: Any = np.float32,
    ) -> None:
        self.device_id = device_id
        self._cp = cupy
        self.staging = PinnedStaging(cupy)
        with self._device_ctx():
            super().__init__(
                dim, n_slots, config, name="hbm", device=f"cuda:{device_id}", xp=cupy,
                kernels=kernels, emulated=False, value_dtype=value_dtype,
            )  # fmt: skip
        self._dev = self.staging.to_device
        self._host = self.staging.to_host
        # key-sized copies of the device path (evdb.tiers.device_path), by direction
        self.key_bytes = {"to_host": 0, "to_device": 0}

    def _device_ctx(self) -> Any:
        return self._cp.cuda.Device(self.device_id)

    def device_context(self) -> Any:
        """``cupy.cuda.Device(id)`` of the tier: its device made current (a context)."""
        return self._device_ctx()

    @property
    def cupy(self) -> Any:
        """The cupy module of the tier's arrays."""
        return self._cp

    # -- the device path: device arrays in, device arrays out (no row crosses) ------------
    @on_device
    def lookup(self, keys: Any, min_live_step: int, out: Any, out_rows: Any) -> int:
        """``CacheTier.lookup``; with a device ``out`` (and ``out_rows``), the rows stay on
        the device."""
        if not isinstance(out, self._cp.ndarray):
            return ColumnCache.lookup(self, keys, min_live_step, out, out_rows)
        return int(
            self.kernels.probe_gather(
                self.index.slots, self.values, self.last_step, self._dev(keys), min_live_step,
                out, out_rows,
            )
        )  # fmt: skip

    @on_device
    def lookup_bags(
        self,
        keys: Any,
        bags: Bags,
        min_live_step: int,
        defaults: tuple[int, int, float, float],
        out: Any,
    ) -> None:
        """``CacheTier.lookup_bags``; with a device ``out``, combined on the device."""
        if not isinstance(out, self._cp.ndarray):
            ColumnCache.lookup_bags(self, keys, bags, min_live_step, defaults, out)
            return
        kind, seed, a, b = defaults
        self.kernels.probe_gather_combine(
            self.index.slots, self.values, self.last_step, self._dev(keys),
            self._dev(bags.bounds), self._dev(bags.weights), min_live_step, bags.combiner,
            bags.max_norm, kind, np.uint64(seed), a, b, out,
        )  # fmt: skip

    @on_device
    def pull_rows(self, rows: Any, counts: Any, step: int, version: int, out: Any) -> int:
        """``CacheTier.pull_rows``; with a device ``out``, the rows are copied on the device
        (``rows`` and ``counts``, key-sized, come from the host's bookkeeping)."""
        if not isinstance(out, self._cp.ndarray):
            return ColumnCache.pull_rows(self, rows, counts, step, version, out)
        n = int(
            self.kernels.stamp_gather_pulled(
                self._dev(rows), self._dev(counts), step, version, int(FREQ_MAX), self.freq,
                self.last_step, self.version, self.is_dirty, self.is_pinned, self.values, out,
            )
        )  # fmt: skip
        self._note_pulled(rows, n)
        return n

    @on_device
    def locate_on_device(self, keys: Any) -> Any:
        """Row of each device key (a device array, -1 where absent)."""
        return self.index.find(keys)

    @on_device
    def gather_into(self, out: Any, at: Any, rows: Any) -> None:
        """``out[at] = values[rows]`` on the device (rows just written into the tier)."""
        if rows.shape[0]:
            out[self._dev(at)] = self.values[self._dev(rows)]

    def stats(self) -> dict[str, Any]:
        with self._device_ctx():
            free, total = (int(x) for x in self._cp.cuda.runtime.memGetInfo())
            return super().stats() | {
                "device_free_bytes": free,
                "device_total_bytes": total,
                "pinned_staging_bytes": self.staging.nbytes,
                "key_bytes_to_host": self.key_bytes["to_host"],
                "key_bytes_to_device": self.key_bytes["to_device"],
            }


for _name, _member in list(vars(ColumnCache).items()):
    if callable(_member) and not _name.startswith("_") and _name not in vars(DeviceCache):
        setattr(DeviceCache, _name, on_device(_member))


def hbm_tier(
    dim: int,
    n_slots: int,
    config: HbmConfig,
    policy: DramConfig,
    *,
    dtype: str = "float32",
    stochastic: bool = True,
    seed: int = 0,
    slot_dtype: str = "float32",
) -> ColumnCache:
    """The top tier of a table created with ``hbm_rows``: a bounded cache of the hot rows.

    Parameters
    ----------
    dim, n_slots : int
        Record width (values, optimizer slots).
    config : HbmConfig
        ``capacity_rows`` and ``device`` (a CUDA device number, or "cpu": emulated).
    policy : DramConfig
        The victim policy (``eviction``, ``half_life_steps``, ``evict_fraction``), shared with
        the DRAM tier; its ``capacity_rows`` is the DRAM tier's and is not used here.
    dtype, stochastic, seed
        How values are stored and pushes rounded (as ``dram_tier``): a half-precision tier
        is ``LowpColumnCache`` on emulated HBM, ``DeviceLowpCache`` on a CUDA device.
    slot_dtype : str
        How optimizer slots are stored: "float32", or ``dtype`` (a half-precision table's
        own format, on a CUDA device as on emulated HBM).

    Raises
    ------
    ConfigError
        Where cupy or the device is missing (see ``require_device``), or the tier at capacity
        would not fit in the device's free memory.
    """
    require_device(config.device)
    tier_policy = dataclasses.replace(policy, capacity_rows=config.capacity_rows, initial_rows=0)
    # passed on only when asked for (the slots column of LowpColumnCache is float32 else)
    half_slots: dict[str, Any] = {} if slot_dtype == "float32" else {"slot_dtype": slot_dtype}
    if config.device == _EMULATED:
        if dtype != "float32":
            return LowpColumnCache(
                dim, n_slots, tier_policy, dtype=dtype, stochastic=stochastic, seed=seed,
                name="hbm", device=_EMULATED, emulated=True, **half_slots,
            )  # fmt: skip
        return ColumnCache(
            dim, n_slots, tier_policy, name="hbm", device=_EMULATED, xp=np,
            kernels=backend("cpu"), emulated=True,
        )  # fmt: skip
    device_id = int(config.device)
    cp = _cupy()
    with cp.cuda.Device(device_id):
        free, total = (int(x) for x in cp.cuda.runtime.memGetInfo())
    value_bytes = 4 if dtype == "float32" else 2
    need = device_bytes(
        dim, n_slots, config.capacity_rows, value_bytes, 4 if slot_dtype == "float32" else 2
    )
    if need > free:
        raise ConfigError(
            f"device={device_id}: an HBM tier of {config.capacity_rows} rows (dim {dim}, "
            f"{n_slots} {slot_dtype} optimizer slots, {dtype} values) needs {need} bytes of "
            f"device memory, but the device has {free} bytes free (of {total}); lower hbm_rows"
        )
    if dtype != "float32":
        from evdb.tiers.hbm_lowp import DeviceLowpCache  # it subclasses DeviceCache

        return DeviceLowpCache(
            dim, n_slots, tier_policy, device_id=device_id, cupy=cp, kernels=device_kernels(),
            dtype=dtype, stochastic=stochastic, seed=seed, **half_slots,
        )  # fmt: skip
    return DeviceCache(
        dim, n_slots, tier_policy, device_id=device_id, cupy=cp, kernels=device_kernels()
    )
