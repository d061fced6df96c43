"""Initializers: rows drawn per (seed, key, column) on the device (``cuda/init.cu``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from evdb.kernels.gpu.runtime import (
    check_array,
    cuda_kernel,
    f64,
    i32,
    i64,
    launch,
    u64,
)

__all__ = ["fill_normal", "fill_uniform"]


def fill_uniform(keys: Any, seed: int, low: float, high: float, out: Any) -> None:
    """out (n, dim) = uniform [low, high) per (seed, key, column) (see reference.init)."""
    n = check_array("keys", keys, np.int64, 1).shape[0]
    dim = check_array("out", out, np.float32, 2).shape[1]
    args = (keys, i64(n), i64(dim), u64(seed), f64(low), f64(high), out)
    launch(cuda_kernel("init", "fill_uniform"), n * dim, args)


def fill_normal(keys: Any, seed: int, mean: float, std: float, truncate: bool, out: Any) -> None:
    """out (n, dim) = normal(mean, std) per (seed, key, column), optionally truncated at 2
    std (see reference.init)."""
    n = check_array("keys", keys, np.int64, 1).shape[0]
    dim = check_array("out", out, np.float32, 2).shape[1]
    args = (keys, i64(n), i64(dim), u64(seed), f64(mean), f64(std), i32(bool(truncate)))
    launch(cuda_kernel("init", "fill_normal"), n * dim, (*args, out))
