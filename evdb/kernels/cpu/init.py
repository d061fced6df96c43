"""Numba initializer kernels (see ``reference.init`` for the spec)."""

from __future__ import annotations

import numpy as np
from numba import prange, types

from evdb.kernels.cpu._common import F4_2D, I8, b1, f8, i8, lazy_njit, mix64, u8
from evdb.kernels.cpu.libm import cos_sin_turns, log_positive

_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_TRUNCATE_AT = 2.0
_MAX_REDRAWS = 64
_ROUNDING = 2.0**-22  # twice a float32 ulp's relative size bounds both roundings of a value
# From this many values two threads win (normal fill: 4,096 values 12 -> 7 us, 9,120 values
# 25 -> 14; the pool wakes in 2-5 us here); was 65,536
PARALLEL_MIN_VALUES = 4096


@lazy_njit(f8(u8, i8), inline="always")
def _uniform_bits(base, col):  # type: ignore[no-untyped-def]
    """Column col's uniform of a key whose stream starts at base = mix64(key ^ salt). The
    53 bits convert as a signed int64 (the same value) because that, unlike uint64, has a
    vector instruction."""
    bits = mix64(base + np.uint64(col + 1) * _GAMMA)
    return (np.float64(np.int64(bits >> np.uint64(11))) + 0.5) * (1.0 / 9007199254740992.0)


@lazy_njit(f8(u8, u8, i8), inline="always")
def _uniform01(salt, key_bits, col):  # type: ignore[no-untyped-def]
    return _uniform_bits(mix64(key_bits ^ salt), col)


@lazy_njit(u8(u8, i8), inline="always")
def _salt(seed, stream):  # type: ignore[no-untyped-def]
    return mix64(seed + np.uint64(stream) * _GAMMA)


@lazy_njit(types.void(i8, I8, u8, f8, f8, F4_2D), inline="always")
def _uniform_row(i, keys, salt, low, high, out):  # type: ignore[no-untyped-def]
    k = np.uint64(keys[i])
    for c in range(out.shape[1]):
        out[i, c] = low + (high - low) * _uniform01(salt, k, c)


@lazy_njit(types.void(I8, u8, f8, f8, F4_2D))
def _fill_uniform_serial(keys, seed, low, high, out):  # type: ignore[no-untyped-def]
    salt = _salt(seed, 0)
    for i in range(keys.shape[0]):
        _uniform_row(i, keys, salt, low, high, out)


@lazy_njit(types.void(I8, u8, f8, f8, F4_2D), parallel=True)
def _fill_uniform_parallel(keys, seed, low, high, out):  # type: ignore[no-untyped-def]
    salt = _salt(seed, 0)
    for i in prange(keys.shape[0]):
        _uniform_row(i, keys, salt, low, high, out)


def fill_uniform(keys, seed, low, high, out) -> None:  # type: ignore[no-untyped-def]
    """out (n, dim) = uniform [low, high) per (seed, key, column) (see reference.init)."""
    big = keys.shape[0] * out.shape[1] >= PARALLEL_MIN_VALUES
    (_fill_uniform_parallel if big else _fill_uniform_serial)(keys, seed, low, high, out)


