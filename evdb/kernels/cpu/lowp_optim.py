"""Numba fused update of half-precision rows (see ``reference.lowp_optim``): the gradient of
each row summed in float64, the rule applied in float64, the row rounded to float32 and then
to its half format (stochastically, with the bits of reference.lowp) in the same pass."""

from __future__ import annotations

import numpy as np
from numba import prange, types

from evdb.kernels.cpu._common import F4_2D, F8, I8, PARALLEL_MIN_KEYS, b1, i8, lazy_njit, u8
from evdb.kernels.cpu.lowp import (
    U2_2D,
    column_bits,
    narrow_bits,
    row_base,
    step_salt,
    widen_bits,
)
from evdb.kernels.reference.lowp import half_format
from evdb.kernels.reference.lowp_optim import check_lowp_kind

__all__ = ["segment_sum_apply_lowp"]

ROW_CHUNK = 64  # rows per task: the scratch rows are allocated once per chunk

_ARGS = (F4_2D, I8, I8, I8, I8, i8, F8, u8, i8, b1, i8, U2_2D, F4_2D)


@lazy_njit(types.void(i8, *_ARGS), inline="always")
def _apply_lowp_chunk(  # type: ignore[no-untyped-def]
    c, grads, positions, bounds, rows, keys, kind, hyper, seed, step, stochastic, fmt,
    values, slots,
):  # fmt: skip
    # Rows are distinct, so chunks never touch the same row: no atomics (as cpu.optim).
    dim = values.shape[1]
    lr = hyper[0]
    g = np.empty(dim, np.float64)
    w = np.empty(dim, np.float64)
    bits = np.empty(dim, np.uint32)  # a float32 row and its bit patterns, one memory
    row32 = bits.view(np.float32)
    salt = step_salt(seed, step)
    for u in range(c * ROW_CHUNK, min((c + 1) * ROW_CHUNK, rows.shape[0])):
        r = rows[u]
        if r < 0:
            continue
        start, stop = bounds[u], bounds[u + 1]
        for j in range(dim):
            g[j] = 0.0
        for k in range(start, stop):
            p = positions[k]
            for j in range(dim):
                g[j] += grads[p, j]
        for j in range(dim):
            bits[j] = widen_bits(values[r, j], fmt)
            w[j] = row32[j]
        if kind == 0:  # SGD
            wd, lasso = hyper[1], hyper[2]
            for j in range(dim):
                w[j] -= lr * (g[j] + wd * w[j])
        elif kind == 1:  # Adagrad
            eps, wd, lasso = hyper[1], hyper[2], hyper[3]
            for j in range(dim):
                gj = g[j] + wd * w[j]
                acc = np.float64(slots[r, j]) + gj * gj
                slots[r, j] = acc
                w[j] -= lr * gj / (np.sqrt(acc) + eps)
        elif kind == 2:  # lazy Adam; hyper[0] is the bias-corrected step size
            b1_, b2, eps = hyper[1], hyper[2], hyper[3]
            lasso = 0.0
            for j in range(dim):
                m = b1_ * slots[r, j] + (1 - b1_) * g[j]
                v = b2 * slots[r, dim + j] + (1 - b2) * g[j] * g[j]
                slots[r, j] = m
                slots[r, dim + j] = v
                w[j] -= lr * m / (np.sqrt(v) + eps)
        else:  # row-wise Adagrad
            eps = hyper[1]
            lasso = 0.0
            sq = 0.0
            for j in range(dim):
                sq += g[j] * g[j]
            acc = np.float64(slots[r, 0]) + sq / dim
            slots[r, 0] = acc
            for j in range(dim):
                w[j] -= lr * g[j] / (np.sqrt(acc) + eps)
        if lasso != 0.0:
            norm = 0.0
            for j in range(dim):
                norm += w[j] * w[j]
            norm = np.sqrt(norm)
            shrink = max(0.0, 1.0 - lr * lasso / norm) if norm > 0 else 0.0
            for j in range(dim):
                w[j] *= shrink
        for j in range(dim):
            row32[j] = np.float32(w[j])
        base = row_base(salt, keys[u])
        for j in range(dim):
            rb = column_bits(base, j) if stochastic else np.uint64(0)
            values[r, j] = narrow_bits(row32[j], bits[j], rb, stochastic, fmt)


@lazy_njit(types.void(*_ARGS))
def _segment_sum_apply_lowp_serial(  # type: ignore[no-untyped-def]
    grads, positions, bounds, rows, keys, kind, hyper, seed, step, stochastic, fmt, values, slots
):
    for c in range((rows.shape[0] + ROW_CHUNK - 1) // ROW_CHUNK):
        _apply_lowp_chunk(
            c, grads, positions, bounds, rows, keys, kind, hyper, seed, step, stochastic, fmt,
            values, slots,
        )  # fmt: skip


@lazy_njit(types.void(*_ARGS), parallel=True)
def _segment_sum_apply_lowp_parallel(  # type: ignore[no-untyped-def]
    grads, positions, bounds, rows, keys, kind, hyper, seed, step, stochastic, fmt, values, slots
):
    for c in prange((rows.shape[0] + ROW_CHUNK - 1) // ROW_CHUNK):
        _apply_lowp_chunk(
            c, grads, positions, bounds, rows, keys, kind, hyper, seed, step, stochastic, fmt,
            values, slots,
        )  # fmt: skip


def segment_sum_apply_lowp(  # type: ignore[no-untyped-def]
    grads, positions, bounds, rows, keys, kind, hyper, seed, step, stochastic, values, slots
) -> None:
    """Fused segment-sum + update of half-precision rows (see reference.lowp_optim)."""
    fmt = 0 if half_format("values", values) == "bfloat16" else 1
    kind = check_lowp_kind(kind)
    big = positions.shape[0] >= PARALLEL_MIN_KEYS
    kernel = _segment_sum_apply_lowp_parallel if big else _segment_sum_apply_lowp_serial
    seed = np.uint64(int(seed) & (2**64 - 1))
    kernel(
        grads, positions, bounds, rows, keys, kind, hyper, seed, step, bool(stochastic), fmt,
        values.view(np.uint16), slots,
    )  # fmt: skip
