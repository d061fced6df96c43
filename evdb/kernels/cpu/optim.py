"""Numba fused update (see ``reference.optim`` for the rules, slot layouts and hyper order).

Each rule is written once, in ``update_row`` (float64 scratch in, slots updated in place), and
inlined by numba into this module's float32 update and into ``cpu.lowp_optim``'s update of
half-precision rows; only how a row is read and stored differs between the two."""

from __future__ import annotations

import numpy as np
from numba import prange, types

from evdb.kernels.cpu._common import F4_2D, F8, I8, PARALLEL_MIN_KEYS, i8, lazy_njit, prefetch

__all__ = ["group_positions", "segment_sum_apply", "sum_gradient", "update_row"]

ROW_CHUNK = 64  # rows per task: the gradient scratch is allocated once per chunk
PREFETCH_AHEAD = 8  # rows between a prefetch and its use


@lazy_njit(types.void(I8, I8, I8))
def group_positions(inverse, bounds, out):  # type: ignore[no-untyped-def]
    # Counting sort: one pass over the positions, no comparison sort.
    fill = bounds[:-1].copy()
    for p in range(inverse.shape[0]):
        u = inverse[p]
        out[fill[u]] = p
        fill[u] += 1


@lazy_njit(types.float64(F8), inline="always")
def _norm(x):  # type: ignore[no-untyped-def]
    acc = 0.0
    for j in range(x.shape[0]):
        acc += x[j] * x[j]
    return np.sqrt(acc)


@lazy_njit(types.float64(F8), inline="always")
def _sum_squares(g):  # type: ignore[no-untyped-def]
    """sum(g * g) in numpy's pairwise order for up to 128 elements (eight running sums, then
    the rest; so row-wise Adagrad's mean matches the reference's for such rows). One running
    sum was a chain of dependent adds that bounded the whole update: row-wise Adagrad at dim
    64 ran 83 ns a row on one thread, all of it waiting on that chain."""
    n = g.shape[0]
    if n < 8:
        acc = 0.0
        for j in range(n):
            acc += g[j] * g[j]
        return acc
    r0, r1, r2, r3 = g[0] * g[0], g[1] * g[1], g[2] * g[2], g[3] * g[3]
    r4, r5, r6, r7 = g[4] * g[4], g[5] * g[5], g[6] * g[6], g[7] * g[7]
    whole = n - n % 8
    for i in range(8, whole, 8):
        r0 += g[i] * g[i]
        r1 += g[i + 1] * g[i + 1]
        r2 += g[i + 2] * g[i + 2]
        r3 += g[i + 3] * g[i + 3]
        r4 += g[i + 4] * g[i + 4]
        r5 += g[i + 5] * g[i + 5]
        r6 += g[i + 6] * g[i + 6]
        r7 += g[i + 7] * g[i + 7]
    acc = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    for j in range(whole, n):
        acc += g[j] * g[j]
    return acc


@lazy_njit(types.float64(types.float64, types.float64), inline="always")
def _ftrl_power(n, lr_power):  # type: ignore[no-untyped-def]
    return np.sqrt(n) if lr_power == -0.5 else n ** (-lr_power)


@lazy_njit(types.void(F4_2D, I8, I8, i8, F8), inline="always")
def sum_gradient(grads, positions, bounds, u, g):  # type: ignore[no-untyped-def]
    """g = the sum in float64 of grads over row u's positions (zero for a row without any)."""
    # The first position assigns, the rest add: no zeroing pass (``g[:] = 0.0`` went through
    # numba's generic slice path: Adagrad on 1,900 cached rows of dim 1 took 55 us with it,
    # 30 without)
    dim = g.shape[0]
    start, stop = bounds[u], bounds[u + 1]
    if start < stop:
        first = positions[start]
        for j in range(dim):
            g[j] = grads[first, j]
    else:
        for j in range(dim):
            g[j] = 0.0
    for k in range(start + 1, stop):
        p = positions[k]
        for j in range(dim):
            g[j] += grads[p, j]


