"""Row bookkeeping: the stamps of pull and push (``cuda/stamp.cu``), the choice of eviction
candidates (``cuda/evict.cu``) and the merge of two sorted row sets (``cuda/merge.cu``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from evdb.kernels.gpu.runtime import (
    check_array,
    cuda_kernel,
    cupy_module,
    f64,
    group_size,
    i32,
    i64,
    launch,
    u64,
)

__all__ = [
    "clear_flags",
    "merge_newest",
    "stamp_gather_pulled",
    "stamp_pushed",
    "victim_candidates",
]


def stamp_gather_pulled(
    rows: Any,
    counts: Any,
    step: int,
    version: int,
    freq_max: int,
    freq: Any,
    last_step: Any,
    versions: Any,
    is_dirty: Any,
    is_pinned: Any,
    values: Any,
    out: Any,
) -> int:
    """Stamp and pin the rows a pull found and copy them into out (see
    reference.stamp_gather_pulled); returns how many rows were stamped."""
    cp = cupy_module()
    u = check_array("rows", rows, np.int64, 1).shape[0]
    check_array("counts", counts, np.int64, 1)
    check_array("freq", freq, np.uint32, 1)
    check_array("last_step", last_step, np.int64, 1)
    check_array("versions", versions, np.uint64, 1)
    check_array("is_dirty", is_dirty, np.bool_, 1)
    check_array("is_pinned", is_pinned, np.bool_, 1)
    dim = check_array("values", values, np.float32, 2).shape[1]
    check_array("out", out, np.float32, 2)
    if u == 0:
        return 0
    stamped = cp.zeros(1, np.uint64)
    g = group_size(dim)
    scalars = (i64(u), i64(step), u64(version), i64(freq_max))
    columns = (freq, last_step, versions, is_dirty, is_pinned, values, i64(dim), out)
    kernel = cuda_kernel("stamp", "stamp_gather_pulled")
    launch(kernel, u * g, (rows, counts, *scalars, *columns, stamped, i32(g)))
    return int(stamped.get()[0])


def stamp_pushed(
    rows: Any,
    flags: Any,
    frozen_bit: int,
    step: int,
    version: int,
    last_step: Any,
    versions: Any,
    is_dirty: Any,
) -> tuple[int, int]:
    """A push's filter and stamp (see reference.stamp_pushed); returns (dropped, frozen)."""
    cp = cupy_module()
    u = check_array("rows", rows, np.int64, 1).shape[0]
    check_array("flags", flags, np.uint8, 1)
    check_array("last_step", last_step, np.int64, 1)
    check_array("versions", versions, np.uint64, 1)
    check_array("is_dirty", is_dirty, np.bool_, 1)
    if u == 0:
        return 0, 0
    counted = cp.zeros(2, np.uint64)
    args = (rows, i64(u), flags, i32(frozen_bit), i64(step), u64(version))
    launch(cuda_kernel("stamp", "stamp_pushed"), u, (*args, last_step, versions, is_dirty, counted))
    dropped, frozen = (int(x) for x in counted.get())
    return dropped, frozen


def clear_flags(flags: Any, rows: Any) -> None:
    """flags[rows] = False (see reference.clear_flags)."""
    check_array("flags", flags, np.bool_, 1)
    n = check_array("rows", rows, np.int64, 1).shape[0]
    launch(cuda_kernel("stamp", "clear_flags"), n, (flags, rows, i64(n)))


def victim_candidates(
    is_live: Any,
    is_pinned: Any,
    is_protected: Any,
    freq: Any,
    last_step: Any,
    step: int,
    half_life_steps: int,
    min_live_step: int,
    lfu: bool,
    out_rows: Any,
    out_scores: Any,
    out_expired: Any,
) -> int:
    """The rows that may be victims, in row order, with their scores (see
    reference.victim_candidates); returns how many were written."""
    cp = cupy_module()
    h = check_array("is_live", is_live, np.bool_, 1).shape[0]
    check_array("is_pinned", is_pinned, np.bool_, 1)
    check_array("is_protected", is_protected, np.bool_, 1)
    check_array("freq", freq, np.uint32, 1)
    check_array("last_step", last_step, np.int64, 1)
    check_array("out_rows", out_rows, np.int64, 1)
    check_array("out_scores", out_scores, np.float64, 1)
    check_array("out_expired", out_expired, np.bool_, 1)
    if h == 0:
        return 0
    columns = (is_live, is_pinned, is_protected, last_step, i64(h), i64(min_live_step))
    take = cp.empty(h, np.int64)
    launch(cuda_kernel("evict", "victim_flag"), h, (*columns, take))
    rank = cp.cumsum(take)  # inclusive: candidate r goes to slot rank[r] - 1
    score = (freq, i64(step), f64(half_life_steps), i32(bool(lfu)), rank)
    outs = (out_rows, out_scores, out_expired)
    launch(cuda_kernel("evict", "victim_scatter"), h, (*columns, *score, *outs))
    return int(rank[-1])


def merge_newest(
    a_keys: Any,
    a_values: Any,
    a_steps: Any,
    a_removed: Any,
    b_keys: Any,
    b_values: Any,
    b_steps: Any,
    b_removed: Any,
    out_keys: Any,
    out_values: Any,
    out_steps: Any,
    out_removed: Any,
) -> int:
    """The union of two sorted row sets, b's row where both have a key (see
    reference.merge_newest); returns how many rows were written."""
    cp = cupy_module()
    sides: list[int] = []
    for side, (keys, values, steps, removed) in (
        ("a", (a_keys, a_values, a_steps, a_removed)),
        ("b", (b_keys, b_values, b_steps, b_removed)),
        ("out", (out_keys, out_values, out_steps, out_removed)),
    ):
        check_array(f"{side}_values", values, np.float32, 2)
        check_array(f"{side}_steps", steps, np.int64, 1)
        check_array(f"{side}_removed", removed, np.bool_, 1)
        sides.append(int(check_array(f"{side}_keys", keys, np.int64, 1).shape[0]))
    na, nb = sides[0], sides[1]
    dim = out_values.shape[1]
    if na + nb == 0:
        return 0
    dup = cp.zeros(max(na, 1), np.int64)
    launch(cuda_kernel("merge", "merge_flag"), na, (a_keys, i64(na), b_keys, i64(nb), dup))
    dups = cp.cumsum(dup)  # inclusive: a's keys in a[0 .. i] that b replaces
    a = (a_keys, a_values, a_steps, a_removed, i64(na))
    b = (b_keys, b_values, b_steps, b_removed, i64(nb))
    outs = (out_keys, out_values, out_steps, out_removed)
    launch(cuda_kernel("merge", "merge_scatter"), na + nb, (*a, *b, dups, i64(dim), *outs))
    return na + nb - (int(dups[na - 1]) if na else 0)
