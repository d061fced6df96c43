"""Stateless initializers, deterministic per (seed, key, column).

An unseen or not-yet-admitted key must read the same vector on every call, tier, device,
process and restart, and be admitted with exactly that vector. So no initializer keeps a
random state: each draws its numbers from a counter-based generator, splitmix64 over
``(seed, key, column, stream)``, the way JAX's threefry or Philox are used. Uniform variates use
53 random bits in float64 and the result is rounded once to float32. The generators are kernels
(``evdb.kernels.reference.fill_*`` is the spec, ``cpu.fill_*`` what runs), and lookups and pulls
use the same one, so a row starts from exactly the value its key read before admission.

Examples
--------
>>> import numpy as np, evdb
>>> init = evdb.init.Normal(mean=0.0, std=0.01, seed=7)
>>> a = init.values(np.array([3, 42], dtype=np.int64), dim=4)
>>> b = init.values(np.array([42], dtype=np.int64), dim=4)
>>> bool((a[1] == b[0]).all())       # same key, same vector, whatever else is in the batch
True
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np

from evdb._types import Float32Array, Int64Array
from evdb.errors import ConfigError
from evdb.kernels import backend

cpu = backend("cpu")  # bound once: a call costs one attribute lookup

__all__ = [
    "Constant",
    "Initializer",
    "Normal",
    "Ones",
    "TruncatedNormal",
    "Uniform",
    "Zeros",
    "from_dict",
]


def _parse_finite(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def _parse_seed(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64:
        raise ConfigError(f"seed must be an int in [0, 2**64), got {value!r}")
    return value


@dataclass(frozen=True)
class Initializer:
    """Base class: ``values(keys, dim)`` returns the (n, dim) float32 start rows of keys."""

    kind: ClassVar[str] = ""

    def values(self, keys: Int64Array, dim: int) -> Float32Array:
        raise NotImplementedError

    def kernel_params(self) -> tuple[int, int, float, float]:
        """(kind, seed, a, b) for kernels that compute defaults in place: 0 = constant a,
        1 = uniform [a, b), 2 = normal(a, b), 3 = truncated normal(a, b)."""
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **asdict(self)}


@dataclass(frozen=True)
class Constant(Initializer):
    """Every element starts at ``value``."""

    kind: ClassVar[str] = "constant"
    value: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "value", _parse_finite("Constant.value", self.value))

    def values(self, keys: Int64Array, dim: int) -> Float32Array:
        return np.full((keys.shape[0], dim), self.value, dtype=np.float32)

    def kernel_params(self) -> tuple[int, int, float, float]:
        return 0, 0, self.value, 0.0


@dataclass(frozen=True)
class Zeros(Constant):
    """Every element starts at 0."""

    kind: ClassVar[str] = "zeros"
    value: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind}


@dataclass(frozen=True)
class Ones(Constant):
    """Every element starts at 1."""

    kind: ClassVar[str] = "ones"
    value: float = 1.0

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind}


@dataclass(frozen=True)
class Uniform(Initializer):
    """Uniform on [low, high)."""

    kind: ClassVar[str] = "uniform"
    low: float = -0.05
    high: float = 0.05
    seed: int = 0

    def __post_init__(self) -> None:
        low = _parse_finite("Uniform.low", self.low)
        high = _parse_finite("Uniform.high", self.high)
        if not low < high:
            raise ConfigError(f"Uniform needs low < high, got low={low}, high={high}")
        object.__setattr__(self, "low", low)
        object.__setattr__(self, "high", high)
        _parse_seed(self.seed)

    def values(self, keys: Int64Array, dim: int) -> Float32Array:
        out = np.empty((keys.shape[0], dim), dtype=np.float32)
        cpu.fill_uniform(np.ascontiguousarray(keys), np.uint64(self.seed), self.low, self.high, out)
        return out

    def kernel_params(self) -> tuple[int, int, float, float]:
        return 1, self.seed, self.low, self.high


@dataclass(frozen=True)
class Normal(Initializer):
    """Normal(mean, std)."""

    kind: ClassVar[str] = "normal"
    mean: float = 0.0
    std: float = 0.01
    seed: int = 0

    def __post_init__(self) -> None:
        mean = _parse_finite(f"{type(self).__name__}.mean", self.mean)
        std = _parse_finite(f"{type(self).__name__}.std", self.std)
        if std <= 0:
            raise ConfigError(f"{type(self).__name__}.std must be > 0, got {std}")
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "std", std)
        _parse_seed(self.seed)

    _truncate: ClassVar[bool] = False

    def values(self, keys: Int64Array, dim: int) -> Float32Array:
        out = np.empty((keys.shape[0], dim), dtype=np.float32)
        cpu.fill_normal(
            np.ascontiguousarray(keys),
            np.uint64(self.seed),
            self.mean,
            self.std,
            self._truncate,
            out,
        )
        return out

    def kernel_params(self) -> tuple[int, int, float, float]:
        return (3 if self._truncate else 2), self.seed, self.mean, self.std


@dataclass(frozen=True)
class TruncatedNormal(Normal):
    """Normal(mean, std) redrawn until within 2 std of the mean (tf.truncated_normal).

    Each element redraws from its own counter stream, so the result never depends on the
    other keys of the batch."""

    kind: ClassVar[str] = "truncated_normal"

    _truncate: ClassVar[bool] = True


_KINDS: dict[str, type[Initializer]] = {
    c.kind: c for c in (Constant, Zeros, Ones, Uniform, Normal, TruncatedNormal)
}


def from_dict(d: dict[str, Any]) -> Initializer:
    """Rebuild an initializer from ``Initializer.to_dict()``."""
    fields = dict(d)
    kind = fields.pop("kind", None)
    if kind not in _KINDS:
        raise ConfigError(f"initializer: unknown kind {kind!r}; expected one of {sorted(_KINDS)}")
    return _KINDS[kind](**fields)
