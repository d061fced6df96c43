"""The cpu (numba) kernels behind stand-in device arrays: a fast mode, not the CUDA source.

``numba_kernels()`` has every name of ``evdb.kernels.KERNELS`` with the gpu backend's
signature: it refuses a host (numpy) array as the gpu wrappers do (``InvalidTypeError``),
unwraps each device array to its ``_storage`` and calls the cpu kernel of the same name and
argument order, which writes in place into the device arrays' memory. The tier's whole cupy
path (device arrays, transfers, the mixing checks) runs on it at numba's speed; what it does
not run is the CUDA C, which ``backend("gpu")`` on the stand-in (``rawmodule``) does. Tests
say which one they use.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np

from evdb.errors import InvalidTypeError
from evdb.kernels import KERNELS, backend

__all__ = ["numba_kernels"]


# Host arrays the gpu wrappers take as such: the optimizer's scalars, passed as arguments.
_HOST_ARGS = {("segment_sum_apply", 5), ("segment_sum_apply_lowp", 6)}


def _device_args(name: str, args: tuple[Any, ...]) -> list[Any]:
    out = []
    for i, a in enumerate(args):
        if isinstance(a, np.ndarray) and (name, i) not in _HOST_ARGS:
            raise InvalidTypeError(f"{name}: argument {i}: expected a cupy array, got a numpy one")
        out.append(a._storage if hasattr(a, "_storage") else a)
    return out


def _adapted(name: str, kernel: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        return kernel(*_device_args(name, args))

    call.__name__ = name
    return call


def numba_kernels() -> SimpleNamespace:
    """A kernel backend over stand-in device arrays that runs the cpu kernels (see above)."""
    cpu = backend("cpu")
    return SimpleNamespace(
        **{name: _adapted(name, getattr(cpu, name)) for name in KERNELS}, name="numba-adapter"
    )
