"""CUDA kernels through cupy: the names and argument order of ``evdb.kernels.reference``.

Arrays are cupy arrays on the current device, C-contiguous, of the reference's dtypes;
outputs are written in place. Scalars may be Python or numpy numbers. Kernels that return a
count (``probe_gather``, ``probe_gather_combine``, ``unique_inverse``, ``unique_rows``, the
stamps, ``victim_candidates``, ``merge_newest``) copy it to the host, which waits for the
device; ``hash_insert`` also waits, to check that every key found room. The others only
enqueue work on cupy's current stream.

The CUDA C sources are ``cuda/*.cu``, one per concern like the reference's modules (index,
bags, optim, init, stamp, evict, merge), each opening with its memory layout, atomics and
races. They are compiled
by NVRTC through ``cupy.RawModule`` on first use, once per device (``_function`` is memoised
by device id) and cached on disk by cupy across processes.

Host-side steps that stay with cupy, where a hand kernel would buy nothing:

* ``unique_inverse`` / ``unique_rows``: the prefix sum that numbers first occurrences
  (``cupy.cumsum``, a CUB scan) between the claim and scatter kernels; likewise the prefix
  sums that give ``victim_candidates`` and ``merge_newest`` their output slots.
* ``group_positions``: one sort of ``inverse * n + position`` (``cupy.sort``, CUB's radix
  sort): the keys are distinct, so the result is the stable order whatever the sort; a hand
  counting sort would need the same ranks, i.e. a sort or a scan per key.
* scratch buffers (``cupy.empty`` / ``cupy.zeros`` from cupy's memory pool).

cupy is imported only when a kernel runs, so ``import evdb.kernels.gpu`` works without it;
``require()`` (which ``backend("gpu")`` calls) raises :class:`~evdb.errors.ConfigError` with
install advice when cupy or a CUDA device is missing.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import numpy as np

from evdb.errors import CapacityError, ConfigError, InvalidArgumentError, InvalidTypeError
from evdb.kernels import OptimizerKind

CUDA_DIR = Path(__file__).with_name("cuda")
SOURCES = ("index", "bags", "optim", "init", "stamp", "evict", "merge")
NVRTC_OPTIONS = ("--std=c++17",)
BLOCK = 256  # threads per block: 8 warps, enough to hide a probe's miss on every SM
SHARED_BYTES = 48 * 1024  # dynamic shared memory available without an opt-in attribute

_INCLUDE = re.compile(r'^#include "([^"]+)"[^\n]*$', re.MULTILINE)
_U64 = (1 << 64) - 1


def _cupy() -> Any:
    """The cupy module, or a ConfigError saying how to get a working one."""
    try:
        import cupy
    except ImportError as exc:  # also a broken install (no CUDA runtime for the wheel)
        raise ConfigError(f"the gpu backend needs cupy: pip install evdb[gpu] ({exc})") from exc
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # CUDARuntimeError: no driver, or no device visible
        raise ConfigError(f"the gpu backend found no CUDA device ({exc})") from exc
    if count == 0:
        raise ConfigError("the gpu backend found no CUDA device")
    return cupy


def require() -> None:
    """Raise ConfigError unless cupy imports and a CUDA device is present."""
    _cupy()


def source_text(name: str) -> str:
    """The CUDA source ``cuda/<name>.cu`` with its local headers pasted in, once each.

    Pasting (rather than ``-I``) makes cupy's compile cache key on the headers too, and lets
    NVRTC compile the text without an include path.
    """
    seen: set[str] = set()

    def expand(filename: str) -> str:
        if filename in seen:
            return ""
        seen.add(filename)
        text = (CUDA_DIR / filename).read_text(encoding="utf-8")
        return _INCLUDE.sub(lambda m: expand(m.group(1)), text)

    return expand(f"{name}.cu")


@functools.cache
def _module(device_id: int, source: str) -> Any:
    cp = _cupy()
    with cp.cuda.Device(device_id):
        return cp.RawModule(code=source_text(source), options=NVRTC_OPTIONS)


@functools.cache
def _function(device_id: int, source: str, name: str) -> Any:
    cp = _cupy()
    with cp.cuda.Device(device_id):
        return _module(device_id, source).get_function(name)


def _kernel(source: str, name: str) -> Any:
    """Kernel ``name`` of ``cuda/<source>.cu`` on the current device (tests/gpu checks that
    every name used here is an entry of the compiled source)."""
    cp = _cupy()
    return _function(int(cp.cuda.runtime.getDevice()), source, name)


def _launch(
    fn: Any, n_threads: int, args: tuple[Any, ...], *, block: int = BLOCK, shared: int = 0
) -> None:
    if n_threads <= 0:
        return
    fn(((n_threads + block - 1) // block,), (block,), args, shared_mem=shared)


def _group_size(dim: int) -> int:
    """Lanes per row: the power of two >= dim, within 4..32 (a warp)."""
    g = 4
    while g < 32 and g < dim:
        g *= 2
    return g


def _i32(x: Any) -> np.int32:
    return np.int32(int(x))


def _i64(x: Any) -> np.int64:
    return np.int64(int(x))


def _u64(x: Any) -> np.uint64:
    return np.uint64(int(x) & _U64)  # a negative seed wraps as numpy's uint64 view does


def _f64(x: Any) -> np.float64:
    return np.float64(float(x))


def _check(name: str, a: Any, dtype: Any, ndim: int) -> Any:
    """a itself, after checking it is a C-contiguous cupy array of dtype and ndim."""
    cp = _cupy()
    if not isinstance(a, cp.ndarray):
        raise InvalidTypeError(f"{name}: expected a cupy array, got {type(a).__name__}")
    if a.dtype != np.dtype(dtype) or a.ndim != ndim:
        raise InvalidTypeError(
            f"{name}: expected {ndim}-d {np.dtype(dtype)}, got {a.ndim}-d {a.dtype}"
        )
    if not a.flags.c_contiguous:
        raise InvalidArgumentError(f"{name}: must be C-contiguous")
    return a


def _index(slots: Any) -> tuple[Any, np.int64]:
    _check("slots", slots, np.int64, 2)
    cap = slots.shape[0]
    if slots.shape[1] != 2 or cap & (cap - 1) or cap == 0:
        raise InvalidArgumentError(
            f"slots: expected (cap, 2) with cap a power of two, got {slots.shape}"
        )
    return slots, _i64(cap)


# -- hash index ---------------------------------------------------------------------------


def hash_find(slots: Any, keys: Any, out: Any) -> None:
    """out[i] = row of keys[i] or -1 (see reference.hash_find)."""
    slots, cap = _index(slots)
    n = _check("keys", keys, np.int64, 1).shape[0]
    _check("out", out, np.int64, 1)
    _launch(_kernel("index", "hash_find"), n, (slots, cap, keys, _i64(n), out))


def hash_insert(slots: Any, keys: Any, rows: Any) -> None:
    """Insert or assign, the last occurrence of a key winning (see reference.hash_insert).

    Raises CapacityError if some key found no free slot (the index was full): the caller must
    keep the load below 1, as for the other backends.
    """
    cp = _cupy()
    slots, cap = _index(slots)
    n = _check("keys", keys, np.int64, 1).shape[0]
    _check("rows", rows, np.int64, 1)
    if n == 0:
        return
    slot_of = cp.empty(n, np.int64)
    _launch(_kernel("index", "hash_insert_claim"), n, (slots, cap, keys, _i64(n), slot_of))
    _launch(_kernel("index", "hash_insert_assign"), n, (slots, slot_of, rows, _i64(n)))
    if int(slot_of.min()) < 0:
        first = int(cp.argmax(slot_of < 0))
        raise CapacityError(f"hash_insert: the index of {int(cap)} slots is full at keys[{first}]")


def hash_remove(slots: Any, keys: Any, out: Any) -> None:
    """Remove keys; out[i] = the row keys[i] had, or -1 (see reference.hash_remove)."""
    cp = _cupy()
    slots, cap = _index(slots)
    n = _check("keys", keys, np.int64, 1).shape[0]
    _check("out", out, np.int64, 1)
    if n == 0:
        return
    slot_of, run_from, run_to = (cp.empty(n, np.int64) for _ in range(3))
    n64 = _i64(n)
    _launch(_kernel("index", "hash_remove_find"), n, (slots, cap, keys, n64, out, slot_of))
    _launch(_kernel("index", "hash_remove_mark"), n, (slots, slot_of, n64))
    elect = _kernel("index", "hash_remove_elect")
    _launch(elect, n, (slots, cap, n64, slot_of, out, run_from, run_to))
    _launch(_kernel("index", "hash_remove_repair"), n, (slots, cap, n64, run_from, run_to))


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
    cp = _cupy()
    slots, cap = _index(slots)
    dim = _check("values", values, np.float32, 2).shape[1]
    _check("last_step", last_step, np.int64, 1)
    n = _check("keys", keys, np.int64, 1).shape[0]
    _check("out", out, np.float32, 2)
    _check("out_rows", out_rows, np.int64, 1)
    if n == 0:
        return 0
    missing = cp.zeros(1, np.uint64)
    g = _group_size(dim)
    args = (slots, cap, values, _i64(dim), last_step, keys, _i64(n), _i64(min_live_step))
    _launch(_kernel("index", "probe_gather"), n * g, (*args, out, out_rows, missing, _i32(g)))
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
    cp = _cupy()
    scratch, cap = _index(scratch)
    n = _check("keys", keys, np.int64, 1).shape[0]
    for name, a in (("out_unique", out_unique), ("out_inverse", out_inverse)):
        _check(name, a, np.int64, 1)
    _check("out_counts", out_counts, np.int64, 1)
    if n == 0:
        return 0
    if int(cap) < 2 * n:
        raise InvalidArgumentError(f"scratch: needs at least 2 n = {2 * n} slots, has {cap}")
    has_rows = _i32(rows is not None)
    if rows is None or mark is None or out_rows is None:
        rows = out_rows = keys  # never read or written: has_rows is 0
        mark = cp.empty(1, np.int32)
    else:
        _check("rows", rows, np.int64, 1)
        _check("mark", mark, np.int32, 1)
        _check("out_rows", out_rows, np.int64, 1)
        if n >= 2**31:  # mark holds batch positions in int32
            raise InvalidArgumentError(f"keys: at most 2**31 - 1 keys per call, got {n}")
    where = cp.empty(n, np.int64)
    is_first = cp.empty(n, np.int64)
    n64 = _i64(n)
    claim = _kernel("index", "unique_claim")
    _launch(claim, n, (keys, n64, rows, has_rows, mark, scratch, cap, where))
    _launch(_kernel("index", "unique_flag_first"), n, (n64, where, mark, scratch, is_first))
    rank = cp.cumsum(is_first)  # inclusive: first occurrence at p is number rank[p] - 1
    u = int(rank[-1])
    out_counts[:u] = 0
    scatter = _kernel("index", "unique_scatter")
    outs = (out_unique, out_inverse, out_counts, out_rows)
    _launch(scatter, n, (keys, n64, rows, has_rows, where, mark, scratch, rank, *outs))
    _launch(_kernel("index", "unique_clear"), n, (n64, where, mark, scratch, is_first))
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
    width = _check("counters", counters, np.uint8, 1).shape[0]
    n = _check("keys", keys, np.int64, 1).shape[0]
    _check("counts", counts, np.int64, 1)
    _check("out", out, np.int64, 1)
    if width == 0 and n and n_hashes:
        raise InvalidArgumentError("counters: the sketch has no counters")
    common = (_i64(width), keys)
    rest = (_i64(n), _i64(n_hashes), _u64(seed))
    _launch(_kernel("index", "sketch_update"), n, (counters, *common, counts, *rest))
    _launch(_kernel("index", "sketch_query"), n, (counters, *common, *rest, out))


def bloom_add(bits: Any, keys: Any, n_hashes: int, seed: int) -> None:
    """Set each key's n_hashes bits (see reference.bloom_add)."""
    words = _check("bits", bits, np.uint64, 1).shape[0]
    n = _check("keys", keys, np.int64, 1).shape[0]
    args = (bits, _i64(words), keys, _i64(n), _i64(n_hashes), _u64(seed))
    _launch(_kernel("index", "bloom_add"), n, args)


