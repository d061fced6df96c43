"""The two hot loops of key tracing and sizing, in numba, beside their plain-numpy references.

- ``sample_keys``: which keys a trace keeps. A key is kept when its splitmix64 hash (salted by
  the trace's seed) falls under ``threshold / 2**53``: spatial sampling (SHARDS, Waldspurger et
  al., FAST'15), so a key is either always or never kept, and every access of a kept key is in
  the trace. Fused hash + compare + compaction in one pass: numpy's version (``mix64_np``, a
  compare and a boolean index) makes 8 passes over the batch and allocates 4 arrays.
- ``stack_distances``: each access's LRU stack distance, the number of distinct other keys
  touched since the same key's previous access (-1 for a first access), by a Fenwick tree over
  positions that marks each key's latest access: O(n log n). An LRU cache of C rows hits an
  access exactly when its distance is < C (Mattson et al. 1970).

- A recorded pull samples in its dedup pass instead (``unique_sampled``, a dedup kernel in
  ``evdb.kernels``, which a table runs), with the same hash and threshold.

- ``sample_hashed_into`` and ``smallest_add``: a recorder's ``min_keys`` (fixed-size SHARDS,
  ``evdb.trace_sample``): the kept keys with their hashes, and the ``min_keys`` smallest
  distinct hashes as a max-heap beside a linear-probing set, one compare or one probe per
  kept key (``trace_sample.SmallestHashesReference``, numpy: np.unique and a merge, cost
  111 us against 16 us for sampling a batch of 8,192 Zipf keys).

The references (``*_reference``) are the specification; ``tests/test_sizing.py`` checks the
kernels against them. They live here, not in ``evdb.kernels``, because nothing in a table
runs them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import numba
import numpy as np
from numba import njit

from evdb._types import Int64Array
from evdb.kernels.hashing import SAMPLE_BITS, mix64_np

__all__ = [
    "SPARSE_THRESHOLD",
    "THRESHOLD_BITS",
    "one_thread",
    "sample_hashed_into",
    "sample_into",
    "sample_keys",
    "sample_keys_reference",
    "sample_sparse_into",
    "sample_threshold",
    "smallest_add",
    "stack_distances",
    "stack_distances_reference",
]

THRESHOLD_BITS = SAMPLE_BITS  # kept when (hash >> 11) < threshold, threshold in [0, 2**53]
_SHIFT = np.uint64(64 - THRESHOLD_BITS)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


@contextmanager
def one_thread() -> Iterator[None]:
    """numba's parallel kernels on one thread while inside (this thread's setting: others
    keep theirs). A miniature table's batches are small work (dim 1, a few thousand keys):
    evdb's cpu kernels go parallel from 1,024 keys, and on a busy machine each parallel
    launch cost 18 ms, three quarters of a 2M-access analysis (13 s against 3.3 s)."""
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(before)


def sample_threshold(rate: float) -> int:
    """The threshold that keeps a fraction ``rate`` of the key space (rate in (0, 1])."""
    return math.floor(rate * (1 << THRESHOLD_BITS) + 0.5)


def sample_keys_reference(keys: Int64Array, salt: int, threshold: int) -> Int64Array:
    """The keys (in order, repeats kept) whose salted hash falls under the threshold."""
    h = mix64_np(keys.view(np.uint64) ^ np.uint64(salt))
    return keys[(h >> _SHIFT) < np.uint64(threshold)]


# C-contiguous keys only: an "A"-layout signature (any strides) measured 10.5 against 8.9 us
# for 8,192 keys, and a strided batch is rare (it is copied first). One multiply-shift hash
# instead of splitmix64 ran in 3.8 us, but keys that differ only in high bits would then
# share the low bits that decide.
# Branchless: a kept key is written and counted, a dropped one written and overwritten. At
# rates far from 0 and 1 (min_keys raises the rate) the branch mispredicted: 24.0 against 7.1
# us at rate 0.38 over 64 different batches of 8,192 Zipf keys; the same 7.4 us at 0.01.
# Compiled on the first call (no signature given: importing evdb compiles nothing), for the
# types callers pass: C-contiguous int64 arrays, np.uint64 salt and threshold.
@njit(nogil=True, cache=True)
def sample_into(keys, salt, threshold, out):  # type: ignore[no-untyped-def]
    """Write the kept keys of ``keys`` (n,) int64 to the front of ``out`` (n,) int64;
    returns how many (``salt``, ``threshold``: np.uint64)."""
    n = 0
    for i in range(keys.shape[0]):
        x = np.uint64(keys[i]) ^ salt
        x ^= x >> _S30
        x *= _M1
        x ^= x >> _S27
        x *= _M2
        x ^= x >> _S31
        out[n] = keys[i]  # written always (n <= i), kept by the count: no branch
        n += (x >> _SHIFT) < threshold
    return n


# At low rates, two passes: the hashes alone (a loop the compiler vectorises: 3.5 us for 8,192
# keys with AVX-512), then a branch per key, rarely taken so well predicted: 5.3 against 7.5
# us for sample_into at rate 0.01 (64 batches of 8,192 Zipf keys). At rate 0.38 the branch
# mispredicts and the pair costs 8.5 us: sample_into stays above SPARSE_THRESHOLD.
SPARSE_THRESHOLD = 1 << (THRESHOLD_BITS - 5)  # rate 1/32


@njit(nogil=True, cache=True)
def _hash_into(keys, salt, hashes):  # type: ignore[no-untyped-def]
    for i in range(keys.shape[0]):
        x = np.uint64(keys[i]) ^ salt
        x ^= x >> _S30
        x *= _M1
        x ^= x >> _S27
        x *= _M2
        x ^= x >> _S31
        hashes[i] = x >> _SHIFT


@njit(nogil=True, cache=True)
def sample_sparse_into(keys, salt, threshold, out, scratch):  # type: ignore[no-untyped-def]
    """``sample_into`` for a threshold under ``SPARSE_THRESHOLD``: the same kept keys, with
    ``scratch`` (at least n,) uint64 for the hashes."""
    _hash_into(keys, salt, scratch)
    n = 0
    for i in range(keys.shape[0]):
        if scratch[i] < threshold:
            out[n] = keys[i]
            n += 1
    return n


def sample_keys(keys: Int64Array, salt: int, threshold: int) -> Int64Array:
    """``sample_keys_reference`` in numba (a new array; keys is not changed): one pass, or
    two below ``SPARSE_THRESHOLD`` (``sample_sparse_into``)."""
    keys = np.ascontiguousarray(keys, dtype=np.int64)
    out = np.empty(keys.shape[0], dtype=np.int64)
    if threshold < SPARSE_THRESHOLD:
        scratch = np.empty(keys.shape[0], dtype=np.uint64)
        n = sample_sparse_into(keys, np.uint64(salt), np.uint64(threshold), out, scratch)
    else:
        n = sample_into(keys, np.uint64(salt), np.uint64(threshold), out)
    return out[:n].copy() if n < keys.shape[0] // 2 else out[:n]


def stack_distances_reference(ids: Int64Array) -> Int64Array:
    """Brute force: replay an LRU stack (a list, most recent first) and read each access's
    depth in it before moving the key to the top; -1 for a key not in the stack yet."""
    stack: list[int] = []
    out = np.empty(ids.shape[0], dtype=np.int64)
    for i, key in enumerate(ids.tolist()):
        if key in stack:
            depth = stack.index(key)
            stack.pop(depth)
            out[i] = depth
        else:
            out[i] = -1
        stack.insert(0, key)
    return out


@njit(nogil=True, cache=True)
def _stack_distances(ids, n_ids, out):  # type: ignore[no-untyped-def]
    n = ids.shape[0]
    last = np.full(n_ids, -1, dtype=np.int64)
    tree = np.zeros(n + 1, dtype=np.int64)  # Fenwick tree: 1 at each key's latest position
    marked = 0
    for i in range(n):
        k = ids[i]
        p = last[k]
        if p < 0:
            out[i] = -1
        else:
            s = 0  # marks at positions <= p (p's own mark included)
            j = p + 1
            while j > 0:
                s += tree[j]
                j -= j & -j
            out[i] = marked - s  # marks strictly after p: distinct keys touched since
            j = p + 1
            while j <= n:
                tree[j] -= 1
                j += j & -j
            marked -= 1
        j = i + 1
        while j <= n:
            tree[j] += 1
            j += j & -j
        marked += 1
        last[k] = i


def stack_distances(ids: Int64Array, n_ids: int) -> Int64Array:
    """LRU stack distances of ``ids`` (n,) int64, dense ids in [0, n_ids): (n,) int64, -1 for
    a first access (see ``stack_distances_reference``)."""
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    out = np.empty(ids.shape[0], dtype=np.int64)
    _stack_distances(ids, n_ids, out)
    return out


# -- fixed-size sampling (evdb.trace_sample) -----------------------------------------------
@njit(nogil=True, cache=True)
def sample_hashed_into(keys, salt, threshold, out, out_hashes):  # type: ignore[no-untyped-def]
    """``sample_into`` that also writes each kept key's 53-bit hash to ``out_hashes``."""
    n = 0
    for i in range(keys.shape[0]):
        x = np.uint64(keys[i]) ^ salt
        x ^= x >> _S30
        x *= _M1
        x ^= x >> _S27
        x *= _M2
        x ^= x >> _S31
        h = x >> _SHIFT
        out[n] = keys[i]  # written always, kept by the count (see sample_into)
        out_hashes[n] = h
        n += h < threshold
    return n


