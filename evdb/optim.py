"""Optimizers the table applies to its rows in place, as frozen configs.

Each declares how many float32 slot columns it keeps per row (stored in the row record, so
they survive close/reopen), what a new row's slots start at, and the scalars the fused kernel
needs for one push (``hyper``). The update itself is ``kernels.*.segment_sum_apply``; the
reference in ``evdb/kernels/reference/optim.py`` is its specification.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np

from evdb._types import Float32Array
from evdb.errors import ConfigError
from evdb.kernels import OptimizerKind as _rules

__all__ = [
    "HALF_PRECISION_NAMES",
    "SGD",
    "Adagrad",
    "AdagradDecay",
    "Adam",
    "Ftrl",
    "GroupFtrl",
    "Optimizer",
    "RowWiseAdagrad",
    "from_dict",
]


def _check(
    name: str,
    value: Any,
    *,
    low: float,
    high: float = math.inf,
    open_low: bool = False,
    open_high: bool = False,
) -> None:
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    ok = ok and (value > low if open_low else value >= low)
    ok = ok and (value < high if open_high else value <= high)
    if not ok:
        lo, hi = ("(" if open_low else "["), (")" if open_high else "]")
        raise ConfigError(f"{name} must be a finite number in {lo}{low}, {high}{hi}, got {value!r}")


@dataclass(frozen=True)
class Optimizer:
    """Base of optimizer configs: ``lr`` is every rule's learning rate."""

    kind: ClassVar[str] = ""
    code: ClassVar[int] = -1
    half_precision: ClassVar[bool] = False
    """Whether the rule has a fused update of half-precision rows (``segment_sum_apply_lowp``):
    what a ``dtype="bfloat16"`` or ``"float16"`` table needs."""
    lr: float = 0.01

    def __post_init__(self) -> None:
        _check(f"{type(self).__name__}.lr", self.lr, low=0.0, open_low=True)

    def n_slots(self, dim: int) -> int:
        """Slot columns per row."""
        return 0

    def initial_slots(self, n: int, dim: int) -> Float32Array:
        """Slots (n, n_slots) float32 a freshly created row starts with."""
        return np.zeros((n, self.n_slots(dim)), dtype=np.float32)

    def hyper(self, step: int, t: int) -> np.ndarray:
        """The kernel's scalars for the push number ``t`` (1-based) at global step ``step``."""
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **asdict(self)}


def _pack(*values: float) -> np.ndarray:
    out = np.zeros(8, dtype=np.float64)
    out[: len(values)] = values
    return out


@dataclass(frozen=True)
class SGD(Optimizer):
    """``w -= lr * (g + weight_decay * w)``, then the group-lasso proximal step
    ``w *= max(0, 1 - lr * group_lasso / |w|)`` (torch.optim.SGD; Yuan & Lin 2006)."""

    kind: ClassVar[str] = "sgd"
    code: ClassVar[int] = _rules.SGD
    half_precision: ClassVar[bool] = True
    weight_decay: float = 0.0
    group_lasso: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _check("SGD.weight_decay", self.weight_decay, low=0.0)
        _check("SGD.group_lasso", self.group_lasso, low=0.0)

    def hyper(self, step: int, t: int) -> np.ndarray:
        return _pack(self.lr, self.weight_decay, self.group_lasso)


@dataclass(frozen=True)
class Adagrad(Optimizer):
    """``acc += g^2; w -= lr * g / (sqrt(acc) + eps)`` with g including ``weight_decay * w``,
    then the group-lasso proximal step (torch.optim.Adagrad with initial_accumulator_value;
    eps=0 gives tf.compat.v1.train.AdagradOptimizer). Slots: acc (dim)."""

    kind: ClassVar[str] = "adagrad"
    code: ClassVar[int] = _rules.ADAGRAD
    half_precision: ClassVar[bool] = True
    initial_accumulator: float = 0.1
    eps: float = 1e-10
    weight_decay: float = 0.0
    group_lasso: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _check("Adagrad.initial_accumulator", self.initial_accumulator, low=0.0)
        _check("Adagrad.eps", self.eps, low=0.0)
        _check("Adagrad.weight_decay", self.weight_decay, low=0.0)
        _check("Adagrad.group_lasso", self.group_lasso, low=0.0)
        if self.initial_accumulator == 0 and self.eps == 0:
            raise ConfigError("Adagrad needs initial_accumulator > 0 or eps > 0 (else 0/0)")

    def n_slots(self, dim: int) -> int:
        return dim

    def initial_slots(self, n: int, dim: int) -> Float32Array:
        return np.full((n, dim), self.initial_accumulator, dtype=np.float32)

    def hyper(self, step: int, t: int) -> np.ndarray:
        return _pack(self.lr, self.eps, self.weight_decay, self.group_lasso)


@dataclass(frozen=True)
class Adam(Optimizer):
    """Lazy Adam, as torch.optim.SparseAdam: only rows in the batch move; t counts the pushes
    this table has applied; ``1 - beta^t`` and the step size are computed in float64.
    Slots: m (dim), v (dim)."""

    kind: ClassVar[str] = "adam"
    code: ClassVar[int] = _rules.ADAM
    half_precision: ClassVar[bool] = True
    lr: float = 0.001
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8

    def __post_init__(self) -> None:
        super().__post_init__()
        _check("Adam.beta1", self.beta1, low=0.0, high=1.0, open_high=True)
        _check("Adam.beta2", self.beta2, low=0.0, high=1.0, open_high=True)
        _check("Adam.eps", self.eps, low=0.0)

    def n_slots(self, dim: int) -> int:
        return 2 * dim

    def hyper(self, step: int, t: int) -> np.ndarray:
        bias1 = 1.0 - self.beta1**t
        bias2 = 1.0 - self.beta2**t
        return _pack(self.lr * math.sqrt(bias2) / bias1, self.beta1, self.beta2, self.eps)


