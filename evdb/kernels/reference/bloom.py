"""Reference blocked Bloom filter kernels: the specification of ``cpu/bloom.py``.

A blocked Bloom filter (Putze, Sanders & Singler 2007; the split-block layout of Parquet and
Impala, with 64-bit words) keeps each key's bits in one block of ``BLOCK_WORDS`` uint64 words,
64 bytes, one cache line: a query reads one line, where a classic Bloom filter reads one per
bit. A key sets one bit in each word of its block.

``blocks (total, BLOCK_WORDS) uint64`` holds several filters ("stages") one after another:
stage s is ``blocks[starts[s] : starts[s] + sizes[s]]`` and hashes with its own ``seeds[s]``.
For a key and a stage, ``h = mix64(key ^ seed)``:

* the block is ``((h >> 32) * size) >> 32`` (Lemire's fastrange of the high half; size < 2^32);
* in word j the bit is ``((low32(h) * SALT[j]) mod 2^32) >> 26`` (Parquet's salts, the top six
  bits of each product: a bit position 0..63).
"""

from __future__ import annotations

import numpy as np

from evdb.kernels.hashing import mix64_np

__all__ = ["BLOCK_WORDS", "SALT", "blocked_bloom_add", "blocked_bloom_query"]

BLOCK_WORDS = 8
# Parquet's split-block Bloom filter salts (odd 32-bit constants, one per word).
SALT = np.array(
    [
        0x47B6137B,
        0x44974D91,
        0x8824AD5B,
        0xA2B7289D,
        0x705495C7,
        0x2DF1424B,
        0x9EFC4947,
        0x5C6BFB31,
    ],
    dtype=np.uint64,
)
_LOW32 = np.uint64(0xFFFFFFFF)


def block_masks(keys: np.ndarray, seed: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Each key's block in a stage of ``size`` blocks, (n,) int64, and its bit in every word of
    the block, (n, BLOCK_WORDS) uint64 masks of one bit each."""
    h = mix64_np(keys.view(np.uint64) ^ np.uint64(seed))
    block = (((h >> np.uint64(32)) * np.uint64(size)) >> np.uint64(32)).astype(np.int64)
    bit = (((h & _LOW32)[:, None] * SALT[None, :]) & _LOW32) >> np.uint64(26)
    return block, np.uint64(1) << bit


def blocked_bloom_add(
    blocks: np.ndarray, start: int, size: int, keys: np.ndarray, seed: int
) -> None:
    """Add keys (n,) int64 to the stage ``blocks[start : start + size]`` hashed with seed."""
    block, masks = block_masks(keys, seed, size)
    for j in range(BLOCK_WORDS):
        np.bitwise_or.at(blocks[:, j], start + block, masks[:, j])


def blocked_bloom_query(
    blocks: np.ndarray,
    starts: np.ndarray,
    sizes: np.ndarray,
    seeds: np.ndarray,
    keys: np.ndarray,
    out: np.ndarray,
) -> None:
    """out[i] = whether some stage holds every bit of keys[i] (False: never added to any).
    starts, sizes (s,) int64 and seeds (s,) uint64 describe the stages; out (n,) bool."""
    out[:] = False
    for start, size, seed in zip(starts.tolist(), sizes.tolist(), seeds.tolist(), strict=True):
        block, masks = block_masks(keys, seed, size)
        words = blocks[start + block]  # (n, BLOCK_WORDS)
        out |= ((words & masks) == masks).all(axis=1)
