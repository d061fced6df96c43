"""Numba kernels of the blocked Bloom filter; ``evdb.kernels.reference.bloom`` is the spec
(layout, hashing, bit positions), and the results are equal bit for bit.

A query reads one 64-byte block per stage, and the blocks of the key ``QUERY_AHEAD`` places
ahead are prefetched, so the misses of several keys overlap instead of following one another.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types

from evdb.kernels.cpu._common import B1, I8, OPTS, U8, i8, lazy_njit, mix64, prefetch, u8
from evdb.kernels.reference.bloom import BLOCK_WORDS, SALT

__all__ = ["QUERY_AHEAD", "blocked_bloom_add", "blocked_bloom_query"]

U8_2D = types.Array(types.uint64, 2, "C")
QUERY_AHEAD = 8  # keys whose blocks are in flight while one is checked
_SALT = SALT.copy()  # a module global: numba freezes it into the kernel as a constant
_LOW32 = np.uint64(0xFFFFFFFF)


@lazy_njit(types.void(U8_2D, i8, i8, I8, u8))
def blocked_bloom_add(blocks, start, size, keys, seed):  # type: ignore[no-untyped-def]
    for i in range(keys.shape[0]):
        h = mix64(np.uint64(keys[i]) ^ seed)
        b = start + _block(h, size)
        x = h & _LOW32
        for j in range(BLOCK_WORDS):
            bit = ((x * _SALT[j]) & _LOW32) >> np.uint64(26)
            blocks[b, j] |= np.uint64(1) << bit


@lazy_njit(types.void(U8_2D, I8, I8, U8, I8, B1))
def blocked_bloom_query(blocks, starts, sizes, seeds, keys, out):  # type: ignore[no-untyped-def]
    n = keys.shape[0]
    n_stages = starts.shape[0]
    # the hashes of the keys in flight, by key position modulo QUERY_AHEAD and stage
    ring = np.empty((QUERY_AHEAD, max(n_stages, 1)), dtype=np.uint64)
    for i in range(-QUERY_AHEAD, n):
        if i >= 0:
            out[i] = _holds(blocks, starts, sizes, ring, i % QUERY_AHEAD)
        ahead = i + QUERY_AHEAD  # its slot of the ring is the one key i just left
        if ahead < n:
            k = np.uint64(keys[ahead])
            for s in range(n_stages):
                h = mix64(k ^ seeds[s])
                ring[ahead % QUERY_AHEAD, s] = h
                prefetch(blocks, starts[s] + _block(h, sizes[s]), 0)


@njit(inline="always", **OPTS)
def _block(h, size):  # type: ignore[no-untyped-def]
    """The block of hash h in a stage of size blocks (fastrange of the high half)."""
    return np.int64(((h >> np.uint64(32)) * np.uint64(size)) >> np.uint64(32))


@njit(inline="always", **OPTS)
def _holds(blocks, starts, sizes, ring, slot):  # type: ignore[no-untyped-def]
    """Whether some stage has every bit of the key whose hashes are ring[slot]."""
    for s in range(starts.shape[0] - 1, -1, -1):  # newest first: the largest stage, most keys
        h = ring[slot, s]
        b = starts[s] + _block(h, sizes[s])
        x = h & _LOW32
        every = np.uint64(1)
        for j in range(BLOCK_WORDS):
            every &= blocks[b, j] >> (((x * _SALT[j]) & _LOW32) >> np.uint64(26))
        if every:
            return True
    return False