@dataclass(frozen=True)
class Ftrl(Optimizer):
    """FTRL-proximal, element-wise, as TF's ApplyFtrl: ``n' = n + g^2;
    z += g - (n'^-p - n^-p) / lr * w; w = (sign(z) l1 - z) / (n'^-p / lr + 2 l2)`` if
    ``|z| > l1`` else 0, with p = lr_power (McMahan et al. 2013). Slots: n (dim), z (dim)."""

    kind: ClassVar[str] = "ftrl"
    code: ClassVar[int] = _rules.FTRL
    lr_power: float = -0.5
    l1: float = 0.0
    l2: float = 0.0
    initial_accumulator: float = 0.1

    def __post_init__(self) -> None:
        super().__post_init__()
        name = type(self).__name__
        _check(f"{name}.lr_power", self.lr_power, low=-math.inf, high=0.0)
        _check(f"{name}.l1", self.l1, low=0.0)
        _check(f"{name}.l2", self.l2, low=0.0)
        _check(f"{name}.initial_accumulator", self.initial_accumulator, low=0.0)

    def n_slots(self, dim: int) -> int:
        return 2 * dim

    def initial_slots(self, n: int, dim: int) -> Float32Array:
        slots = np.zeros((n, 2 * dim), dtype=np.float32)
        slots[:, :dim] = self.initial_accumulator
        return slots

    def hyper(self, step: int, t: int) -> np.ndarray:
        return _pack(self.lr, self.lr_power, self.l1, self.l2)


@dataclass(frozen=True)
class GroupFtrl(Ftrl):
    """Row-wise FTRL as DeepRec's EmbeddingVariable uses it: n and z update element-wise as in
    :class:`Ftrl`, then with |z| the L2 norm of the row's z,
    ``w = (l1 z / |z| - z) / (n'^-p / lr + 2 l2)`` if ``|z| > l1``, else the whole row is 0."""

    kind: ClassVar[str] = "group_ftrl"
    code: ClassVar[int] = _rules.GROUP_FTRL


@dataclass(frozen=True)
class AdagradDecay(Optimizer):
    """DeepRec's AdagradDecayV2: before adding g^2, when ``(db.step + 1) % decay_steps == 0``
    the accumulator becomes ``max(acc * decay_rate, initial_accumulator)``; then
    ``acc += g^2; w -= lr * g / sqrt(acc)``. Slots: acc (dim)."""

    kind: ClassVar[str] = "adagrad_decay"
    code: ClassVar[int] = _rules.ADAGRAD_DECAY
    initial_accumulator: float = 0.1
    decay_steps: int = 100_000
    decay_rate: float = 0.9

    def __post_init__(self) -> None:
        super().__post_init__()
        _check("AdagradDecay.initial_accumulator", self.initial_accumulator, low=0.0, open_low=True)
        if (
            isinstance(self.decay_steps, bool)
            or not isinstance(self.decay_steps, int)
            or (self.decay_steps < 1)
        ):
            raise ConfigError(
                f"AdagradDecay.decay_steps must be an int >= 1, got {self.decay_steps!r}"
            )
        _check("AdagradDecay.decay_rate", self.decay_rate, low=0.0, high=1.0)

    def n_slots(self, dim: int) -> int:
        return dim

    def initial_slots(self, n: int, dim: int) -> Float32Array:
        return np.full((n, dim), self.initial_accumulator, dtype=np.float32)

    def hyper(self, step: int, t: int) -> np.ndarray:
        decay_now = float((step + 1) % self.decay_steps == 0)
        return _pack(self.lr, decay_now, self.decay_rate, self.initial_accumulator)


@dataclass(frozen=True)
class RowWiseAdagrad(Optimizer):
    """FBGEMM's row-wise Adagrad: one accumulator per row, ``acc += mean(g^2);
    w -= lr * g / (sqrt(acc) + eps)``. Slots: acc (1 column)."""

    kind: ClassVar[str] = "rowwise_adagrad"
    code: ClassVar[int] = _rules.ROWWISE_ADAGRAD
    half_precision: ClassVar[bool] = True
    eps: float = 1e-8

    def __post_init__(self) -> None:
        super().__post_init__()
        _check("RowWiseAdagrad.eps", self.eps, low=0.0, open_low=True)

    def n_slots(self, dim: int) -> int:
        return 1

    def hyper(self, step: int, t: int) -> np.ndarray:
        return _pack(self.lr, self.eps)


_KINDS: dict[str, type[Optimizer]] = {
    c.kind: c for c in (SGD, Adagrad, Adam, Ftrl, GroupFtrl, AdagradDecay, RowWiseAdagrad)
}


# The optimizers a half-precision table can use (named in its ConfigError).
HALF_PRECISION_NAMES = tuple(c.__name__ for c in _KINDS.values() if c.half_precision)


def from_dict(d: dict[str, Any]) -> Optimizer:
    """Rebuild an optimizer from ``Optimizer.to_dict()``."""
    fields = dict(d)
    kind = fields.pop("kind", None)
    if kind not in _KINDS:
        raise ConfigError(f"optimizer: unknown kind {kind!r}; expected one of {sorted(_KINDS)}")
    return _KINDS[kind](**fields)