def bloom_query(bits: Any, keys: Any, n_hashes: int, seed: int, out: Any) -> None:
    """out[i] = whether every bit of keys[i] is set (see reference.bloom_query)."""
    words = _check("bits", bits, np.uint64, 1).shape[0]
    n = _check("keys", keys, np.int64, 1).shape[0]
    _check("out", out, np.bool_, 1)
    args = (bits, _i64(words), keys, _i64(n), _i64(n_hashes), _u64(seed), out)
    _launch(_kernel("index", "bloom_query"), n, args)


# -- initializers -------------------------------------------------------------------------


def fill_uniform(keys: Any, seed: int, low: float, high: float, out: Any) -> None:
    """out (n, dim) = uniform [low, high) per (seed, key, column) (see reference.init)."""
    n = _check("keys", keys, np.int64, 1).shape[0]
    dim = _check("out", out, np.float32, 2).shape[1]
    args = (keys, _i64(n), _i64(dim), _u64(seed), _f64(low), _f64(high), out)
    _launch(_kernel("init", "fill_uniform"), n * dim, args)


def fill_normal(keys: Any, seed: int, mean: float, std: float, truncate: bool, out: Any) -> None:
    """out (n, dim) = normal(mean, std) per (seed, key, column), optionally truncated at 2
    std (see reference.init)."""
    n = _check("keys", keys, np.int64, 1).shape[0]
    dim = _check("out", out, np.float32, 2).shape[1]
    args = (keys, _i64(n), _i64(dim), _u64(seed), _f64(mean), _f64(std), _i32(bool(truncate)))
    _launch(_kernel("init", "fill_normal"), n * dim, (*args, out))


