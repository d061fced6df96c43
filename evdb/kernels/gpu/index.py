"""The hash index and the key sets: find, insert, remove, the fused probe + gather,
deduplication, the admission sketch and the Bloom filter (``cuda/index.cu``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from evdb.errors import CapacityError, InvalidArgumentError
from evdb.kernels.gpu.runtime import (
    check_array,
    check_slots,
    cuda_kernel,
    cupy_module,
    group_size,
    i32,
    i64,
    launch,
    u64,
)

__all__ = [
    "bloom_add",
    "bloom_query",
    "hash_find",
    "hash_insert",
    "hash_remove",
    "probe_gather",
    "sketch_add",
    "unique_inverse",
    "unique_rows",
]


def hash_find(slots: Any, keys: Any, out: Any) -> None:
    """out[i] = row of keys[i] or -1 (see reference.hash_find)."""
    slots, cap = check_slots(slots)
    n = check_array("keys", keys, np.int64, 1).shape[0]
    check_array("out", out, np.int64, 1)
    launch(cuda_kernel("index", "hash_find"), n, (slots, cap, keys, i64(n), out))


def hash_insert(slots: Any, keys: Any, rows: Any) -> None:
    """Insert or assign, the last occurrence of a key winning (see reference.hash_insert).

    Raises CapacityError if some key found no free slot (the index was full): the caller must
    keep the load below 1, as for the other backends.
    """
    cp = cupy_module()
    slots, cap = check_slots(slots)
    n = check_array("keys", keys, np.int64, 1).shape[0]
    check_array("rows", rows, np.int64, 1)
    if n == 0:
        return
    slot_of = cp.empty(n, np.int64)
    launch(cuda_kernel("index", "hash_insert_claim"), n, (slots, cap, keys, i64(n), slot_of))
    launch(cuda_kernel("index", "hash_insert_assign"), n, (slots, slot_of, rows, i64(n)))
    if int(slot_of.min()) < 0:
        first = int(cp.argmax(slot_of < 0))
        raise CapacityError(f"hash_insert: the index of {int(cap)} slots is full at keys[{first}]")


def hash_remove(slots: Any, keys: Any, out: Any) -> None:
    """Remove keys; out[i] = the row keys[i] had, or -1 (see reference.hash_remove)."""
    cp = cupy_module()
    slots, cap = check_slots(slots)
    n = check_array("keys", keys, np.int64, 1).shape[0]
    check_array("out", out, np.int64, 1)
    if n == 0:
        return
    slot_of, run_from, run_to = (cp.empty(n, np.int64) for _ in range(3))
    n64 = i64(n)
    launch(cuda_kernel("index", "hash_remove_find"), n, (slots, cap, keys, n64, out, slot_of))
    launch(cuda_kernel("index", "hash_remove_mark"), n, (slots, slot_of, n64))
    elect = cuda_kernel("index", "hash_remove_elect")
    launch(elect, n, (slots, cap, n64, slot_of, out, run_from, run_to))
    launch(cuda_kernel("index", "hash_remove_repair"), n, (slots, cap, n64, run_from, run_to))


def probe_gather(
    slots: Any,
    values: Any,
    last_step: Any,
    keys: Any,
    min_live_step: int,
    out: Any,
    out_rows: Any,
) -> int:
    """Fused probe + TTL check + gather (see reference.probe_gather); returns keys missing."""
    cp = cupy_module()
    slots, cap = check_slots(slots)
    dim = check_array("values", values, np.float32, 2).shape[1]
    check_array("last_step", last_step, np.int64, 1)
    n = check_array("keys", keys, np.int64, 1).shape[0]
    check_array("out", out, np.float32, 2)
    check_array("out_rows", out_rows, np.int64, 1)
    if n == 0:
        return 0
    missing = cp.zeros(1, np.uint64)
    g = group_size(dim)
    args = (slots, cap, values, i64(dim), last_step, keys, i64(n), i64(min_live_step))
    launch(cuda_kernel("index", "probe_gather"), n * g, (*args, out, out_rows, missing, i32(g)))
    return int(missing.get()[0])


def _unique(
    keys: Any,
    rows: Any | None,
    mark: Any | None,
    scratch: Any,
    out_unique: Any,
    out_inverse: Any,
    out_counts: Any,
    out_rows: Any | None,
) -> int:
    """unique_inverse (rows None) or unique_rows: claim, number, scatter, clear."""
    cp = cupy_module()
    scratch, cap = check_slots(scratch)
    n = check_array("keys", keys, np.int64, 1).shape[0]
    for name, a in (("out_unique", out_unique), ("out_inverse", out_inverse)):
        check_array(name, a, np.int64, 1)
    check_array("out_counts", out_counts, np.int64, 1)
    if n == 0:
        return 0
    if int(cap) < 2 * n:
        raise InvalidArgumentError(f"scratch: needs at least 2 n = {2 * n} slots, has {cap}")
    has_rows = i32(rows is not None)
    if rows is None or mark is None or out_rows is None:
        rows = out_rows = keys  # never read or written: has_rows is 0
        mark = cp.empty(1, np.int32)
    else:
        check_array("rows", rows, np.int64, 1)
        check_array("mark", mark, np.int32, 1)
        check_array("out_rows", out_rows, np.int64, 1)
        if n >= 2**31:  # mark holds batch positions in int32
            raise InvalidArgumentError(f"keys: at most 2**31 - 1 keys per call, got {n}")
    where = cp.empty(n, np.int64)
    is_first = cp.empty(n, np.int64)
    n64 = i64(n)
    claim = cuda_kernel("index", "unique_claim")
    launch(claim, n, (keys, n64, rows, has_rows, mark, scratch, cap, where))
    launch(cuda_kernel("index", "unique_flag_first"), n, (n64, where, mark, scratch, is_first))
    rank = cp.cumsum(is_first)  # inclusive: first occurrence at p is number rank[p] - 1
    u = int(rank[-1])
    out_counts[:u] = 0
    scatter = cuda_kernel("index", "unique_scatter")
    outs = (out_unique, out_inverse, out_counts, out_rows)
    launch(scatter, n, (keys, n64, rows, has_rows, where, mark, scratch, rank, *outs))
    launch(cuda_kernel("index", "unique_clear"), n, (n64, where, mark, scratch, is_first))
    return u


def unique_inverse(
    keys: Any, scratch: Any, out_unique: Any, out_inverse: Any, out_counts: Any
) -> int:
    """Deduplicate keys in order of first occurrence (see reference.unique_inverse)."""
    return _unique(keys, None, None, scratch, out_unique, out_inverse, out_counts, None)


def unique_rows(
    keys: Any,
    rows: Any,
    mark: Any,
    scratch: Any,
    out_unique: Any,
    out_inverse: Any,
    out_counts: Any,
    out_rows: Any,
) -> int:
    """unique_inverse that also returns each distinct key's row (see reference.unique_rows);
    keys with a row dedup through ``mark``, the others through ``scratch``."""
    return _unique(keys, rows, mark, scratch, out_unique, out_inverse, out_counts, out_rows)


def sketch_add(counters: Any, keys: Any, counts: Any, n_hashes: int, seed: int, out: Any) -> None:
    """Counting Bloom filter update, then query (see reference.sketch_add)."""
    width = check_array("counters", counters, np.uint8, 1).shape[0]
    n = check_array("keys", keys, np.int64, 1).shape[0]
    check_array("counts", counts, np.int64, 1)
    check_array("out", out, np.int64, 1)
    if width == 0 and n and n_hashes:
        raise InvalidArgumentError("counters: the sketch has no counters")
    common = (i64(width), keys)
    rest = (i64(n), i64(n_hashes), u64(seed))
    launch(cuda_kernel("index", "sketch_update"), n, (counters, *common, counts, *rest))
    launch(cuda_kernel("index", "sketch_query"), n, (counters, *common, *rest, out))


def bloom_add(bits: Any, keys: Any, n_hashes: int, seed: int) -> None:
    """Set each key's n_hashes bits (see reference.bloom_add)."""
    words = check_array("bits", bits, np.uint64, 1).shape[0]
    n = check_array("keys", keys, np.int64, 1).shape[0]
    args = (bits, i64(words), keys, i64(n), i64(n_hashes), u64(seed))
    launch(cuda_kernel("index", "bloom_add"), n, args)


def bloom_query(bits: Any, keys: Any, n_hashes: int, seed: int, out: Any) -> None:
    """out[i] = whether every bit of keys[i] is set (see reference.bloom_query)."""
    words = check_array("bits", bits, np.uint64, 1).shape[0]
    n = check_array("keys", keys, np.int64, 1).shape[0]
    check_array("out", out, np.bool_, 1)
    args = (bits, i64(words), keys, i64(n), i64(n_hashes), u64(seed), out)
    launch(cuda_kernel("index", "bloom_query"), n, args)
