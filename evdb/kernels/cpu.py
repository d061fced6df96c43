"""Numba versions of the kernels in ``reference.py``: same names, same argument order.

Every kernel is compiled eagerly from an explicit signature with ``nogil=True, cache=True``, so
the first import pays compilation once per machine and later imports load from the cache.
Parallel kernels (``prange``) use numba's thread pool; NUMBA_NUM_THREADS caps it.

Index layout (shared with the reference and the CUDA sources): open addressing with linear
probing over power-of-two ``slots (cap, 2) int64`` of (key, row) pairs; a slot is occupied iff
its row is >= 0; the home slot of a key is ``mix64(key) & (cap - 1)``. Deletion shifts later
entries of the probe run back into the hole (no tombstones), so lookups never slow with churn.
"""

from __future__ import annotations

import numpy as np
from llvmlite import binding as _llvm
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

i8, u8, f4 = types.int64, types.uint64, types.float32
I8 = types.Array(types.int64, 1, "C")
I8_2D = types.Array(types.int64, 2, "C")
U1 = types.Array(types.uint8, 1, "C")
F4_2D = types.Array(types.float32, 2, "C")
f8, b1 = types.float64, types.boolean

_OPTS = {"nogil": True, "cache": True}

# Below this many keys the serial variant wins: waking numba's thread pool costs about 1.5 ms
# per call here (measured on 10-key batches), more than probing thousands of keys.
PARALLEL_MIN_KEYS = 16384
GATHER_CHUNK = 32  # keys whose misses probe_gather overlaps (16-128 measured the same)
_I64_MIN = np.int64(-(2**63))

# LLVM 15+ names the prefetch intrinsic by opaque pointer ("p0"), older ones by "p0i8".
_PREFETCH = "llvm.prefetch.p0" if _llvm.llvm_version_info[0] >= 15 else "llvm.prefetch.p0i8"


@intrinsic
def _prefetch(typingctx, arr, i, j):  # type: ignore[no-untyped-def]
    """Hint the cache to fetch arr[i, j] for reading (LLVM's prefetch: read, high locality)."""
    sig = types.void(arr, i, j)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(
            context, builder, aryty, ary, [args[1], args[2]], wraparound=False
        )
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, _PREFETCH)
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen


__all__ = [
    "fill_normal",
    "fill_uniform",
    "hash_find",
    "hash_insert",
    "hash_remove",
    "probe_gather",
    "sketch_add",
    "unique_inverse",
]


@njit(u8(u8), inline="always", **_OPTS)
def _mix64(x):  # type: ignore[no-untyped-def]
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


@njit(i8(i8, i8), inline="always", **_OPTS)
def _home(key, mask):  # type: ignore[no-untyped-def]
    return np.int64(_mix64(np.uint64(key)) & np.uint64(mask))


@njit(i8(I8_2D, i8, i8, i8), inline="always", **_OPTS)
def _probe_from(slots, mask, key, j):  # type: ignore[no-untyped-def]
    while True:
        r = slots[j, 1]
        if r < 0:
            return np.int64(-1)
        if slots[j, 0] == key:
            return r
        j = (j + 1) & mask


# Serial and parallel variants are separate functions, not one body wrapped twice: numba's
# cache keys entries by function name and line, so a shared body made the parallel dispatcher
# load the serial build from the cache (measured: 6.6M keys/s instead of 19M).
@njit(types.void(I8_2D, I8, I8), **_OPTS)
def _hash_find_serial(slots, keys, out):  # type: ignore[no-untyped-def]
    mask = slots.shape[0] - 1
    for i in range(keys.shape[0]):
        out[i] = _probe_from(slots, mask, keys[i], _home(keys[i], mask))


@njit(types.void(I8_2D, I8, I8), parallel=True, **_OPTS)
def _hash_find_parallel(slots, keys, out):  # type: ignore[no-untyped-def]
    mask = slots.shape[0] - 1
    for i in prange(keys.shape[0]):
        out[i] = _probe_from(slots, mask, keys[i], _home(keys[i], mask))


def hash_find(slots: np.ndarray, keys: np.ndarray, out: np.ndarray) -> None:
    """out[i] = row of keys[i] or -1 (see reference.hash_find)."""
    kernel = _hash_find_parallel if keys.shape[0] >= PARALLEL_MIN_KEYS else _hash_find_serial
    kernel(slots, keys, out)


@njit(types.void(I8_2D, I8, I8), **_OPTS)
def hash_insert(slots, keys, rows):  # type: ignore[no-untyped-def]
    mask = slots.shape[0] - 1
    for i in range(keys.shape[0]):
        key = keys[i]
        j = _home(key, mask)
        while slots[j, 1] >= 0 and slots[j, 0] != key:
            j = (j + 1) & mask
        slots[j, 0] = key
        slots[j, 1] = rows[i]


