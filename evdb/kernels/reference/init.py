"""Reference initializer kernels: counter-based generators, pure functions of
(seed, key, column, stream)."""

from __future__ import annotations

import numpy as np

from evdb.kernels.hashing import GOLDEN_GAMMA, mix64_np

TRUNCATE_AT = 2.0  # truncated normal keeps draws within 2 std, as tf.truncated_normal does
MAX_REDRAWS = 64  # P(|z| > 2) = 0.0455, so 64 redraws all fail with probability 1e-86


def uniform01(seed: int, keys: np.ndarray, dim: int, stream: int) -> np.ndarray:
    """(n, dim) float64 in the open interval (0, 1): 53 bits of
    ``mix64(mix64(key ^ mix64(seed + stream * G)) + (col + 1) * G)``, G the golden gamma."""
    salt = mix64_np(
        np.array([seed], dtype=np.uint64)
        + np.array([stream], dtype=np.uint64) * GOLDEN_GAMMA  # arrays wrap silently
    )
    base = mix64_np(keys.view(np.uint64) ^ salt)  # (n,)
    cols = (np.arange(1, dim + 1, dtype=np.uint64) * GOLDEN_GAMMA)[None, :]
    bits = mix64_np(base[:, None] + cols)  # (n, dim)
    return ((bits >> np.uint64(11)).astype(np.float64) + 0.5) * (1.0 / 2**53)


def standard_normal(seed: int, keys: np.ndarray, dim: int, attempt: int) -> np.ndarray:
    """(n, dim) float64 N(0, 1) by Box-Muller, both outputs used: columns 2m and 2m + 1 are
    ``r cos(t)`` and ``r sin(t)`` of the uniform pair (u1, u2) drawn at column m of streams
    2 * attempt and 2 * attempt + 1, with r = sqrt(-2 ln u1), t = 2 pi u2."""
    pairs = (dim + 1) // 2
    u1 = uniform01(seed, keys, pairs, 2 * attempt)
    u2 = uniform01(seed, keys, pairs, 2 * attempt + 1)
    r = np.sqrt(-2.0 * np.log(u1))
    t = 2.0 * np.pi * u2
    z = np.empty((keys.shape[0], 2 * pairs), dtype=np.float64)
    z[:, 0::2] = r * np.cos(t)
    z[:, 1::2] = r * np.sin(t)
    return z[:, :dim]


def fill_uniform(keys: np.ndarray, seed: int, low: float, high: float, out: np.ndarray) -> None:
    """out (n, dim) float32 = low + (high - low) * u, u = uniform01(seed, keys, dim, 0)."""
    u = uniform01(seed, keys, out.shape[1], 0)
    out[:] = low + (high - low) * u


def fill_normal(
    keys: np.ndarray, seed: int, mean: float, std: float, truncate: bool, out: np.ndarray
) -> None:
    """out (n, dim) float32 = mean + std * z, z = standard_normal(seed, keys, dim, 0).

    With ``truncate``, an element whose |z| > 2 takes the first of its own redraws (attempts
    1, 2, ...) that falls within, so it does not depend on the other keys in the batch.
    """
    dim = out.shape[1]
    z = standard_normal(seed, keys, dim, 0)
    bad = np.abs(z) > TRUNCATE_AT if truncate else np.zeros(z.shape, dtype=bool)
    attempt = 1
    while bad.any() and attempt < MAX_REDRAWS:
        rows = np.flatnonzero(bad.any(axis=1))
        redraw = standard_normal(seed, keys[rows], dim, attempt)
        sub = bad[rows]
        z[rows] = np.where(sub, redraw, z[rows])
        bad[rows] = sub & (np.abs(redraw) > TRUNCATE_AT)
        attempt += 1
    if truncate:
        np.clip(z, -TRUNCATE_AT, TRUNCATE_AT, out=z)
    out[:] = mean + std * z