@njit(nogil=True, cache=True)
def _set_remove(table, mask, h):  # type: ignore[no-untyped-def]
    """Remove h from the linear-probing set (stored as h + 1), shifting back the entries
    after it that would otherwise be cut off from their home slot."""
    one = np.uint64(1)
    i = h & mask
    while table[i] != h + one:
        i = (i + one) & mask
    j = i
    while True:
        j = (j + one) & mask
        if table[j] == 0:
            break
        home = (table[j] - one) & mask
        # the entry at j stays when its home lies cyclically in (i, j]
        if (i <= j and i < home <= j) or (i > j and (home > i or home <= j)):
            continue
        table[i] = table[j]
        i = j
    table[i] = 0


@njit(nogil=True, cache=True)
def smallest_add(hashes, n, heap, size, table):  # type: ignore[no-untyped-def]
    """Add ``hashes[:n]`` (uint64 < 2**53) to the ``m = heap.shape[0]`` smallest distinct
    hashes: ``heap[:size]`` a max-heap of them, ``table`` (power-of-two length > 2m) the
    same as an open-addressing set of h + 1 (0: empty). Returns the new size. A hash not
    under the heap's top once it is full, or already in, costs one compare or one probe."""
    m = heap.shape[0]
    mask = np.uint64(table.shape[0] - 1)
    one = np.uint64(1)
    for t in range(n):
        h = hashes[t]
        if size == m and h >= heap[0]:
            continue
        i = h & mask
        found = False
        while table[i] != 0:
            if table[i] == h + one:
                found = True
                break
            i = (i + one) & mask
        if found:
            continue
        if size == m:  # the largest leaves, h takes its place at the top and sinks
            _set_remove(table, mask, heap[0])
            i = h & mask
            while table[i] != 0:
                i = (i + one) & mask
            table[i] = h + one
            p = 0
            while True:
                c = 2 * p + 1
                if c >= m:
                    break
                if c + 1 < m and heap[c + 1] > heap[c]:
                    c += 1
                if heap[c] <= h:
                    break
                heap[p] = heap[c]
                p = c
            heap[p] = h
        else:  # room: h rises from the bottom
            table[i] = h + one
            p = size
            while p > 0:
                q = (p - 1) // 2
                if heap[q] >= h:
                    break
                heap[p] = heap[q]
                p = q
            heap[p] = h
            size += 1
    return size
