"""Numba bag kernels (see ``reference.bags`` for the conventions and the spec)."""

from __future__ import annotations

import numpy as np
from numba import njit, prange, types

from evdb.kernels.cpu._common import F4, F4_2D, I8, I8_2D, I64_MIN, OPTS, f8, i8, prefetch, u8
from evdb.kernels.cpu.index import _home, _probe_from
from evdb.kernels.cpu.init import default_element

BAG_CHUNK = 32  # bags per task; their keys are hashed and prefetched together
NORM_EPS = 1e-7


@njit(f8(F4, I8, i8, i8), inline="always", **OPTS)
def _divisor(weights, bounds, b, combiner):  # type: ignore[no-untyped-def]
    if combiner == 0:
        return 1.0
    acc = 0.0
    for p in range(bounds[b], bounds[b + 1]):
        w = np.float64(weights[p])
        acc += w if combiner == 1 else w * w
    return acc if combiner == 1 else np.sqrt(acc)


@njit(f8(F4_2D, i8, f8), inline="always", **OPTS)
def _clip_scale(x, r, max_norm):  # type: ignore[no-untyped-def]
    if max_norm == np.inf:
        return 1.0
    sq = 0.0
    for c in range(x.shape[1]):
        sq += np.float64(x[r, c]) * np.float64(x[r, c])
    norm = np.sqrt(sq)
    return max_norm / (norm + NORM_EPS) if norm > max_norm else 1.0


@njit(
    i8(I8_2D, F4_2D, I8, I8, I8, F4, i8, i8, f8, i8, u8, f8, f8, F4_2D),
    parallel=True,
    **OPTS,
)
def probe_gather_combine(  # type: ignore[no-untyped-def]
    slots,
    values,
    last_step,
    keys,
    bounds,
    weights,
    min_live_step,
    combiner,
    max_norm,
    init_kind,
    init_seed,
    init_a,
    init_b,
    out,
):
    # Bags are processed BAG_CHUNK at a time: hash and prefetch the home slots of all their
    # keys, probe and prefetch the rows, then accumulate each bag into its output row. No
    # (n, dim) matrix exists; a missing key's default is computed in place, element by element.
    n_bags = bounds.shape[0] - 1
    dim = values.shape[1]
    mask = slots.shape[0] - 1
    check_ttl = min_live_step != I64_MIN
    missing = 0
    for c in prange((n_bags + BAG_CHUNK - 1) // BAG_CHUNK):
        b0 = c * BAG_CHUNK
        b1 = min(b0 + BAG_CHUNK, n_bags)
        lo, hi = bounds[b0], bounds[b1]
        rows = np.empty(hi - lo, np.int64)
        for p in range(lo, hi):
            h = _home(keys[p], mask)
            rows[p - lo] = h
            prefetch(slots, h, 0)
        for p in range(lo, hi):
            r = _probe_from(slots, mask, keys[p], rows[p - lo])
            if r >= 0:
                prefetch(values, r, 0)
                if check_ttl and last_step[r] < min_live_step:
                    r = -1
            rows[p - lo] = r
        scratch = np.empty((1, dim), np.float32)
        for b in range(b0, b1):
            for j in range(dim):
                out[b, j] = 0.0
            div = _divisor(weights, bounds, b, combiner)
            if div == 0.0:
                continue
            for p in range(bounds[b], bounds[b + 1]):
                r = rows[p - lo]
                src = values
                if r < 0:  # default value of a key without a live row
                    missing += 1
                    kb = np.uint64(keys[p])
                    for j in range(dim):
                        scratch[0, j] = default_element(init_kind, init_seed, init_a, init_b, kb, j)
                    src = scratch
                    r = 0
                scale = np.float32(_clip_scale(src, r, max_norm) * weights[p] / div)
                for j in range(dim):
                    out[b, j] += scale * src[r, j]
    return missing


@njit(types.void(F4_2D, I8, I8, F4, i8, f8, F4_2D), parallel=True, **OPTS)
def gather_combine(rows, inverse, bounds, weights, combiner, max_norm, out):  # type: ignore[no-untyped-def]
    dim = rows.shape[1]
    for b in prange(bounds.shape[0] - 1):
        for j in range(dim):
            out[b, j] = 0.0
        div = _divisor(weights, bounds, b, combiner)
        if div == 0.0:
            continue
        for p in range(bounds[b], bounds[b + 1]):
            r = inverse[p]
            scale = np.float32(_clip_scale(rows, r, max_norm) * weights[p] / div)
            for j in range(dim):
                out[b, j] += scale * rows[r, j]


@njit(types.void(F4_2D, F4_2D, I8, I8, F4, i8, f8, F4_2D), **OPTS)
def combine_backward(  # type: ignore[no-untyped-def]
    grad_out, rows, inverse, bounds, weights, combiner, max_norm, out
):
    # Serial: positions of different bags scatter into the same key's row, and a parallel
    # scatter would race; the work is one multiply-add per element of the batch.
    dim = rows.shape[1]
    out[:] = 0.0
    for b in range(bounds.shape[0] - 1):
        div = _divisor(weights, bounds, b, combiner)
        if div == 0.0:
            continue
        for p in range(bounds[b], bounds[b + 1]):
            r = inverse[p]
            coef = np.float64(weights[p]) / div
            s = _clip_scale(rows, r, max_norm)
            if s == 1.0:
                for j in range(dim):
                    out[r, j] += np.float32(coef * grad_out[b, j])
                continue
            # Through the max_norm scaling: J = s I - max_norm x x^T / (|x| (|x| + eps)^2).
            sq = 0.0
            dot = 0.0
            for j in range(dim):
                x = np.float64(rows[r, j])
                sq += x * x
                dot += x * grad_out[b, j]
            norm = np.sqrt(sq)
            proj = max_norm * dot / (norm * (norm + NORM_EPS) ** 2)
            for j in range(dim):
                g = s * grad_out[b, j] - proj * rows[r, j]
                out[r, j] += np.float32(coef * g)
