"""Bags: lookups combined into one vector per bag, and their gradient (``cuda/bags.cu``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from evdb.errors import InvalidArgumentError
from evdb.kernels.gpu.runtime import (
    check_array,
    check_slots,
    cuda_kernel,
    cupy_module,
    f64,
    group_size,
    i32,
    i64,
    launch,
    u64,
)

__all__ = ["combine_backward", "gather_combine", "probe_gather_combine"]


def _bags(bounds: Any, weights: Any, combiner: int) -> int:
    n_bags = check_array("bounds", bounds, np.int64, 1).shape[0] - 1
    check_array("weights", weights, np.float32, 1)
    if combiner not in (0, 1, 2):
        raise InvalidArgumentError(
            f"combiner: expected 0 (sum), 1 (mean) or 2 (sqrtn), got {combiner}"
        )
    return int(n_bags)


def probe_gather_combine(
    slots: Any,
    values: Any,
    last_step: Any,
    keys: Any,
    bounds: Any,
    weights: Any,
    min_live_step: int,
    combiner: int,
    max_norm: float,
    init_kind: int,
    init_seed: int,
    init_a: float,
    init_b: float,
    out: Any,
) -> int:
    """Fused probe + gather + combine (see reference.bags.probe_gather_combine); returns the
    number of keys without a live row."""
    cp = cupy_module()
    slots, cap = check_slots(slots)
    dim = check_array("values", values, np.float32, 2).shape[1]
    check_array("last_step", last_step, np.int64, 1)
    check_array("keys", keys, np.int64, 1)
    check_array("out", out, np.float32, 2)
    n_bags = _bags(bounds, weights, combiner)
    if n_bags <= 0:
        return 0
    missing = cp.zeros(1, np.uint64)
    g = group_size(dim)
    args = (slots, cap, values, i64(dim), last_step, keys, bounds, weights, i64(n_bags))
    scalars = (i64(min_live_step), i32(combiner), f64(max_norm), i32(init_kind))
    init = (u64(init_seed), f64(init_a), f64(init_b))
    kernel = cuda_kernel("bags", "probe_gather_combine")
    launch(kernel, n_bags * g, (*args, *scalars, *init, out, missing, i32(g)))
    return int(missing.get()[0])


def gather_combine(
    rows: Any,
    inverse: Any,
    bounds: Any,
    weights: Any,
    combiner: int,
    max_norm: float,
    out: Any,
) -> None:
    """Combine pulled rows into bags (see reference.bags.gather_combine)."""
    dim = check_array("rows", rows, np.float32, 2).shape[1]
    check_array("inverse", inverse, np.int64, 1)
    check_array("out", out, np.float32, 2)
    n_bags = _bags(bounds, weights, combiner)
    g = group_size(dim)
    args = (rows, i64(dim), inverse, bounds, weights, i64(n_bags))
    launch(
        cuda_kernel("bags", "gather_combine"),
        n_bags * g,
        (*args, i32(combiner), f64(max_norm), out, i32(g)),
    )


def combine_backward(
    grad_out: Any,
    rows: Any,
    inverse: Any,
    bounds: Any,
    weights: Any,
    combiner: int,
    max_norm: float,
    out: Any,
) -> None:
    """Gradient of gather_combine with respect to rows (see reference.combine_backward)."""
    cp = cupy_module()
    check_array("grad_out", grad_out, np.float32, 2)
    u, dim = check_array("rows", rows, np.float32, 2).shape
    check_array("inverse", inverse, np.int64, 1)
    check_array("out", out, np.float32, 2)
    n_bags = _bags(bounds, weights, combiner)
    acc = cp.zeros((u, dim), np.float64)  # float64 sums: atomic order barely shows
    g = group_size(dim)
    args = (grad_out, i64(dim), inverse, bounds, weights, i64(n_bags), i32(combiner))
    launch(cuda_kernel("bags", "combine_backward_scatter"), n_bags * g, (*args, acc, i32(g)))
    finish = (rows, i64(u), i64(dim), f64(max_norm), acc, out, i32(g))
    launch(cuda_kernel("bags", "combine_backward_finish"), u * g, finish)