# _normal, _truncated and default_row are called, not inlined: they serve the rare paths (an
# odd last column, a value beyond the truncation, a missing key's default in a bag), and numba
# types an inlined body again in every caller. Inlined, they made the kernels slow to compile
# (2 shared cores, load 10): _fill_normal_serial 33 s, _probe_gather_combine_serial 90 s and
# _parallel 166 s; called, 6.7, 7.9 and 20 s, so a fresh server's first lookup and a trainer's
# first pull wait that much less. The rows are the same bit for bit (no fastmath: a call rounds
# as the inlined code did). The price is on TruncatedNormal's redraws, which lose the inlined
# code's shared first draw: its fill of 2,048 rows of dim 16 on one thread 0.19 -> 0.23-0.33
# ms; Normal's even dims are unchanged. Inlining _normal alone (calling _truncated) compiled in
# 18 s and cost the same.
@lazy_njit(f8(u8, u8, i8, i8))
def _normal(seed, key_bits, col, attempt):  # type: ignore[no-untyped-def]
    u1 = _uniform01(_salt(seed, 2 * attempt), key_bits, col // 2)
    u2 = _uniform01(_salt(seed, 2 * attempt + 1), key_bits, col // 2)
    r = np.sqrt(-2.0 * log_positive(u1))
    c, s = cos_sin_turns(u2)
    return r * (c if col % 2 == 0 else s)


@lazy_njit(f8(u8, u8, i8))
def _truncated(seed, key_bits, col):  # type: ignore[no-untyped-def]
    """Column col's z, redrawn from its own streams while beyond the truncation."""
    z = _normal(seed, key_bits, col, 0)
    attempt = 1
    while abs(z) > _TRUNCATE_AT and attempt < _MAX_REDRAWS:
        z = _normal(seed, key_bits, col, attempt)
        attempt += 1
    return min(max(z, -_TRUNCATE_AT), _TRUNCATE_AT)


@lazy_njit(types.void(i8, u8, u8, f8, f8, b1, F4_2D), inline="always")
def _normal_row(i, key_bits, seed, mean, std, truncate, out):  # type: ignore[no-untyped-def]
    # Columns come in Box-Muller pairs (one log and sqrt for two values), in a loop LLVM
    # vectorises (libm's polynomials inlined, see libm.py: 6,554 rows of dim 64 on two
    # threads 3.1 -> 0.26 ms). An element beyond the truncation, and an odd last column, are
    # redone one at a time by _normal, whose operations are the loop's, so every path (serial,
    # parallel, default_row) writes a key bit-identical rows.
    base0 = mix64(key_bits ^ _salt(seed, 0))
    base1 = mix64(key_bits ^ _salt(seed, 1))
    beyond = False
    for m in range(out.shape[1] // 2):
        r = np.sqrt(-2.0 * log_positive(_uniform_bits(base0, m)))
        c, s = cos_sin_turns(_uniform_bits(base1, m))
        beyond |= (abs(r * c) > _TRUNCATE_AT) | (abs(r * s) > _TRUNCATE_AT)
        out[i, 2 * m] = mean + std * (r * c)
        out[i, 2 * m + 1] = mean + std * (r * s)
    if out.shape[1] % 2:
        c = out.shape[1] - 1
        z = _truncated(seed, key_bits, c) if truncate else _normal(seed, key_bits, c, 0)
        out[i, c] = mean + std * z
    if truncate and beyond:
        # Only columns whose written value lies near or past mean +- 2 std can have |z| > 2
        # (the slack covers the two roundings, to float64 and to float32): their z is redone
        # exactly, the rest (95%) are not (6,554 rows of dim 64: 3.0 -> 0.7 ms).
        slack = (abs(mean) + 3.0 * std) * _ROUNDING
        for c in range(out.shape[1] // 2 * 2):
            if abs(np.float64(out[i, c]) - mean) >= _TRUNCATE_AT * std - slack:
                z = _normal(seed, key_bits, c, 0)
                if abs(z) > _TRUNCATE_AT:
                    out[i, c] = mean + std * _truncated(seed, key_bits, c)


@lazy_njit(types.void(I8, u8, f8, f8, b1, F4_2D))
def _fill_normal_serial(keys, seed, mean, std, truncate, out):  # type: ignore[no-untyped-def]
    for i in range(keys.shape[0]):
        _normal_row(i, np.uint64(keys[i]), seed, mean, std, truncate, out)


@lazy_njit(types.void(I8, u8, f8, f8, b1, F4_2D), parallel=True)
def _fill_normal_parallel(keys, seed, mean, std, truncate, out):  # type: ignore[no-untyped-def]
    for i in prange(keys.shape[0]):
        _normal_row(i, np.uint64(keys[i]), seed, mean, std, truncate, out)


def fill_normal(keys, seed, mean, std, truncate, out) -> None:  # type: ignore[no-untyped-def]
    """out (n, dim) = normal(mean, std) per (seed, key, column), optionally truncated at 2
    std (see reference.init)."""
    big = keys.shape[0] * out.shape[1] >= PARALLEL_MIN_VALUES
    kernel = _fill_normal_parallel if big else _fill_normal_serial
    kernel(keys, seed, mean, std, truncate, out)


@lazy_njit(types.void(i8, u8, f8, f8, u8, F4_2D, i8))
def default_row(kind, seed, a, b, key_bits, out, i):  # type: ignore[no-untyped-def]
    """out[i] = a key's default value, bit-identical to what fill_* writes: kind 0 =
    constant a, 1 = uniform [a, b), 2 = normal(a, b), 3 = truncated normal(a, b)."""
    if kind >= 2:
        _normal_row(i, key_bits, seed, a, b, kind == 3, out)
    elif kind == 1:
        salt = _salt(seed, 0)
        for c in range(out.shape[1]):
            out[i, c] = a + (b - a) * _uniform01(salt, key_bits, c)
    else:
        for c in range(out.shape[1]):
            out[i, c] = a
