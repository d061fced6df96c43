"""The fused update: gradients grouped by row, summed and applied by the optimizer, in
place (``cuda/optim.cu``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from evdb.errors import InvalidArgumentError
from evdb.kernels import OptimizerKind
from evdb.kernels.gpu.runtime import (
    BLOCK,
    SHARED_BYTES,
    check_array,
    cuda_kernel,
    cupy_module,
    f64,
    group_size,
    i32,
    i64,
    launch,
)

__all__ = ["group_positions", "segment_sum_apply"]


def group_positions(inverse: Any, bounds: Any, out: Any) -> None:
    """Positions grouped by key, increasing within a key (see reference.group_positions)."""
    cp = cupy_module()
    n = check_array("inverse", inverse, np.int64, 1).shape[0]
    check_array("bounds", bounds, np.int64, 1)
    check_array("out", out, np.int64, 1)
    if n == 0:
        return
    # inverse < n, so inverse * n + p < n**2 fits int64 below 3e9 positions; every value is
    # distinct, so any sort gives the stable order.
    out[:] = cp.sort(inverse * n + cp.arange(n, dtype=np.int64)) % n


def segment_sum_apply(
    grads: Any,
    positions: Any,
    bounds: Any,
    rows: Any,
    kind: int,
    hyper: Any,
    values: Any,
    slots: Any,
) -> None:
    """Fused segment-sum + optimizer update, in place (see reference.optim)."""
    cp = cupy_module()
    check_array("grads", grads, np.float32, 2)
    check_array("positions", positions, np.int64, 1)
    check_array("bounds", bounds, np.int64, 1)
    u = check_array("rows", rows, np.int64, 1).shape[0]
    dim = check_array("values", values, np.float32, 2).shape[1]
    n_slots = check_array("slots", slots, np.float32, 2).shape[1]
    if not 0 <= int(kind) < OptimizerKind.COUNT:
        raise InvalidArgumentError(f"kind: unknown optimizer kind {kind}")
    # The scalars travel as kernel arguments, not a device array: a cupy hyper is read back.
    host = cp.asnumpy(hyper) if isinstance(hyper, cp.ndarray) else np.asarray(hyper)
    h = [float(x) for x in np.asarray(host, dtype=np.float64).ravel()[:4]]
    h += [0.0] * (4 - len(h))
    if u == 0:
        return
    g = group_size(dim)
    per_group = 3 * dim * 8  # float64 gradient, new value and FTRL quad of one row
    if per_group > SHARED_BYTES:
        raise InvalidArgumentError(
            f"values: dim {dim} exceeds the gpu update's limit of {SHARED_BYTES // 24}"
        )
    groups = max(1, min(BLOCK // g, SHARED_BYTES // max(per_group, 1)))
    args = (grads, i64(dim), positions, bounds, rows, i64(u), i32(kind))
    tail = (values, slots, i64(n_slots), i32(g))
    launch(
        cuda_kernel("optim", "segment_sum_apply"),
        u * g,
        (*args, *(f64(x) for x in h), *tail),
        block=g * groups,
        shared=groups * per_group,
    )
