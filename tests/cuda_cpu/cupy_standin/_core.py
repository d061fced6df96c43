"""The stand-in's device array: a numpy array behind a wall that only explicit transfers cross.

``ndarray`` holds its memory in ``_storage`` (a numpy array; a view of a device array is a
device array over a numpy view). Every operation unwraps device operands, runs numpy on the
storage and wraps the result again, and refuses a numpy array where cupy would not accept
one implicitly (cupy: "Implicit conversion to a NumPy array is not allowed"). Reductions
return 0-d device arrays, as cupy's do; ``int()``/``float()``/``bool()`` read them back.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np

from tests.cuda_cpu.cupy_standin import _state

__all__ = ["Mixing", "ndarray", "unwrap", "wrap"]

Mixing = TypeError


def _refuse(what: str) -> TypeError:
    return TypeError(
        f"{what}: a numpy.ndarray where a device array is needed (cupy refuses implicit "
        "host -> device transfers here; use cupy.asarray)"
    )


def unwrap(x: Any, what: str) -> Any:
    """The numpy value of an operand: a device array's storage, a scalar itself; a host
    array (or a list holding one) raises."""
    if isinstance(x, ndarray):
        return x._storage
    if isinstance(x, np.ndarray):
        raise _refuse(what)
    if isinstance(x, (list, tuple)):
        return type(x)(unwrap(v, what) for v in x)
    return x


def _index(key: Any, what: str) -> Any:
    if isinstance(key, tuple):
        return tuple(_index(k, what) for k in key)
    if isinstance(key, list):  # cupy takes a list as an index array
        return np.asarray(unwrap(key, what))
    return unwrap(key, what)


def wrap(value: Any, device: int | None = None) -> Any:
    """A numpy result as a device array (numpy scalars become 0-d device arrays)."""
    if isinstance(value, np.ndarray):
        return ndarray._of(value, device)
    if isinstance(value, np.generic):
        return ndarray._of(np.asarray(value), device)
    if isinstance(value, tuple):
        return tuple(wrap(v, device) for v in value)
    return value


def _binary(op: Callable[[Any, Any], Any], name: str) -> Callable[[Any, Any], Any]:
    def method(self: ndarray, other: Any) -> Any:
        return wrap(op(self._storage, unwrap(other, f"ndarray.{name}")), self._device)

    method.__name__ = name
    return method


def _reflected(op: Callable[[Any, Any], Any], name: str) -> Callable[[Any, Any], Any]:
    def method(self: ndarray, other: Any) -> Any:
        return wrap(op(unwrap(other, f"ndarray.{name}"), self._storage), self._device)

    method.__name__ = name
    return method


def _inplace(op: Callable[[Any, Any], Any], name: str) -> Callable[[Any, Any], Any]:
    def method(self: ndarray, other: Any) -> Any:
        op(self._storage, unwrap(other, f"ndarray.{name}"))
        return self

    method.__name__ = name
    return method


def _reduction(name: str) -> Callable[..., Any]:
    def method(self: ndarray, *args: Any, **kwargs: Any) -> Any:
        args = unwrap(args, f"ndarray.{name}")
        kwargs = {k: unwrap(v, f"ndarray.{name}") for k, v in kwargs.items()}
        if "out" in kwargs and kwargs["out"] is None:
            del kwargs["out"]
        return wrap(getattr(self._storage, name)(*args, **kwargs), self._device)

    method.__name__ = name
    return method


class ndarray:
    """A device array of the stand-in: cupy.ndarray's interface over ``_storage``."""

    __array_priority__ = 100
    __array_ufunc__ = None  # numpy's operators return NotImplemented: ours raise instead

    _storage: np.ndarray
    _device: int

    def __init__(self, shape: Any, dtype: Any = float, memptr: Any = None, order: str = "C"):
        if memptr is not None:
            raise NotImplementedError("stand-in ndarray: memptr is not supported")
        self._storage = np.empty(shape, dtype=dtype, order=order)  # type: ignore[call-overload]
        self._device = _state.current_device()

    @classmethod
    def _of(cls, storage: np.ndarray, device: int | None = None) -> ndarray:
        a = cls.__new__(cls)
        a._storage = storage
        a._device = _state.current_device() if device is None else device
        return a

    # -- what cupy refuses ------------------------------------------------------------------
    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise TypeError(
            "Implicit conversion to a NumPy array is not allowed. Please use `.get()` to "
            "construct a NumPy array explicitly."
        )

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        # cupy dispatches numpy functions to its own of the same name (NEP 18)
        import tests.cuda_cpu.cupy_standin as cp

        mine = getattr(cp, func.__name__, None)
        if mine is None or not callable(mine):
            raise TypeError(f"numpy.{func.__name__} is not supported on stand-in device arrays")
        return mine(*args, **kwargs)

    def __iter__(self) -> Any:
        return (self[i] for i in range(len(self)))

    # -- attributes -------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self._storage.shape

    @property
    def dtype(self) -> np.dtype:
        return self._storage.dtype

    @property
    def ndim(self) -> int:
        return self._storage.ndim

    @property
    def size(self) -> int:
        return int(self._storage.size)

    @property
    def nbytes(self) -> int:
        return int(self._storage.nbytes)

    @property
    def itemsize(self) -> int:
        return int(self._storage.itemsize)

    @property
    def strides(self) -> tuple[int, ...]:
        return self._storage.strides

    @property
    def flags(self) -> Any:
        return self._storage.flags

    @property
    def device(self) -> Any:
        from tests.cuda_cpu.cupy_standin.cuda import Device

        return Device(self._device)

    @property
    def T(self) -> ndarray:
        return ndarray._of(self._storage.T, self._device)

    def __len__(self) -> int:
        return len(self._storage)

    def __repr__(self) -> str:
        return f"stand-in device array({self._storage!r}, device={self._device})"

    # -- transfers --------------------------------------------------------------------------
    def get(self, stream: Any = None, order: str = "C", out: np.ndarray | None = None) -> Any:
        """Device -> host: a new numpy array, or into ``out`` (a host array of this shape)."""
        _state.count_transfer("to_host", self.nbytes)
        if out is None:
            return np.array(self._storage, order=order)  # type: ignore[call-overload]
        if not isinstance(out, np.ndarray) or out.shape != self.shape or out.dtype != self.dtype:
            raise ValueError("ndarray.get: out must be a numpy array of the same shape and dtype")
        out[...] = self._storage
        return out

    def set(self, arr: np.ndarray, stream: Any = None) -> None:
        """Host -> device, in place: arr must match this array's shape and dtype."""
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"ndarray.set: expected a numpy array, got {type(arr).__name__}")
        if arr.shape != self.shape or arr.dtype != self.dtype:
            raise ValueError(f"ndarray.set: shape/dtype mismatch: {arr.shape} {arr.dtype}")
        _state.count_transfer("to_device", arr.nbytes)
        self._storage[...] = arr

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self._storage.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._storage.__dlpack_device__()  # host memory: kDLCPU (CI has no CUDA)

    def toDlpack(self) -> Any:
        return self._storage.__dlpack__()

    # -- scalars ----------------------------------------------------------------------------
    def item(self) -> Any:
        return self._storage.item()

    def tolist(self) -> Any:
        return self._storage.tolist()

    def __int__(self) -> int:
        return int(self._storage)

    def __float__(self) -> float:
        return float(self._storage)

    def __bool__(self) -> bool:
        return bool(self._storage)

    def __complex__(self) -> complex:
        return complex(self._storage)

    # -- indexing ---------------------------------------------------------------------------
    def __getitem__(self, key: Any) -> ndarray:
        return ndarray._of(self._storage[_index(key, "ndarray.__getitem__")], self._device)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._storage[_index(key, "ndarray.__setitem__")] = unwrap(value, "ndarray.__setitem__")

    # -- methods ----------------------------------------------------------------------------
    def astype(self, dtype: Any, order: str = "K", casting: Any = None, copy: bool = True) -> Any:
        kw = {} if casting is None else {"casting": casting}
        return ndarray._of(self._storage.astype(dtype, order=order, copy=copy, **kw), self._device)

    def copy(self, order: str = "C") -> ndarray:
        return ndarray._of(self._storage.copy(order=order), self._device)  # type: ignore[arg-type]

    def fill(self, value: Any) -> None:
        self._storage.fill(unwrap(value, "ndarray.fill"))

    def view(self, dtype: Any = None) -> ndarray:
        return ndarray._of(self._storage.view(dtype), self._device)

    def reshape(self, *shape: Any, order: str = "C") -> ndarray:
        return ndarray._of(self._storage.reshape(*shape, order=order), self._device)  # type: ignore[call-overload]

    def ravel(self, order: str = "C") -> ndarray:
        return ndarray._of(self._storage.ravel(order=order), self._device)  # type: ignore[arg-type]

    def flatten(self) -> ndarray:
        return ndarray._of(self._storage.flatten(), self._device)

    def squeeze(self, axis: Any = None) -> ndarray:
        return ndarray._of(self._storage.squeeze(axis), self._device)

    def transpose(self, *axes: Any) -> ndarray:
        return ndarray._of(self._storage.transpose(*axes), self._device)

    def take(self, indices: Any, axis: Any = None, out: Any = None) -> Any:
        import tests.cuda_cpu.cupy_standin as cp

        return cp.take(self, indices, axis=axis, out=out)

    def nonzero(self) -> tuple[ndarray, ...]:
        return tuple(ndarray._of(i, self._device) for i in self._storage.nonzero())

    sum = _reduction("sum")
    prod = _reduction("prod")
    mean = _reduction("mean")
    min = _reduction("min")
    max = _reduction("max")
    argmin = _reduction("argmin")
    argmax = _reduction("argmax")
    any = _reduction("any")
    all = _reduction("all")
    cumsum = _reduction("cumsum")
    clip = _reduction("clip")
    dot = _reduction("dot")

    __add__, __radd__, __iadd__ = (
        _binary(operator.add, "__add__"),
        _reflected(operator.add, "__radd__"),
        _inplace(operator.iadd, "__iadd__"),
    )
    __sub__, __rsub__, __isub__ = (
        _binary(operator.sub, "__sub__"),
        _reflected(operator.sub, "__rsub__"),
        _inplace(operator.isub, "__isub__"),
    )
    __mul__, __rmul__, __imul__ = (
        _binary(operator.mul, "__mul__"),
        _reflected(operator.mul, "__rmul__"),
        _inplace(operator.imul, "__imul__"),
    )
    __truediv__, __rtruediv__, __itruediv__ = (
        _binary(operator.truediv, "__truediv__"),
        _reflected(operator.truediv, "__rtruediv__"),
        _inplace(operator.itruediv, "__itruediv__"),
    )
    __floordiv__, __rfloordiv__, __ifloordiv__ = (
        _binary(operator.floordiv, "__floordiv__"),
        _reflected(operator.floordiv, "__rfloordiv__"),
        _inplace(operator.ifloordiv, "__ifloordiv__"),
    )
    __mod__, __rmod__, __imod__ = (
        _binary(operator.mod, "__mod__"),
        _reflected(operator.mod, "__rmod__"),
        _inplace(operator.imod, "__imod__"),
    )
    __pow__, __rpow__ = _binary(operator.pow, "__pow__"), _reflected(operator.pow, "__rpow__")
    __and__, __rand__, __iand__ = (
        _binary(operator.and_, "__and__"),
        _reflected(operator.and_, "__rand__"),
        _inplace(operator.iand, "__iand__"),
    )
    __or__, __ror__, __ior__ = (
        _binary(operator.or_, "__or__"),
        _reflected(operator.or_, "__ror__"),
        _inplace(operator.ior, "__ior__"),
    )
    __xor__, __rxor__, __ixor__ = (
        _binary(operator.xor, "__xor__"),
        _reflected(operator.xor, "__rxor__"),
        _inplace(operator.ixor, "__ixor__"),
    )
    __lshift__ = _binary(operator.lshift, "__lshift__")
    __rshift__ = _binary(operator.rshift, "__rshift__")
    __matmul__ = _binary(operator.matmul, "__matmul__")
    __lt__ = _binary(operator.lt, "__lt__")
    __le__ = _binary(operator.le, "__le__")
    __gt__ = _binary(operator.gt, "__gt__")
    __ge__ = _binary(operator.ge, "__ge__")
    __eq__ = _binary(operator.eq, "__eq__")  # type: ignore[assignment]
    __ne__ = _binary(operator.ne, "__ne__")  # type: ignore[assignment]
    __hash__ = None  # type: ignore[assignment]

    def __neg__(self) -> ndarray:
        return ndarray._of(-self._storage, self._device)

    def __pos__(self) -> ndarray:
        return ndarray._of(+self._storage, self._device)

    def __abs__(self) -> ndarray:
        return ndarray._of(abs(self._storage), self._device)

    def __invert__(self) -> ndarray:
        return ndarray._of(~self._storage, self._device)
