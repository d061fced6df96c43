"""Optimizers the table applies to its rows in place, as frozen configs.

Each declares ``n_slots`` (float32 slot columns it keeps per row, stored in the row record) and
the scalars its update needs. This issue ships plain SGD; the fused kernels issue adds Adagrad,
Adam, FTRL and friends behind the same interface.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np

from evdb._types import Float32Array
from evdb.errors import ConfigError

__all__ = ["SGD", "Optimizer", "from_dict"]


@dataclass(frozen=True)
class Optimizer:
    """Base of optimizer configs."""

    kind: ClassVar[str] = ""
    n_slots: ClassVar[int] = 0
    lr: float = 0.01

    def __post_init__(self) -> None:
        if (
            isinstance(self.lr, bool)
            or not isinstance(self.lr, (int, float))
            or not (math.isfinite(self.lr) and self.lr > 0)
        ):
            raise ConfigError(
                f"{type(self).__name__}.lr must be a finite number > 0, got {self.lr!r}"
            )

    def initial_slots(self, n: int) -> Float32Array:
        """Slot values (n, n_slots) float32 a freshly created row starts with."""
        return np.zeros((n, self.n_slots), dtype=np.float32)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **asdict(self)}


@dataclass(frozen=True)
class SGD(Optimizer):
    """Plain SGD, ``w -= lr * g`` (torch.optim.SGD without momentum); no slots."""

    kind: ClassVar[str] = "sgd"


_KINDS: dict[str, type[Optimizer]] = {c.kind: c for c in (SGD,)}


def from_dict(d: dict[str, Any]) -> Optimizer:
    """Rebuild an optimizer from ``Optimizer.to_dict()``."""
    fields = dict(d)
    kind = fields.pop("kind", None)
    if kind not in _KINDS:
        raise ConfigError(f"optimizer: unknown kind {kind!r}; expected one of {sorted(_KINDS)}")
    return _KINDS[kind](**fields)