# -- bags ---------------------------------------------------------------------------------


def _bags(bounds: Any, weights: Any, combiner: int) -> int:
    n_bags = _check("bounds", bounds, np.int64, 1).shape[0] - 1
    _check("weights", weights, np.float32, 1)
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
    cp = _cupy()
    slots, cap = _index(slots)
    dim = _check("values", values, np.float32, 2).shape[1]
    _check("last_step", last_step, np.int64, 1)
    _check("keys", keys, np.int64, 1)
    _check("out", out, np.float32, 2)
    n_bags = _bags(bounds, weights, combiner)
    if n_bags <= 0:
        return 0
    missing = cp.zeros(1, np.uint64)
    g = _group_size(dim)
    args = (slots, cap, values, _i64(dim), last_step, keys, bounds, weights, _i64(n_bags))
    scalars = (_i64(min_live_step), _i32(combiner), _f64(max_norm), _i32(init_kind))
    init = (_u64(init_seed), _f64(init_a), _f64(init_b))
    kernel = _kernel("bags", "probe_gather_combine")
    _launch(kernel, n_bags * g, (*args, *scalars, *init, out, missing, _i32(g)))
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
    dim = _check("rows", rows, np.float32, 2).shape[1]
    _check("inverse", inverse, np.int64, 1)
    _check("out", out, np.float32, 2)
    n_bags = _bags(bounds, weights, combiner)
    g = _group_size(dim)
    args = (rows, _i64(dim), inverse, bounds, weights, _i64(n_bags))
    _launch(
        _kernel("bags", "gather_combine"),
        n_bags * g,
        (*args, _i32(combiner), _f64(max_norm), out, _i32(g)),
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
    cp = _cupy()
    _check("grad_out", grad_out, np.float32, 2)
    u, dim = _check("rows", rows, np.float32, 2).shape
    _check("inverse", inverse, np.int64, 1)
    _check("out", out, np.float32, 2)
    n_bags = _bags(bounds, weights, combiner)
    acc = cp.zeros((u, dim), np.float64)  # float64 sums: atomic order barely shows
    g = _group_size(dim)
    args = (grad_out, _i64(dim), inverse, bounds, weights, _i64(n_bags), _i32(combiner))
    _launch(_kernel("bags", "combine_backward_scatter"), n_bags * g, (*args, acc, _i32(g)))
    finish = (rows, _i64(u), _i64(dim), _f64(max_norm), acc, out, _i32(g))
    _launch(_kernel("bags", "combine_backward_finish"), u * g, finish)


# -- fused update -------------------------------------------------------------------------


def group_positions(inverse: Any, bounds: Any, out: Any) -> None:
    """Positions grouped by key, increasing within a key (see reference.group_positions)."""
    cp = _cupy()
    n = _check("inverse", inverse, np.int64, 1).shape[0]
    _check("bounds", bounds, np.int64, 1)
    _check("out", out, np.int64, 1)
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
    cp = _cupy()
    _check("grads", grads, np.float32, 2)
    _check("positions", positions, np.int64, 1)
    _check("bounds", bounds, np.int64, 1)
    u = _check("rows", rows, np.int64, 1).shape[0]
    dim = _check("values", values, np.float32, 2).shape[1]
    n_slots = _check("slots", slots, np.float32, 2).shape[1]
    if not 0 <= int(kind) < OptimizerKind.COUNT:
        raise InvalidArgumentError(f"kind: unknown optimizer kind {kind}")
    # The scalars travel as kernel arguments, not a device array: a cupy hyper is read back.
    host = cp.asnumpy(hyper) if isinstance(hyper, cp.ndarray) else np.asarray(hyper)
    h = [float(x) for x in np.asarray(host, dtype=np.float64).ravel()[:4]]
    h += [0.0] * (4 - len(h))
    if u == 0:
        return
    g = _group_size(dim)
    per_group = 3 * dim * 8  # float64 gradient, new value and FTRL quad of one row
    if per_group > SHARED_BYTES:
        raise InvalidArgumentError(
            f"values: dim {dim} exceeds the gpu update's limit of {SHARED_BYTES // 24}"
        )
    groups = max(1, min(BLOCK // g, SHARED_BYTES // max(per_group, 1)))
    args = (grads, _i64(dim), positions, bounds, rows, _i64(u), _i32(kind))
    tail = (values, slots, _i64(n_slots), _i32(g))
    _launch(
        _kernel("optim", "segment_sum_apply"),
        u * g,
        (*args, *(_f64(x) for x in h), *tail),
        block=g * groups,
        shared=groups * per_group,
    )


# -- row bookkeeping, eviction, merge -------------------------------------------------------


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
    cp = _cupy()
    u = _check("rows", rows, np.int64, 1).shape[0]
    _check("counts", counts, np.int64, 1)
    _check("freq", freq, np.uint32, 1)
    _check("last_step", last_step, np.int64, 1)
    _check("versions", versions, np.uint64, 1)
    _check("is_dirty", is_dirty, np.bool_, 1)
    _check("is_pinned", is_pinned, np.bool_, 1)
    dim = _check("values", values, np.float32, 2).shape[1]
    _check("out", out, np.float32, 2)
    if u == 0:
        return 0
    stamped = cp.zeros(1, np.uint64)
    g = _group_size(dim)
    scalars = (_i64(u), _i64(step), _u64(version), _i64(freq_max))
    columns = (freq, last_step, versions, is_dirty, is_pinned, values, _i64(dim), out)
    kernel = _kernel("stamp", "stamp_gather_pulled")
    _launch(kernel, u * g, (rows, counts, *scalars, *columns, stamped, _i32(g)))
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
    cp = _cupy()
    u = _check("rows", rows, np.int64, 1).shape[0]
    _check("flags", flags, np.uint8, 1)
    _check("last_step", last_step, np.int64, 1)
    _check("versions", versions, np.uint64, 1)
    _check("is_dirty", is_dirty, np.bool_, 1)
    if u == 0:
        return 0, 0
    counted = cp.zeros(2, np.uint64)
    args = (rows, _i64(u), flags, _i32(frozen_bit), _i64(step), _u64(version))
    _launch(_kernel("stamp", "stamp_pushed"), u, (*args, last_step, versions, is_dirty, counted))
    dropped, frozen = (int(x) for x in counted.get())
    return dropped, frozen


def clear_flags(flags: Any, rows: Any) -> None:
    """flags[rows] = False (see reference.clear_flags)."""
    _check("flags", flags, np.bool_, 1)
    n = _check("rows", rows, np.int64, 1).shape[0]
    _launch(_kernel("stamp", "clear_flags"), n, (flags, rows, _i64(n)))


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
    cp = _cupy()
    h = _check("is_live", is_live, np.bool_, 1).shape[0]
    _check("is_pinned", is_pinned, np.bool_, 1)
    _check("is_protected", is_protected, np.bool_, 1)
    _check("freq", freq, np.uint32, 1)
    _check("last_step", last_step, np.int64, 1)
    _check("out_rows", out_rows, np.int64, 1)
    _check("out_scores", out_scores, np.float64, 1)
    _check("out_expired", out_expired, np.bool_, 1)
    if h == 0:
        return 0
    columns = (is_live, is_pinned, is_protected, last_step, _i64(h), _i64(min_live_step))
    take = cp.empty(h, np.int64)
    _launch(_kernel("evict", "victim_flag"), h, (*columns, take))
    rank = cp.cumsum(take)  # inclusive: candidate r goes to slot rank[r] - 1
    score = (freq, _i64(step), _f64(half_life_steps), _i32(bool(lfu)), rank)
    outs = (out_rows, out_scores, out_expired)
    _launch(_kernel("evict", "victim_scatter"), h, (*columns, *score, *outs))
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
    cp = _cupy()
    sides: list[int] = []
    for side, (keys, values, steps, removed) in (
        ("a", (a_keys, a_values, a_steps, a_removed)),
        ("b", (b_keys, b_values, b_steps, b_removed)),
        ("out", (out_keys, out_values, out_steps, out_removed)),
    ):
        _check(f"{side}_values", values, np.float32, 2)
        _check(f"{side}_steps", steps, np.int64, 1)
        _check(f"{side}_removed", removed, np.bool_, 1)
        sides.append(int(_check(f"{side}_keys", keys, np.int64, 1).shape[0]))
    na, nb = sides[0], sides[1]
    dim = out_values.shape[1]
    if na + nb == 0:
        return 0
    dup = cp.zeros(max(na, 1), np.int64)
    _launch(_kernel("merge", "merge_flag"), na, (a_keys, _i64(na), b_keys, _i64(nb), dup))
    dups = cp.cumsum(dup)  # inclusive: a's keys in a[0 .. i] that b replaces
    a = (a_keys, a_values, a_steps, a_removed, _i64(na))
    b = (b_keys, b_values, b_steps, b_removed, _i64(nb))
    outs = (out_keys, out_values, out_steps, out_removed)
    _launch(_kernel("merge", "merge_scatter"), na + nb, (*a, *b, dups, _i64(dim), *outs))
    return na + nb - (int(dups[na - 1]) if na else 0)


__all__ = [
    "bloom_add",
    "bloom_query",
    "clear_flags",
    "combine_backward",
    "fill_normal",
    "fill_uniform",
    "gather_combine",
    "group_positions",
    "hash_find",
    "hash_insert",
    "hash_remove",
    "merge_newest",
    "probe_gather",
    "probe_gather_combine",
    "require",
    "segment_sum_apply",
    "sketch_add",
    "stamp_gather_pulled",
    "stamp_pushed",
    "unique_inverse",
    "unique_rows",
    "victim_candidates",
]
