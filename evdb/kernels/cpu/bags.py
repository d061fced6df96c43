"""Numba bag kernels (see ``reference.bags`` for the conventions and the spec).

Each kernel is a body over one unit of work (a chunk of bags, a bag, a key), inlined into a
serial and a parallel driver; ``select`` picks the driver by the number of keys, so a small
call never waits on numba's thread pool.
"""

from __future__ import annotations

import numpy as np
from numba import prange, types

from evdb.kernels.cpu._common import (
    F4,
    F4_2D,
    I8,
    I8_2D,
    PARALLEL_MIN_KEYS,
    f8,
    i8,
    lazy_njit,
    u8,
)
from evdb.kernels.cpu.index import probe_range
from evdb.kernels.cpu.init import default_row

BAG_CHUNK = 32  # bags per task; their keys are hashed and prefetched together
NORM_EPS = 1e-7


@lazy_njit(f8(F4, I8, i8, i8), inline="always")
def _divisor(weights, bounds, b, combiner):  # type: ignore[no-untyped-def]
    if combiner == 0:
        return 1.0
    acc = 0.0
    for p in range(bounds[b], bounds[b + 1]):
        w = np.float64(weights[p])
        acc += w if combiner == 1 else w * w
    return acc if combiner == 1 else np.sqrt(acc)


@lazy_njit(f8(F4_2D, i8, f8), inline="always")
def _clip_scale(x, r, max_norm):  # type: ignore[no-untyped-def]
    if max_norm == np.inf:
        return 1.0
    sq = 0.0
    for c in range(x.shape[1]):
        sq += np.float64(x[r, c]) * np.float64(x[r, c])
    norm = np.sqrt(sq)
    return max_norm / (norm + NORM_EPS) if norm > max_norm else 1.0


# -- probe + gather + combine --------------------------------------------------------------
_PGC_SIG = i8(I8_2D, F4_2D, I8, I8, I8, F4, i8, i8, f8, i8, u8, f8, f8, F4_2D)