@njit(types.void(I8_2D, I8, I8), **_OPTS)
def hash_remove(slots, keys, out):  # type: ignore[no-untyped-def]
    mask = slots.shape[0] - 1
    for i in range(keys.shape[0]):
        key = keys[i]
        j = _home(key, mask)
        out[i] = -1
        while slots[j, 1] >= 0:
            if slots[j, 0] == key:
                out[i] = slots[j, 1]
                # Backward-shift deletion: pull later members of the run into the hole when
                # the hole lies on their probe path (distance home->k >= distance hole->k).
                hole = j
                k = j
                while True:
                    k = (k + 1) & mask
                    if slots[k, 1] < 0:
                        break
                    home = _home(slots[k, 0], mask)
                    if ((k - home) & mask) >= ((k - hole) & mask):
                        slots[hole, 0] = slots[k, 0]
                        slots[hole, 1] = slots[k, 1]
                        hole = k
                slots[hole, 1] = -1
                break
            j = (j + 1) & mask


@njit(
    i8(i8, I8_2D, F4_2D, I8, I8, i8, F4_2D, I8, types.Array(types.int64, 1, "C")),
    inline="always",
    **_OPTS,
)
def _probe_gather_chunk(  # type: ignore[no-untyped-def]
    chunk, slots, values, last_step, keys, min_live_step, out, out_rows, home
):
    # Three passes over one chunk of GATHER_CHUNK keys so that its cache misses overlap instead
    # of queueing behind each other: hash every key and prefetch its home slot; probe (slots
    # now in flight or cached) and prefetch the row; copy the rows. Measured on 10M rows x dim
    # 64, 2 threads: 11-16M keys/s probing and copying key by key, 19-27M/s this way.
    n = keys.shape[0]
    mask = slots.shape[0] - 1
    check_ttl = min_live_step != _I64_MIN  # without a TTL, skip the last_step load (a miss)
    lo = chunk * GATHER_CHUNK
    hi = min(lo + GATHER_CHUNK, n)
    for i in range(lo, hi):
        h = _home(keys[i], mask)
        home[i - lo] = h
        _prefetch(slots, h, 0)
    for i in range(lo, hi):
        r = _probe_from(slots, mask, keys[i], home[i - lo])
        if r >= 0:
            for col in range(0, values.shape[1], 16):  # one 64-byte line per 16 floats
                _prefetch(values, r, col)
            if check_ttl and last_step[r] < min_live_step:
                r = -1
        out_rows[i] = r
    missing = 0
    for i in range(lo, hi):
        r = out_rows[i]
        if r >= 0:
            out[i, :] = values[r, :]
        else:
            missing += 1
    return missing


_PG_SIG = i8(I8_2D, F4_2D, I8, I8, i8, F4_2D, I8)


