"""The device path of a table whose top tier is on a CUDA device (``DeviceCache``).

Given device arrays (cupy; torch CUDA tensors reach it through DLPack in ``evdb.torch``), a
table's ``lookup``, ``pull``, the bag combine of a pulled batch and ``push`` answer in device
arrays: the tier's kernels probe, gather, stamp, combine and apply the optimizer on the
device, so embeddings and gradients never cross to the host while every key is resident in
the top tier. What does cross is key-sized: the keys of a pull (its dedup, admission and the
chain's bookkeeping run on the host), a lookup's keys when some miss, bag offsets, and
row handles and positions going back up; 8 bytes a key against 4 * dim for a row. Those
copies are counted in the tier's stats (``key_bytes_to_host``, ``key_bytes_to_device``).
Rows the top tier lacks are read below on the host and uploaded in one batched copy through
the tier's pinned staging.

``DevicePath`` checks and moves a call's arrays; ``DeviceBatch`` is a pulled batch's device
side (its inverse and bags on the device, the bag combine and its backward).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from evdb._types import Int64Array
from evdb.bags import Bags, parse_bags
from evdb.errors import InvalidArgumentError, InvalidTypeError
from evdb.tiers.base import CacheTier
from evdb.tiers.hbm import DeviceCache

__all__ = ["DeviceBatch", "DevicePath", "device_path"]


def device_path(top: CacheTier) -> DevicePath | None:
    """The device path of a table over ``top``, or None where its top tier is on the host."""
    return DevicePath(top) if isinstance(top, DeviceCache) else None


class DevicePath:
    """A table's device arrays in and out of its ``DeviceCache`` top tier."""

    def __init__(self, tier: DeviceCache) -> None:
        self.tier = tier
        self.cp = tier.cupy
        self.ndarray = self.cp.ndarray
        with self.context():
            # Where this tier's arrays live, in DLPack's terms: a tensor there is taken as is
            self.dlpack_device = tuple(self.cp.empty(0).__dlpack_device__())

    def context(self) -> Any:
        """The tier's device made current."""
        return self.tier.device_context()

    def owns(self, x: Any) -> bool:
        """Whether x is a device array (the one dispatch of a call)."""
        return isinstance(x, self.ndarray)

    # -- key-sized copies, counted -----------------------------------------------------------
    def keys_to_host(self, x: Any) -> np.ndarray:
        self.tier.key_bytes["to_host"] += int(x.nbytes)
        out: np.ndarray = self.tier.staging.to_host(x)
        return out

    def keys_to_device(self, x: np.ndarray) -> Any:
        self.tier.key_bytes["to_device"] += int(x.nbytes)
        return self.tier.staging.to_device(x)

    def rows_to_device(self, x: np.ndarray) -> Any:
        """Rows read on the host (misses, defaults): one batched copy."""
        return self.tier.staging.to_device(x)

    # -- checks --------------------------------------------------------------------------
    def require(self, x: Any, arg: str) -> Any:
        """x, which must be a device array on this tier's device (a host array is refused:
        the call would copy it silently)."""
        if not self.owns(x):
            raise InvalidArgumentError(
                f"{arg} must be a device array on {self.tier.device} like the keys, got "
                f"{type(x).__module__}.{type(x).__name__} (host arrays go with host keys)"
            )
        return x

    def keys(self, x: Any, arg: str = "keys") -> Any:
        """Device keys as a C-contiguous int64 (n,) device array, or raise."""
        k = self.require(x, arg)
        if k.ndim != 1:
            raise InvalidArgumentError(f"{arg} must be 1-D, got shape {tuple(k.shape)}")
        if np.dtype(k.dtype).kind not in "iu" or k.dtype == np.uint64:
            raise InvalidTypeError(f"{arg} must hold int64 keys (or a narrower int), got {k.dtype}")
        return self.cp.ascontiguousarray(k, dtype=np.int64)

    def float_matrix(self, x: Any, shape: tuple[int, int], arg: str) -> Any:
        """x as a C-contiguous float32 device matrix of shape with only finite values, or
        raise naming the first bad element (found on the device; one index crosses)."""
        a = self.require(x, arg)
        if np.dtype(a.dtype).kind not in "fiu":
            raise InvalidTypeError(f"{arg} must be a float array, got dtype {a.dtype}")
        if tuple(a.shape) != shape:
            raise InvalidArgumentError(f"{arg} must have shape {shape}, got {tuple(a.shape)}")
        with self.context():
            out = self.cp.ascontiguousarray(a, dtype=np.float32)
            bad = ~self.cp.isfinite(out)
            if bool(bad.any()):
                i, j = divmod(int(self.cp.argmax(bad.reshape(-1))), shape[1])
                raise InvalidArgumentError(
                    f"{arg}[{i}, {j}] = {float(out[i, j])} is not finite as float32"
                )
        return out

    def bags(
        self, n: int, offsets: Any, weights: Any, combiner: str | None, max_norm: float | None
    ) -> Bags:
        """``parse_bags`` for device keys: offsets (host or device: key-sized) are checked on
        the host; weights must be on the device and finite; the bags' arrays end on it."""
        if offsets is not None and self.owns(offsets):
            offsets = self.keys_to_host(offsets)
        if offsets is None and weights is not None:
            raise InvalidArgumentError("weights and combiner need offsets (bags of keys)")
        host = parse_bags(n, offsets, None, combiner, max_norm)
        with self.context():
            if weights is None:
                w = self.cp.ones(n, dtype=np.float32)
            else:
                w = self.require(weights, "weights")
                if tuple(w.shape) != (n,):
                    raise InvalidArgumentError(
                        f"weights must have shape ({n},) like keys, got {tuple(w.shape)}"
                    )
                w = self.float_matrix(w.reshape(n, 1), (n, 1), "weights").reshape(n)
            return dataclasses.replace(host, bounds=self.keys_to_device(host.bounds), weights=w)

    def device_bags(self, bags: Bags) -> Bags:
        """Bags parsed on the host, moved to the device (key-sized)."""
        if self.owns(bags.bounds):
            return bags
        with self.context():
            bounds = self.keys_to_device(bags.bounds)
            weights = self.keys_to_device(bags.weights)
        return dataclasses.replace(bags, bounds=bounds, weights=weights)

    def empty_rows(self, n: int, dim: int) -> Any:
        with self.context():
            return self.cp.empty((n, dim), dtype=np.float32)

    def empty_keys(self, n: int) -> Any:
        with self.context():
            return self.cp.empty(n, dtype=np.int64)

    def combine(self, values: Any, bags: Bags, out: Any) -> Any:
        """Bags of per-key device rows (n, dim) combined into out (B, dim) on the device."""
        with self.context():
            positions = self.cp.arange(values.shape[0], dtype=np.int64)
            self.tier.kernels.gather_combine(
                values, positions, bags.bounds, bags.weights, bags.combiner, bags.max_norm, out
            )
        return out

    def check_out(self, out: Any, shape: tuple[int, int]) -> Any:
        """A lookup's out buffer: a device float32 C-contiguous array of shape."""
        if out is None:
            return self.empty_rows(*shape)
        self.require(out, "out")
        if tuple(out.shape) != shape or out.dtype != np.float32 or not out.flags.c_contiguous:
            raise InvalidArgumentError(
                f"out must be a C-contiguous float32 array of shape {shape}, "
                f"got {out.dtype} {tuple(out.shape)}"
            )
        return out

    def put_rows(self, out: Any, at: Int64Array, values: np.ndarray) -> None:
        """out[at] = values (host rows: one batched upload)."""
        if at.shape[0]:
            with self.context():
                out[self.keys_to_device(at)] = self.rows_to_device(values)