@lazy_njit(
    i8(i8, I8_2D, F4_2D, I8, I8, I8, F4, i8, i8, f8, i8, u8, f8, f8, F4_2D),
    inline="always",
)
def _pgc_chunk(  # type: ignore[no-untyped-def]
    c,
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
    # One chunk of BAG_CHUNK bags: probe all their keys together (probe_range), then
    # accumulate each bag into its output row. No (n, dim) matrix exists; a missing key's
    # default is computed in place, element by element.
    n_bags = bounds.shape[0] - 1
    dim = values.shape[1]
    b0 = c * BAG_CHUNK
    b1 = min(b0 + BAG_CHUNK, n_bags)
    lo, hi = bounds[b0], bounds[b1]
    rows = np.empty(hi - lo, np.int64)
    probe_range(slots, values, last_step, keys, lo, hi, min_live_step, rows)
    scratch = np.empty((1, dim), np.float32)
    missing = 0
    for b in range(b0, b1):
        for j in range(dim):
            out[b, j] = 0.0
        div = _divisor(weights, bounds, b, combiner)
        for p in range(bounds[b], bounds[b + 1]):
            r = rows[p - lo]
            src = values
            if r < 0:  # default value of a key without a live row
                missing += 1
                if div == 0.0:
                    continue
                kb = np.uint64(keys[p])
                default_row(init_kind, init_seed, init_a, init_b, kb, scratch, 0)
                src = scratch
                r = 0
            if div == 0.0:
                continue
            scale = np.float32(_clip_scale(src, r, max_norm) * weights[p] / div)
            for j in range(dim):
                out[b, j] += scale * src[r, j]
    return missing


@lazy_njit(_PGC_SIG)
def _probe_gather_combine_serial(  # type: ignore[no-untyped-def]
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
    missing = 0
    for c in range((bounds.shape[0] - 1 + BAG_CHUNK - 1) // BAG_CHUNK):
        missing += _pgc_chunk(
            c,
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
        )
    return missing


@lazy_njit(_PGC_SIG, parallel=True)
def _probe_gather_combine_parallel(  # type: ignore[no-untyped-def]
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
    missing = 0
    for c in prange((bounds.shape[0] - 1 + BAG_CHUNK - 1) // BAG_CHUNK):
        missing += _pgc_chunk(
            c,
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
        )
    return missing


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
) -> int:
    """Fused probe + gather + combine (see reference.bags.probe_gather_combine)."""
    big = keys.shape[0] >= PARALLEL_MIN_KEYS
    kernel = _probe_gather_combine_parallel if big else _probe_gather_combine_serial
    return int(
        kernel(
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
        )
    )


# -- combine of pulled rows ----------------------------------------------------------------
_GC_SIG = types.void(F4_2D, I8, I8, F4, i8, f8, F4_2D)


@lazy_njit(types.void(i8, F4_2D, I8, I8, F4, i8, f8, F4_2D), inline="always")
def _combine_bag(b, rows, inverse, bounds, weights, combiner, max_norm, out):  # type: ignore[no-untyped-def]
    dim = rows.shape[1]
    for j in range(dim):
        out[b, j] = 0.0
    if combiner == 0 and max_norm == np.inf:
        # A plain sum: the scale below is float32(1.0 * w / 1.0) == w exactly, so this branch
        # writes the same bits without a float64 division per position (20 instead of 150 us
        # for 4,096 one-key bags of dim 16: the division kept the loop from vectorising).
        for p in range(bounds[b], bounds[b + 1]):
            r = inverse[p]
            w = weights[p]
            for j in range(dim):
                out[b, j] += w * rows[r, j]
        return
    div = _divisor(weights, bounds, b, combiner)
    if div == 0.0:
        return
    for p in range(bounds[b], bounds[b + 1]):
        r = inverse[p]
        scale = np.float32(_clip_scale(rows, r, max_norm) * weights[p] / div)
        for j in range(dim):
            out[b, j] += scale * rows[r, j]


@lazy_njit(_GC_SIG)
def _gather_combine_serial(rows, inverse, bounds, weights, combiner, max_norm, out):  # type: ignore[no-untyped-def]
    for b in range(bounds.shape[0] - 1):
        _combine_bag(b, rows, inverse, bounds, weights, combiner, max_norm, out)


@lazy_njit(_GC_SIG, parallel=True)
def _gather_combine_parallel(rows, inverse, bounds, weights, combiner, max_norm, out):  # type: ignore[no-untyped-def]
    for b in prange(bounds.shape[0] - 1):
        _combine_bag(b, rows, inverse, bounds, weights, combiner, max_norm, out)


def gather_combine(rows, inverse, bounds, weights, combiner, max_norm, out) -> None:  # type: ignore[no-untyped-def]
    """Combine pulled rows into bags (see reference.bags.gather_combine)."""
    big = inverse.shape[0] >= PARALLEL_MIN_KEYS
    kernel = _gather_combine_parallel if big else _gather_combine_serial
    kernel(rows, inverse, bounds, weights, combiner, max_norm, out)


# -- backward of the combine ---------------------------------------------------------------
# Serial on purpose. Positions of different bags add into the same key's row, so a parallel
# version must either group positions by key first (measured 2-2.8x slower here on 2 cores:
# the grouping pass, then grad_out read in random order) or split the columns between threads
# (measured 4x slower: every thread walks the whole batch and misses on the same rows). The
# serial scatter reads grad_out in order and touches each row once per position.


@lazy_njit(types.void(F4_2D, F4_2D, I8, I8, F4, i8, f8, F4_2D))
def combine_backward(  # type: ignore[no-untyped-def]
    grad_out, rows, inverse, bounds, weights, combiner, max_norm, out
):
    dim = rows.shape[1]
    out[:] = 0.0
    for b in range(bounds.shape[0] - 1):
        if combiner == 0:  # coef below is float32(w / 1.0) == w: skip the division (3x)
            for p in range(bounds[b], bounds[b + 1]):
                coef = weights[p]
                r = inverse[p]
                for j in range(dim):
                    out[r, j] += coef * grad_out[b, j]
            continue
        div = _divisor(weights, bounds, b, combiner)
        if div == 0.0:
            continue
        for p in range(bounds[b], bounds[b + 1]):
            coef = np.float32(np.float64(weights[p]) / div)
            r = inverse[p]
            for j in range(dim):
                out[r, j] += coef * grad_out[b, j]
    if max_norm == np.inf:
        return
    # Every position of key k saw the same row x, so its summed gradient g goes through one
    # Jacobian of the max_norm scaling: J^T g = s g - max_norm (x . g) x / (|x| (|x| + eps)^2).
    for k in range(rows.shape[0]):
        s = _clip_scale(rows, k, max_norm)
        if s == 1.0:
            continue
        sq = 0.0
        dot = 0.0
        for j in range(dim):
            x = np.float64(rows[k, j])
            sq += x * x
            dot += x * out[k, j]
        norm = np.sqrt(sq)
        proj = max_norm * dot / (norm * (norm + NORM_EPS) ** 2)
        for j in range(dim):
            out[k, j] = s * out[k, j] - proj * rows[k, j]
