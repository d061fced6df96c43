"""Numba row-wise int8 / int4 quantisation and dequantisation (see ``reference.lowp`` for the
layout and the rule: per row an fp16 scale and bias, then the codes). ``dequantize_row`` is
the element the fused lookups inline (``cpu.lowp_gather``, ``cpu.frozen``).
"""

from __future__ import annotations

import numpy as np
from numba import prange, types

from evdb.kernels.cpu._common import F4_2D, I8, PARALLEL_MIN_KEYS, f4, i8, lazy_njit
from evdb.kernels.cpu.lowp import (
    U1_2D,
    bits_float32,
    float16_nearest,
    float16_to_float32_bits,
    float16_value,
)
from evdb.kernels.reference.lowp import (
    FLOAT16_MAX,
    check_bits,
    check_quantize_args,
    unquantizable_row_error,
)

__all__ = ["dequantize_row", "dequantize_rows", "half_at", "quantize_rows"]


# -- quantise -----------------------------------------------------------------------------


@lazy_njit(i8(F4_2D))
def _first_unquantizable_row(values):  # type: ignore[no-untyped-def]
    for i in range(values.shape[0]):
        for j in range(values.shape[1]):
            x = values[i, j]
            if not (abs(x) <= FLOAT16_MAX):  # also NaN
                return i
    return -1


@lazy_njit(types.void(F4_2D, i8, U1_2D), parallel=True)
def _quantize_rows(values, bits, out):  # type: ignore[no-untyped-def]
    levels = (1 << bits) - 1
    dim = values.shape[1]
    for i in prange(values.shape[0]):
        lo, hi = 0.0, 0.0
        if dim:
            lo, hi = np.float64(values[i, 0]), np.float64(values[i, 0])
        for j in range(1, dim):
            x = np.float64(values[i, j])
            lo, hi = min(lo, x), max(hi, x)
        # bias: lo rounded down to float16; scale: (hi - bias) / levels rounded up
        b16 = float16_nearest(lo)
        if float16_value(b16) > lo:
            if (b16 & np.uint16(0x7FFF)) == 0:
                b16 = np.uint16(0x8001)
            elif b16 & np.uint16(0x8000):
                b16 += np.uint16(1)
            else:
                b16 -= np.uint16(1)
        bias = float16_value(b16)
        t = (hi - bias) / levels
        s16 = np.uint16(0x3C00)  # 1.0 for a row with one value: its codes are all 0
        if t > 0:
            s16 = float16_nearest(t)
            if float16_value(s16) < t:
                s16 += np.uint16(1)
        scale = float16_value(s16)
        for j in range(out.shape[1]):
            out[i, j] = 0
        out[i, 0], out[i, 1] = np.uint8(s16 & np.uint16(0xFF)), np.uint8(s16 >> np.uint16(8))
        out[i, 2], out[i, 3] = np.uint8(b16 & np.uint16(0xFF)), np.uint8(b16 >> np.uint16(8))
        for j in range(dim):
            code = np.rint((np.float64(values[i, j]) - bias) / scale)
            code = min(max(code, 0.0), np.float64(levels))
            if bits == 8:
                out[i, 4 + j] = np.uint8(code)
            else:
                out[i, 4 + j // 2] |= np.uint8(np.int64(code) << (4 * (j & 1)))


def quantize_rows(values, bits, out) -> None:  # type: ignore[no-untyped-def]
    """Quantise float32 rows row-wise (see reference.lowp.quantize_rows); raises before
    writing when bits, out's shape or a value is invalid."""
    n, dim = values.shape
    check_quantize_args(n, dim, bits, out.shape)
    bad = int(_first_unquantizable_row(values))
    if bad >= 0:
        raise unquantizable_row_error(bad)
    _quantize_rows(values, bits, out)


# -- dequantising gathers -----------------------------------------------------------------


@lazy_njit(f4(U1_2D, i8, i8), inline="always")
def half_at(q, r, col):  # type: ignore[no-untyped-def]
    """The float16 in bytes col, col + 1 of row r of q (little-endian) as float32, exactly, in
    integer operations: cpu.lowp.float16_value goes through float64 and a libm ldexp call, twice
    a row (dequantising 4,096 random rows of 1M, int8, dim 64, one thread: 175 us with it,
    81-91 with this)."""
    h = np.uint16(q[r, col]) | (np.uint16(q[r, col + 1]) << np.uint16(8))
    return bits_float32(float16_to_float32_bits(h))


@lazy_njit(types.void(U1_2D, i8, i8, F4_2D, i8), inline="always")
def dequantize_row(q, r, bits, out, i):  # type: ignore[no-untyped-def]
    """out[i] = row r of q dequantised, in float32: code * scale is exact in float32 (8 + 11
    significant bits) and the add rounds once, which equals the reference's float64 add
    rounded to float32 bit for bit (53 >= 2 * 24 + 2 bits: the double rounding is
    innocuous), at twice the SIMD width; int4 unpacks a byte's two codes at once."""
    scale = half_at(q, r, 0)
    bias = half_at(q, r, 2)
    dim = out.shape[1]
    if bits == 8:
        for j in range(dim):
            out[i, j] = np.float32(q[r, 4 + j]) * scale + bias
        return
    for k in range(dim // 2):
        b = q[r, 4 + k]
        out[i, 2 * k] = np.float32(b & np.uint8(0x0F)) * scale + bias
        out[i, 2 * k + 1] = np.float32(b >> np.uint8(4)) * scale + bias
    if dim % 2:
        out[i, dim - 1] = np.float32(q[r, 4 + dim // 2] & np.uint8(0x0F)) * scale + bias


_DQ_SIG = types.void(U1_2D, i8, I8, F4_2D)


@lazy_njit(_DQ_SIG)
def _dequantize_rows_serial(q, bits, rows, out):  # type: ignore[no-untyped-def]
    for i in range(rows.shape[0]):
        if rows[i] >= 0:
            dequantize_row(q, rows[i], bits, out, i)


@lazy_njit(_DQ_SIG, parallel=True)
def _dequantize_rows_parallel(q, bits, rows, out):  # type: ignore[no-untyped-def]
    for i in prange(rows.shape[0]):
        if rows[i] >= 0:
            dequantize_row(q, rows[i], bits, out, i)


def dequantize_rows(q, bits, rows, out) -> None:  # type: ignore[no-untyped-def]
    """Gather quantised rows as float32 (see reference.lowp.dequantize_rows)."""
    check_bits(bits)
    big = rows.shape[0] >= PARALLEL_MIN_KEYS
    (_dequantize_rows_parallel if big else _dequantize_rows_serial)(q, bits, rows, out)
