"""Reference fused update of half-precision rows: ``segment_sum_apply`` whose values are
stored as bfloat16 (uint16 bits) or float16 (see ``reference.lowp``).

``segment_sum_apply_lowp(grads, positions, bounds, rows, row_keys, kind, hyper, seed, step,
stochastic, values, slots)``: as ``reference.optim.segment_sum_apply``, except that row
``rows[u]`` is read widened to float32, updated by the same rule in float64, rounded to
float32 and then stored rounded to its half format: stochastically with the bits of
(``seed``, ``row_keys[rows[u]]``, ``step``, column), or to nearest even when ``stochastic``
is False. ``row_keys`` is the tier's whole key column (the key of each stored row), read at
the rows the update writes (rows -1 read nothing), so a caller never gathers the keys of a
batch's rows itself: the kernels read a row's key as they read the row.

Slots are float32, or stored in the values' half format (a table's ``slot_dtype``): then they
are widened on read, updated by the same rule, and the row and its slots are rounded as one
record of ``dim + n_slots`` columns, the slots taking columns ``dim .. dim + n_slots - 1``,
so a slot never reuses its row's random bits. (Row-wise Adagrad keeps one accumulator a row:
half slots buy 2 bytes there; Adagrad and Adam keep dim and 2 dim.) Rounding the update's result
directly, without stochastic rounding, loses every update smaller than half an ulp: at
bfloat16's 8 bits, lr * g below 0.4% of the weight; that is what the tests show.
"""

from __future__ import annotations

import numpy as np

from evdb.errors import InvalidArgumentError, InvalidTypeError
from evdb.kernels import OptimizerKind
from evdb.kernels.reference.lowp import half_format, narrow, rounding_bits, widen
from evdb.kernels.reference.optim import apply_rule

__all__ = ["LOWP_KINDS", "check_row_keys", "has_half_slots", "segment_sum_apply_lowp"]

# The rules with a half-precision variant: SGD, Adagrad, lazy Adam and row-wise Adagrad.
LOWP_KINDS = (
    OptimizerKind.SGD,
    OptimizerKind.ADAGRAD,
    OptimizerKind.ADAM,
    OptimizerKind.ROWWISE_ADAGRAD,
)


def check_lowp_kind(kind: int) -> int:
    """kind itself, or InvalidArgumentError naming the kinds that have a half variant."""
    if int(kind) not in LOWP_KINDS:
        raise InvalidArgumentError(
            f"kind: optimizer kind {kind} has no half-precision update; expected one of "
            f"{LOWP_KINDS} (SGD, Adagrad, Adam, row-wise Adagrad)"
        )
    return int(kind)


def check_row_keys(row_keys: np.ndarray, values: np.ndarray) -> None:
    """InvalidArgumentError unless row_keys holds one key for each row of values (the kernels
    read it at any row they update, unchecked)."""
    if row_keys.ndim != 1 or row_keys.shape[0] != values.shape[0]:
        raise InvalidArgumentError(
            f"row_keys: expected the key of each of values' {values.shape[0]} rows, shape "
            f"({values.shape[0]},), got shape {tuple(row_keys.shape)}"
        )


def has_half_slots(values: np.ndarray, slots: np.ndarray) -> bool:
    """Whether slots are stored in half precision (then in the values' format), or
    InvalidTypeError naming what slots may be."""
    if slots.dtype == np.float32:
        return False
    if slots.dtype == values.dtype and slots.dtype in (np.uint16, np.float16):
        return True
    raise InvalidTypeError(
        f"slots: expected float32, or the values' own storage ({values.dtype}), got {slots.dtype}"
    )


def segment_sum_apply_lowp(
    grads: np.ndarray,
    positions: np.ndarray,
    bounds: np.ndarray,
    rows: np.ndarray,
    row_keys: np.ndarray,
    kind: int,
    hyper: np.ndarray,
    seed: int,
    step: int,
    stochastic: bool,
    values: np.ndarray,
    slots: np.ndarray,
) -> None:
    """Sum each row's gradient over its positions, apply rule ``kind`` in float64 and store
    the row rounded to its half format (module docstring). values (R, dim) uint16 (bfloat16
    bits) or float16; slots (R, n_slots) float32 or values' dtype; row_keys (R,) int64, the
    key of each stored row (at least the rows that ``rows`` names)."""
    fmt = half_format("values", values)
    check_lowp_kind(kind)
    check_row_keys(row_keys, values)
    half_slots = has_half_slots(values, slots)
    u = rows.shape[0]
    seg = np.repeat(np.arange(u), np.diff(bounds))
    g = np.zeros((u, grads.shape[1]))
    np.add.at(g, seg, grads[positions].astype(np.float64))
    live = rows >= 0
    r = rows[live]
    w = widen(values[r]).astype(np.float64)
    s = (widen(slots[r]) if half_slots else slots[r]).astype(np.float64)
    w, s = apply_rule(kind, hyper, w, s, g[live])
    w32 = w.astype(np.float32)
    if not half_slots:
        rbits = rounding_bits(seed, row_keys[r], step, w32.shape[1]) if stochastic else None
        values[r] = narrow(w32, fmt, rbits)
        slots[r] = s
        return
    record = np.concatenate([w32, s.astype(np.float32)], axis=1)  # one record: row, slots
    rbits = rounding_bits(seed, row_keys[r], step, record.shape[1]) if stochastic else None
    stored = narrow(record, fmt, rbits)
    dim = values.shape[1]
    values[r] = stored[:, :dim]
    slots[r] = stored[:, dim:]