class DeviceBatch:
    """A pulled batch's device side: its inverse and bags uploaded once (key-sized), the bag
    combine and its backward run by the tier's kernels on the device rows."""

    def __init__(self, path: DevicePath, inverse: Int64Array) -> None:
        self.path = path
        self._inverse_host = inverse
        self._inverse: Any = None
        self._bags: tuple[Bags, Bags] | None = None  # (as given, on the device)

    def inverse(self) -> Any:
        if self._inverse is None:
            self._inverse = self.path.keys_to_device(self._inverse_host)
        return self._inverse

    def bags(self, bags: Bags) -> Bags:
        """bags on the device; the forward's are kept for its backward (the same object)."""
        if self._bags is not None and self._bags[0] is bags:
            return self._bags[1]
        dev = self.path.device_bags(bags)
        self._bags = (bags, dev)
        return dev

    def combine(self, rows: Any, bags: Bags) -> Any:
        p = self.path
        with p.context():
            b = self.bags(bags)
            out = p.cp.empty((bags.n_bags, rows.shape[1]), dtype=np.float32)
            p.tier.kernels.gather_combine(
                rows, self.inverse(), b.bounds, b.weights, b.combiner, b.max_norm, out
            )
        return out

    def combine_backward(self, grad_out: Any, rows: Any, bags: Bags) -> Any:
        p = self.path
        g = p.float_matrix(grad_out, (bags.n_bags, rows.shape[1]), "grad_out")
        with p.context():
            b = self.bags(bags)
            out = p.cp.empty(rows.shape, dtype=np.float32)
            p.tier.kernels.combine_backward(
                g, rows, self.inverse(), b.bounds, b.weights, b.combiner, b.max_norm, out
            )
        return out
