"""The 64-bit mixer every backend hashes keys with (splitmix64's finaliser, Steele et al. 2014).

Kept in one place so the index layout, the Bloom sketch and the initializers agree bit for bit
across numpy, numba and CUDA.
"""

from __future__ import annotations

import numpy as np

GOLDEN_GAMMA = np.uint64(0x9E3779B97F4A7C15)
# A key trace keeps a key when mix64(key ^ salt) >> (64 - SAMPLE_BITS) is under its threshold
# (evdb.sizing_kernels, and the dedup kernels' unique_sampled)
SAMPLE_BITS = 53
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


def mix64_np(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser of a uint64 array (wrapping arithmetic); returns a new array."""
    x = x.astype(np.uint64, copy=True)
    x ^= x >> _S30
    x *= _M1
    x ^= x >> _S27
    x *= _M2
    x ^= x >> _S31
    return x
