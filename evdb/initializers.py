"""Stateless initializers, deterministic per (seed, key, column).

An unseen or not-yet-admitted key must read the same vector on every call, tier, device,
process and restart, and be admitted with exactly that vector. So no initializer keeps a
random state: each draws its numbers from a counter-based generator, splitmix64 over
``(seed, key, column, stream)``, the way JAX's threefry or Philox are used. Uniform variates use
53 random bits in float64 and the result is rounded once to float32; the CUDA port computes the
same float64 expression.

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
from evdb.kernels.hashing import GOLDEN_GAMMA, mix64_np

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

_TWO_PI = 2.0 * math.pi
_TRUNCATE_AT = 2.0  # TruncatedNormal keeps draws within 2 std, as tf.truncated_normal does
_MAX_REDRAWS = 64  # P(|z| > 2) = 0.0455, so 64 redraws fail with probability 1e-86


def _uniform01(seed: int, keys: Int64Array, dim: int, stream: int) -> np.ndarray:
    """(n, dim) float64 in the open interval (0, 1), a pure function of its arguments."""
    salt = mix64_np(
        np.array([seed], dtype=np.uint64)
        + np.array([stream], dtype=np.uint64) * GOLDEN_GAMMA  # arrays wrap silently
    )
    base = mix64_np(keys.view(np.uint64) ^ salt)  # (n,)
    cols = (np.arange(1, dim + 1, dtype=np.uint64) * GOLDEN_GAMMA)[None, :]
    bits = mix64_np(base[:, None] + cols)  # (n, dim)
    return ((bits >> np.uint64(11)).astype(np.float64) + 0.5) * (1.0 / 2**53)


def _standard_normal(seed: int, keys: Int64Array, dim: int, stream: int) -> np.ndarray:
    """Box-Muller over streams (2*stream, 2*stream + 1): (n, dim) float64 N(0, 1)."""
    u1 = _uniform01(seed, keys, dim, 2 * stream)
    u2 = _uniform01(seed, keys, dim, 2 * stream + 1)
    z: np.ndarray = np.sqrt(-2.0 * np.log(u1)) * np.cos(_TWO_PI * u2)
    return z


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
        u = _uniform01(self.seed, keys, dim, 0)
        return (self.low + (self.high - self.low) * u).astype(np.float32)


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

    def values(self, keys: Int64Array, dim: int) -> Float32Array:
        z = _standard_normal(self.seed, keys, dim, 0)
        return (self.mean + self.std * z).astype(np.float32)


@dataclass(frozen=True)
class TruncatedNormal(Normal):
    """Normal(mean, std) redrawn until within 2 std of the mean (tf.truncated_normal)."""

    kind: ClassVar[str] = "truncated_normal"

    def values(self, keys: Int64Array, dim: int) -> Float32Array:
        # Redraw stream by stream: element (key, col) takes the first of its own draws that
        # falls inside, so the result does not depend on the other keys in the batch.
        z = _standard_normal(self.seed, keys, dim, 0)
        bad = np.abs(z) > _TRUNCATE_AT
        stream = 1
        while bad.any() and stream < _MAX_REDRAWS:
            rows = np.flatnonzero(bad.any(axis=1))
            redraw = _standard_normal(self.seed, keys[rows], dim, stream)
            sub = bad[rows]
            z[rows] = np.where(sub, redraw, z[rows])
            bad[rows] = sub & (np.abs(redraw) > _TRUNCATE_AT)
            stream += 1
        np.clip(z, -_TRUNCATE_AT, _TRUNCATE_AT, out=z)
        return (self.mean + self.std * z).astype(np.float32)


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
