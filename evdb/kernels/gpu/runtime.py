"""What every gpu kernel wrapper shares: cupy, imported on first use, the CUDA sources and
their compiled modules memoised per device, launches, and the checks of arguments.

cupy is imported only when a kernel runs (``cupy_module``), so ``import evdb.kernels.gpu``
works without it; ``require()`` raises :class:`~evdb.errors.ConfigError` with install advice
when cupy or a CUDA device is missing.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import numpy as np

from evdb.errors import ConfigError, InvalidArgumentError, InvalidTypeError

__all__ = [
    "BLOCK",
    "CUDA_DIR",
    "NVRTC_OPTIONS",
    "SHARED_BYTES",
    "SOURCES",
    "check_array",
    "check_slots",
    "cuda_kernel",
    "cupy_module",
    "f64",
    "group_size",
    "i32",
    "i64",
    "launch",
    "require",
    "source_text",
    "u64",
]

CUDA_DIR = Path(__file__).parent.with_name("cuda")  # evdb/kernels/cuda
SOURCES = ("index", "bags", "optim", "init", "stamp", "evict", "merge", "lowp")
# --fmad=false: no fused multiply-adds, so a device's arithmetic is the reference's and the CPU
# executor's (g++ -ffp-contract=off) step for step, and a device table stays bit for bit its
# emulated twin (NVRTC fuses a * b + c by default: a last-bit difference in a slot).
NVRTC_OPTIONS = ("--std=c++17", "--fmad=false")
BLOCK = 256  # threads per block: 8 warps, enough to hide a probe's miss on every SM
SHARED_BYTES = 48 * 1024  # dynamic shared memory available without an opt-in attribute

_INCLUDE = re.compile(r'^#include "([^"]+)"[^\n]*$', re.MULTILINE)
_U64 = (1 << 64) - 1


def cupy_module() -> Any:
    """The cupy module, or a ConfigError saying how to get a working one."""
    try:
        import cupy
    except ImportError as exc:  # also a broken install (no CUDA runtime for the wheel)
        raise ConfigError(f"the gpu backend needs cupy: pip install evdb[gpu] ({exc})") from exc
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # CUDARuntimeError: no driver, or no device visible
        raise ConfigError(f"the gpu backend found no CUDA device ({exc})") from exc
    if count == 0:
        raise ConfigError("the gpu backend found no CUDA device")
    return cupy


def require() -> None:
    """Raise ConfigError unless cupy imports and a CUDA device is present."""
    cupy_module()


def source_text(name: str) -> str:
    """The CUDA source ``cuda/<name>.cu`` with its local headers pasted in, once each.

    Pasting (rather than ``-I``) makes cupy's compile cache key on the headers too, and lets
    NVRTC compile the text without an include path.
    """
    seen: set[str] = set()

    def expand(filename: str) -> str:
        if filename in seen:
            return ""
        seen.add(filename)
        text = (CUDA_DIR / filename).read_text(encoding="utf-8")
        return _INCLUDE.sub(lambda m: expand(m.group(1)), text)

    return expand(f"{name}.cu")


@functools.cache
def _module(device_id: int, source: str) -> Any:
    cp = cupy_module()
    with cp.cuda.Device(device_id):
        return cp.RawModule(code=source_text(source), options=NVRTC_OPTIONS)


@functools.cache
def _function(device_id: int, source: str, name: str) -> Any:
    cp = cupy_module()
    with cp.cuda.Device(device_id):
        return _module(device_id, source).get_function(name)


def cuda_kernel(source: str, name: str) -> Any:
    """Kernel ``name`` of ``cuda/<source>.cu`` on the current device, compiled on first use
    (tests/gpu checks that every ``cuda_kernel("source", "name")`` call of the package names
    an entry of the compiled source: call it with two literals)."""
    cp = cupy_module()
    return _function(int(cp.cuda.runtime.getDevice()), source, name)


def launch(
    fn: Any, n_threads: int, args: tuple[Any, ...], *, block: int = BLOCK, shared: int = 0
) -> None:
    """Run kernel ``fn`` on cupy's current stream over ``n_threads`` threads (none: nothing
    is launched), in blocks of ``block`` threads with ``shared`` bytes of shared memory."""
    if n_threads <= 0:
        return
    fn(((n_threads + block - 1) // block,), (block,), args, shared_mem=shared)


def group_size(dim: int) -> int:
    """Lanes per row: the power of two >= dim, within 4..32 (a warp)."""
    g = 4
    while g < 32 and g < dim:
        g *= 2
    return g


def i32(x: Any) -> np.int32:
    """x as a kernel's ``int`` argument."""
    return np.int32(int(x))


def i64(x: Any) -> np.int64:
    """x as a kernel's ``long long`` argument."""
    return np.int64(int(x))


def u64(x: Any) -> np.uint64:
    """x as a kernel's ``unsigned long long`` argument (a seed)."""
    return np.uint64(int(x) & _U64)  # a negative seed wraps as numpy's uint64 view does


def f64(x: Any) -> np.float64:
    """x as a kernel's ``double`` argument."""
    return np.float64(float(x))


def check_array(name: str, a: Any, dtype: Any, ndim: int) -> Any:
    """a itself, after checking it is a C-contiguous cupy array of dtype and ndim."""
    cp = cupy_module()
    if not isinstance(a, cp.ndarray):
        raise InvalidTypeError(f"{name}: expected a cupy array, got {type(a).__name__}")
    if a.dtype != np.dtype(dtype) or a.ndim != ndim:
        raise InvalidTypeError(
            f"{name}: expected {ndim}-d {np.dtype(dtype)}, got {a.ndim}-d {a.dtype}"
        )
    if not a.flags.c_contiguous:
        raise InvalidArgumentError(f"{name}: must be C-contiguous")
    return a


def check_slots(slots: Any) -> tuple[Any, np.int64]:
    """The hash index ``slots (cap, 2) int64`` and its capacity, after checking that cap is
    a power of two."""
    check_array("slots", slots, np.int64, 2)
    cap = slots.shape[0]
    if slots.shape[1] != 2 or cap & (cap - 1) or cap == 0:
        raise InvalidArgumentError(
            f"slots: expected (cap, 2) with cap a power of two, got {slots.shape}"
        )
    return slots, i64(cap)
