"""A stand-in for cupy on the CPU: the parts of cupy's API that evdb uses, over numpy.

Install it as ``cupy`` with the ``standin_cupy`` fixture (tests/conftest.py). Device arrays
are :class:`ndarray` (``_core``), NOT numpy arrays: numpy refuses them (``numpy.asarray``
raises TypeError, as with cupy), and every function here refuses a numpy array where cupy
would need an implicit transfer. The explicit transfers are cupy's: ``asarray`` /
``array`` / ``ascontiguousarray`` of a host array, ``ndarray.set``, ``asnumpy``,
``ndarray.get``; they are counted in ``transfers()``. ``RawModule`` is the CPU execution
backend's (``tests.cuda_cpu.rawmodule``), imported on first use.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np

from tests.cuda_cpu.cupy_standin import _state, cuda
from tests.cuda_cpu.cupy_standin._core import ndarray, unwrap, wrap

__version__ = "13.99.0+evdb.cpu.standin"
STANDIN = True  # what a test checks to know which cupy it runs on

bool_, int8, int16, int32, int64 = np.bool_, np.int8, np.int16, np.int32, np.int64
uint8, uint16, uint32, uint64 = np.uint8, np.uint16, np.uint32, np.uint64
float16, float32, float64, intp, dtype = np.float16, np.float32, np.float64, np.intp, np.dtype
nan, inf, newaxis = np.nan, np.inf, None


def transfers() -> dict[str, int]:
    """Copies between host and device so far, by direction (``to_device``, ``to_host``)."""
    return dict(_state.STATE.transfers)


def _on_device(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """numpy's fn over device arrays: host arrays refused, results wrapped."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        what = f"cupy.{name}"
        out = kwargs.get("out")
        np_args = unwrap(args, what)
        np_kwargs = {k: unwrap(v, what) for k, v in kwargs.items()}
        if out is None:
            np_kwargs.pop("out", None)
        result = fn(*np_args, **np_kwargs)
        return out if out is not None else wrap(result)

    return call


def _creating(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> ndarray:
        return wrap(fn(*unwrap(args, f"cupy.{name}"), **kwargs))

    return call


empty = _creating(np.empty, "empty")
zeros = _creating(np.zeros, "zeros")
ones = _creating(np.ones, "ones")
full = _creating(np.full, "full")
arange = _creating(np.arange, "arange")
linspace = _creating(np.linspace, "linspace")
empty_like = _on_device(np.empty_like, "empty_like")
zeros_like = _on_device(np.zeros_like, "zeros_like")
ones_like = _on_device(np.ones_like, "ones_like")
full_like = _on_device(np.full_like, "full_like")

_SAME = (
    "all any argmax argmin argpartition argsort clip concatenate count_nonzero cumsum "
    "flatnonzero isin maximum minimum nonzero searchsorted sort sqrt stack abs sum where "
    "logical_and logical_or logical_not bincount repeat diff exp log equal isfinite"
).split()
for _name in _SAME:
    globals()[_name] = _on_device(getattr(np, _name), _name)


def unique(ar: Any, return_index: bool = False, return_inverse: bool = False,
           return_counts: bool = False, axis: Any = None) -> Any:  # fmt: skip
    result = np.unique(
        unwrap(ar, "cupy.unique"), return_index=return_index, return_inverse=return_inverse,
        return_counts=return_counts, axis=axis,
    )  # fmt: skip
    return wrap(result)


def take(a: Any, indices: Any, axis: Any = None, out: Any = None) -> Any:
    kw = {} if out is None else {"out": unwrap(out, "cupy.take")}
    result = np.take(unwrap(a, "cupy.take"), unwrap(indices, "cupy.take"), axis=axis, **kw)
    return out if out is not None else wrap(result)


def copyto(dst: ndarray, src: Any, casting: str = "same_kind", where: Any = True) -> None:
    np.copyto(
        unwrap(dst, "cupy.copyto"), unwrap(src, "cupy.copyto"), casting=casting,  # type: ignore[arg-type]
        where=unwrap(where, "cupy.copyto"),
    )  # fmt: skip


# -- transfers -----------------------------------------------------------------------------
def asarray(a: Any, dtype: Any = None, order: Any = None) -> ndarray:
    """A device array of a: itself if it is one (of that dtype); a host array is copied."""
    if isinstance(a, ndarray):
        return a if dtype is None or a.dtype == np.dtype(dtype) else a.astype(dtype)
    host = np.asarray(unwrap(a, "cupy.asarray") if isinstance(a, (list, tuple)) else a, dtype)
    _state.count_transfer("to_device", host.nbytes)
    return wrap(np.array(host, order=order or "K"))


def array(obj: Any, dtype: Any = None, copy: bool = True, order: str = "K") -> ndarray:
    if isinstance(obj, ndarray):
        out = obj.astype(dtype or obj.dtype, order=order, copy=copy)
        return out
    return asarray(obj, dtype=dtype, order=order)


def ascontiguousarray(a: Any, dtype: Any = None) -> ndarray:
    if isinstance(a, ndarray):
        if a.flags.c_contiguous and (dtype is None or a.dtype == np.dtype(dtype)):
            return a
        return wrap(np.ascontiguousarray(a._storage, dtype=dtype))
    return asarray(np.ascontiguousarray(a, dtype=dtype))


def asnumpy(a: Any, stream: Any = None, order: str = "C", out: Any = None) -> np.ndarray:
    """A host copy of a device array (a host array is returned as is, as cupy does)."""
    if isinstance(a, ndarray):
        return a.get(stream=stream, order=order, out=out)  # type: ignore[no-any-return]
    return np.asarray(a, order=order)  # type: ignore[call-overload, no-any-return]


def from_dlpack(x: Any) -> ndarray:
    """A device array over another library's memory, without a copy (here: host memory,
    so on CPU torch the DLPack path itself runs in CI)."""
    return wrap(np.from_dlpack(x))


fromDlpack = from_dlpack


def get_array_module(*args: Any) -> Any:
    import sys

    return sys.modules[__name__] if any(isinstance(a, ndarray) for a in args) else np


def get_default_memory_pool() -> Any:
    return cuda._POOL


def get_default_pinned_memory_pool() -> Any:
    return cuda._POOL


linalg = SimpleNamespace(norm=_on_device(np.linalg.norm, "linalg.norm"))


class _Random:
    """cupy.random: a module-level generator, seeded by ``seed``."""

    def __init__(self) -> None:
        self._rng = np.random.default_rng(0)

    def seed(self, seed: int | None = None) -> None:
        self._rng = np.random.default_rng(seed)

    def permutation(self, n: Any) -> ndarray:
        return wrap(self._rng.permutation(unwrap(n, "cupy.random.permutation")))

    def randint(self, low: int, high: int | None = None, size: Any = None, dtype: Any = int) -> Any:
        return wrap(np.asarray(self._rng.integers(low, high, size, dtype=dtype)))

    def random(self, size: Any = None, dtype: Any = np.float64) -> Any:
        return wrap(np.asarray(self._rng.random(size, dtype=dtype)))

    def standard_normal(self, size: Any = None, dtype: Any = np.float64) -> Any:
        return wrap(np.asarray(self._rng.standard_normal(size, dtype=dtype)))


random = _Random()


def __getattr__(name: str) -> Any:
    if name == "RawModule":  # the CPU execution backend, built on first use
        from tests.cuda_cpu.rawmodule import RawModule

        return RawModule
    raise AttributeError(f"the cupy stand-in has no {name!r} (add it if evdb needs it)")