@njit(_PG_SIG, **_OPTS)
def _probe_gather_serial(  # type: ignore[no-untyped-def]
    slots, values, last_step, keys, min_live_step, out, out_rows
):
    home = np.empty(GATHER_CHUNK, np.int64)
    missing = 0
    for c in range((keys.shape[0] + GATHER_CHUNK - 1) // GATHER_CHUNK):
        missing += _probe_gather_chunk(
            c, slots, values, last_step, keys, min_live_step, out, out_rows, home
        )
    return missing


@njit(_PG_SIG, parallel=True, **_OPTS)
def _probe_gather_parallel(  # type: ignore[no-untyped-def]
    slots, values, last_step, keys, min_live_step, out, out_rows
):
    missing = 0
    for c in prange((keys.shape[0] + GATHER_CHUNK - 1) // GATHER_CHUNK):
        home = np.empty(GATHER_CHUNK, np.int64)
        missing += _probe_gather_chunk(
            c, slots, values, last_step, keys, min_live_step, out, out_rows, home
        )
    return missing


def probe_gather(
    slots: np.ndarray,
    values: np.ndarray,
    last_step: np.ndarray,
    keys: np.ndarray,
    min_live_step: int,
    out: np.ndarray,
    out_rows: np.ndarray,
) -> int:
    """Fused probe + TTL check + gather (see reference.probe_gather); returns keys missing."""
    parallel = keys.shape[0] >= PARALLEL_MIN_KEYS
    kernel = _probe_gather_parallel if parallel else _probe_gather_serial
    return int(kernel(slots, values, last_step, keys, min_live_step, out, out_rows))


@njit(i8(I8, I8, I8, I8), **_OPTS)
def unique_inverse(keys, out_unique, out_inverse, out_counts):  # type: ignore[no-untyped-def]
    n = keys.shape[0]
    cap = 16
    while cap < 2 * n:
        cap *= 2
    mask = cap - 1
    # A private scratch index: slot -> position in out_unique (-1 empty).
    tkeys = np.empty(cap, np.int64)
    trows = np.full(cap, -1, np.int64)
    u = 0
    for i in range(n):
        key = keys[i]
        j = _home(key, mask)
        while True:
            r = trows[j]
            if r < 0:
                tkeys[j] = key
                trows[j] = u
                out_unique[u] = key
                out_counts[u] = 1
                out_inverse[i] = u
                u += 1
                break
            if tkeys[j] == key:
                out_inverse[i] = r
                out_counts[r] += 1
                break
            j = (j + 1) & mask
    return u


@njit(types.void(U1, I8, I8, i8, u8, I8), **_OPTS)
def sketch_add(counters, keys, counts, n_hashes, seed, out):  # type: ignore[no-untyped-def]
    width = np.uint64(counters.shape[0])
    n = keys.shape[0]
    for i in range(n):
        h1 = _mix64(np.uint64(keys[i]) ^ seed)
        h2 = _mix64(h1) | np.uint64(1)
        for h in range(n_hashes):
            p = np.int64((h1 + np.uint64(h) * h2) % width)
            c = np.int64(counters[p]) + counts[i]
            counters[p] = np.uint8(c if c < 255 else 255)
    # Query after the whole batch, as the reference does.
    for i in range(n):
        h1 = _mix64(np.uint64(keys[i]) ^ seed)
        h2 = _mix64(h1) | np.uint64(1)
        best = np.int64(255)
        for h in range(n_hashes):
            p = np.int64((h1 + np.uint64(h) * h2) % width)
            best = min(best, np.int64(counters[p]))
        out[i] = best if n_hashes > 0 else 0


# -- initializers (see reference.uniform01 / standard_normal for the spec) ------------------
_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_TWO_PI = 2.0 * np.pi
_TRUNCATE_AT = 2.0
_MAX_REDRAWS = 64


@njit(f8(u8, u8, i8), inline="always", **_OPTS)
def _uniform01(salt, key_bits, col):  # type: ignore[no-untyped-def]
    base = _mix64(key_bits ^ salt)
    bits = _mix64(base + np.uint64(col + 1) * _GAMMA)
    return (np.float64(bits >> np.uint64(11)) + 0.5) * (1.0 / 9007199254740992.0)


@njit(u8(u8, i8), inline="always", **_OPTS)
def _salt(seed, stream):  # type: ignore[no-untyped-def]
    return _mix64(seed + np.uint64(stream) * _GAMMA)


@njit(types.void(I8, u8, f8, f8, F4_2D), parallel=True, **_OPTS)
def fill_uniform(keys, seed, low, high, out):  # type: ignore[no-untyped-def]
    salt = _salt(seed, 0)
    for i in prange(keys.shape[0]):
        k = np.uint64(keys[i])
        for c in range(out.shape[1]):
            out[i, c] = low + (high - low) * _uniform01(salt, k, c)


@njit(f8(u8, u8, i8, i8), inline="always", **_OPTS)
def _normal(seed, key_bits, col, attempt):  # type: ignore[no-untyped-def]
    u1 = _uniform01(_salt(seed, 2 * attempt), key_bits, col // 2)
    u2 = _uniform01(_salt(seed, 2 * attempt + 1), key_bits, col // 2)
    r = np.sqrt(-2.0 * np.log(u1))
    return r * (np.cos(_TWO_PI * u2) if col % 2 == 0 else np.sin(_TWO_PI * u2))


@njit(types.void(I8, u8, f8, f8, b1, F4_2D), parallel=True, **_OPTS)
def fill_normal(keys, seed, mean, std, truncate, out):  # type: ignore[no-untyped-def]
    # Always parallel: one compiled body for every batch size keeps the float64 math (log,
    # cos, sin) on one code path, so lookup and pull produce bit-identical start rows.
    # Columns come in Box-Muller pairs (one log and sqrt for two values: 8 -> 4.6 ms for
    # 6,554 x 64 values); an element outside the truncation redraws on its own.
    dim = out.shape[1]
    s0 = _salt(seed, 0)
    s1 = _salt(seed, 1)
    for i in prange(keys.shape[0]):
        k = np.uint64(keys[i])
        for m in range((dim + 1) // 2):
            r = np.sqrt(-2.0 * np.log(_uniform01(s0, k, m)))
            t = _TWO_PI * _uniform01(s1, k, m)
            for c in range(2 * m, min(2 * m + 2, dim)):
                z = r * (np.cos(t) if c % 2 == 0 else np.sin(t))
                if truncate:
                    attempt = 1
                    while abs(z) > _TRUNCATE_AT and attempt < _MAX_REDRAWS:
                        z = _normal(seed, k, c, attempt)
                        attempt += 1
                    z = min(max(z, -_TRUNCATE_AT), _TRUNCATE_AT)
                out[i, c] = mean + std * z