@lazy_njit(types.void(i8, F8, F8, F8, F4_2D, i8), inline="always")
def update_row(kind, hyper, w, g, slots, r):  # type: ignore[no-untyped-def]
    """Rule ``kind`` (reference.optim.apply_rule) on one row: w (dim,) float64 its values,
    updated in place, g (dim,) float64 its summed gradient, slots[r] its slots (float32,
    each element read and stored once, the arithmetic in float64)."""
    dim = w.shape[0]
    lr = hyper[0]
    lasso = 0.0
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
        b1, b2, eps = hyper[1], hyper[2], hyper[3]
        for j in range(dim):
            m = b1 * slots[r, j] + (1 - b1) * g[j]
            v = b2 * slots[r, dim + j] + (1 - b2) * g[j] * g[j]
            slots[r, j] = m
            slots[r, dim + j] = v
            w[j] -= lr * m / (np.sqrt(v) + eps)
    elif kind == 3 or kind == 4:  # FTRL, group FTRL
        lr_power, l1, l2 = hyper[1], hyper[2], hyper[3]
        znorm = 0.0
        for j in range(dim):
            n = np.float64(slots[r, j])
            n_new = n + g[j] * g[j]
            sigma = (_ftrl_power(n_new, lr_power) - _ftrl_power(n, lr_power)) / lr
            z = slots[r, dim + j] + g[j] - sigma * w[j]
            slots[r, j] = n_new
            slots[r, dim + j] = z
            znorm += z * z
            if kind == 3:
                quad = _ftrl_power(n_new, lr_power) / lr + 2 * l2
                w[j] = (np.sign(z) * l1 - z) / quad if abs(z) > l1 else 0.0
        if kind == 4:
            znorm = np.sqrt(znorm)
            for j in range(dim):
                z = np.float64(slots[r, dim + j])
                quad = _ftrl_power(np.float64(slots[r, j]), lr_power) / lr + 2 * l2
                w[j] = (l1 * z / znorm - z) / quad if znorm > l1 else 0.0
    elif kind == 5:  # Adagrad with decay
        decay_now, rate, init_acc = hyper[1], hyper[2], hyper[3]
        for j in range(dim):
            acc = np.float64(slots[r, j])
            if decay_now != 0.0:
                acc = max(acc * rate, init_acc)
            acc += g[j] * g[j]
            slots[r, j] = acc
            w[j] -= lr * g[j] / np.sqrt(acc)
    else:  # row-wise Adagrad
        eps = hyper[1]
        acc = np.float64(slots[r, 0]) + _sum_squares(g) / dim
        slots[r, 0] = acc
        for j in range(dim):
            w[j] -= lr * g[j] / (np.sqrt(acc) + eps)
    if lasso != 0.0:
        norm = _norm(w)
        shrink = max(0.0, 1.0 - lr * lasso / norm) if norm > 0 else 0.0
        for j in range(dim):
            w[j] *= shrink


_SSA_SIG = types.void(F4_2D, I8, I8, I8, i8, F8, F4_2D, F4_2D)


@lazy_njit(types.void(i8, F4_2D, I8, I8, I8, i8, F8, F4_2D, F4_2D), inline="always")
def _apply_chunk(  # type: ignore[no-untyped-def]
    c, grads, positions, bounds, rows, kind, hyper, values, slots
):
    # Rows are distinct, so chunks never touch the same row: no atomics. Each row's gradient is
    # summed in float64 scratch, then the rule runs element by element in float64 and stores
    # float32 (the reference's precision, at float32 storage).
    dim = values.shape[1]
    n_rows = rows.shape[0]
    # one scratch per chunk of ROW_CHUNK rows
    g = np.empty(dim, np.float64)
    w = np.empty(dim, np.float64)
    hi = min((c + 1) * ROW_CHUNK, n_rows)
    for u in range(c * ROW_CHUNK, hi):
        # Rows are scattered over the slab: ask for the row PREFETCH_AHEAD ahead (its value and
        # slot lines) while this one computes, so the misses overlap.
        if u + PREFETCH_AHEAD < hi and rows[u + PREFETCH_AHEAD] >= 0:
            ahead = rows[u + PREFETCH_AHEAD]
            for j in range(0, dim, 16):
                prefetch(values, ahead, j)
            for j in range(0, slots.shape[1], 16):
                prefetch(slots, ahead, j)
        r = rows[u]
        if r < 0:
            continue
        sum_gradient(grads, positions, bounds, u, g)
        for j in range(dim):
            w[j] = values[r, j]
        update_row(kind, hyper, w, g, slots, r)
        for j in range(dim):
            values[r, j] = w[j]


@lazy_njit(_SSA_SIG)
def _segment_sum_apply_serial(  # type: ignore[no-untyped-def]
    grads, positions, bounds, rows, kind, hyper, values, slots
):
    for c in range((rows.shape[0] + ROW_CHUNK - 1) // ROW_CHUNK):
        _apply_chunk(c, grads, positions, bounds, rows, kind, hyper, values, slots)


@lazy_njit(_SSA_SIG, parallel=True)
def _segment_sum_apply_parallel(  # type: ignore[no-untyped-def]
    grads, positions, bounds, rows, kind, hyper, values, slots
):
    for c in prange((rows.shape[0] + ROW_CHUNK - 1) // ROW_CHUNK):
        _apply_chunk(c, grads, positions, bounds, rows, kind, hyper, values, slots)


def segment_sum_apply(  # type: ignore[no-untyped-def]
    grads, positions, bounds, rows, kind, hyper, values, slots
) -> None:
    """Fused segment-sum + optimizer update, in place (see reference.optim)."""
    big = positions.shape[0] >= PARALLEL_MIN_KEYS
    kernel = _segment_sum_apply_parallel if big else _segment_sum_apply_serial
    kernel(grads, positions, bounds, rows, kind, hyper, values, slots)
