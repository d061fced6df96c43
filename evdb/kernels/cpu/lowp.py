"""Numba low-precision rows: bfloat16 / float16 rounding (to nearest even or stochastic) and
widening (see ``reference.lowp`` for the formats and the random bits). Row-wise int8 / int4
quantisation is in ``cpu.quantize``, the fused probes over such rows in ``cpu.lowp_gather``,
the fused update in ``cpu.lowp_optim``.

Half-precision slabs enter the kernels as ``uint16`` bit patterns whatever their format (the
wrappers view a float16 array as uint16 and pass ``fmt``: 0 bfloat16, 1 float16), and float32
rows as their ``uint32`` bits where a kernel works on bits; so each kernel has one compiled
signature for both formats and no float16 arithmetic in numba.
"""

from __future__ import annotations

import math
import sys

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from evdb.kernels.cpu._common import (
    F4_2D,
    I8,
    OPTS,
    PARALLEL_MIN_KEYS,
    b1,
    f4,
    f8,
    i8,
    lazy_njit,
    mix64,
    u8,
)
from evdb.kernels.reference.lowp import (
    ROUND_SALT,
    half_format,
)

__all__ = ["round_rows", "widen_rows"]

u2, u4 = types.uint16, types.uint32
U1_2D = types.Array(types.uint8, 2, "C")
U2_2D = types.Array(types.uint16, 2, "C")
U4_2D = types.Array(types.uint32, 2, "C")
GOLDEN = np.uint64(0x9E3779B97F4A7C15)
ROW_CHUNK = 64  # rows per parallel task
BAG_CHUNK = 32  # bags per task, as cpu.bags
GATHER_CHUNK = 32  # keys probed together, as cpu.index


if sys.byteorder != "little":  # narrow_chunk reads a hash's 16-bit slices through a uint16 view
    raise ImportError("evdb.kernels.cpu.lowp: the rounding's bit layout assumes little-endian")


def _fmt(name: str, a: np.ndarray) -> int:
    return 0 if half_format(name, a) == "bfloat16" else 1


# -- elements -----------------------------------------------------------------------------


@lazy_njit(u8(u8, i8), inline="always")
def step_salt(seed, step):  # type: ignore[no-untyped-def]
    """mix64((seed ^ ROUND_SALT) + step * G): the part of the random bits shared by a step."""
    return mix64((seed ^ np.uint64(ROUND_SALT)) + np.uint64(step) * GOLDEN)


@lazy_njit(u8(u8, i8), inline="always")
def row_base(salt, key):  # type: ignore[no-untyped-def]
    """mix64(key ^ salt): the part of the random bits shared by a row's columns."""
    return mix64(np.uint64(key) ^ salt)


@lazy_njit(u8(u8, i8), inline="always")
def group_bits(base, g):  # type: ignore[no-untyped-def]
    """The 64 random bits of columns 4g .. 4g + 3 of the row whose base is ``base``: 16 a
    column, column 4g + k in bits 16k .. 16k + 15 (reference.lowp.rounding_bits)."""
    return mix64(base + np.uint64(g + 1) * GOLDEN)


@intrinsic
def float32_bits(typingctx, x):  # type: ignore[no-untyped-def]
    """The bit pattern of float32 x as a uint32 (a bit cast: LLVM vectorises it)."""
    if x != f4:
        return None

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.bitcast(args[0], ir.IntType(32))

    return u4(f4), codegen


@intrinsic
def bits_float32(typingctx, b):  # type: ignore[no-untyped-def]
    """The float32 whose bit pattern is the low 32 bits of integer b (numba widens the
    integers of inlined helpers to 64 bits)."""
    if not isinstance(b, types.Integer):
        return None

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        low = context.cast(builder, args[0], signature.args[0], u4)
        return builder.bitcast(low, ir.FloatType())

    return f4(b), codegen


def _bfloat16_ir(builder, xb, add):  # type: ignore[no-untyped-def]
    """bfloat16 bits of float32 bits xb (i32) plus add (i32), truncated; NaN keeps its top
    bits, made quiet. In 32-bit integers, the select too: numba widens its integer arithmetic
    to 64 bits, which halves the SIMD lanes (a push of bfloat16 rows spent 2x the rounding
    time there), and a select of 16-bit lanes cost a rounded row 23 ns against 14."""
    i32, i16 = ir.IntType(32), ir.IntType(16)
    nan = builder.icmp_unsigned(">", builder.and_(xb, i32(0x7FFFFFFF)), i32(0x7F800000))
    kept = builder.select(nan, builder.or_(xb, i32(0x400000)), builder.add(xb, add))
    return builder.trunc(builder.lshr(kept, i32(16)), i16)


def _float16_ir(builder, xb, add):  # type: ignore[no-untyped-def]
    """float16 bits of float32 bits xb (i32) unless float16-tiny (then a wrong value), with
    add (i32) added below the 13 bits cut off: float16_bits_normal's selects in 32 bits."""
    i32, i16 = ir.IntType(32), ir.IntType(16)
    sign = builder.and_(builder.lshr(xb, i32(16)), i32(0x8000))
    a = builder.and_(xb, i32(0x7FFFFFFF))
    h = builder.sub(builder.lshr(builder.add(a, add), i32(13)), i32(112 << 10))
    h = builder.select(builder.icmp_unsigned(">=", a, i32(0x47800000)), i32(0x7C00), h)
    payload = builder.lshr(builder.and_(a, i32(0x7FFFFF)), i32(13))
    payload = builder.select(builder.icmp_unsigned("==", payload, i32(0)), i32(1), payload)
    h = builder.select(
        builder.icmp_unsigned(">", a, i32(0x7F800000)), builder.or_(payload, i32(0x7C00)), h
    )  # NaN, as numpy converts it
    h = builder.select(builder.icmp_unsigned("==", a, i32(0)), i32(0), h)
    return builder.trunc(builder.or_(sign, h), i16)


def _rounding_intrinsic(element, stochastic: bool):  # type: ignore[no-untyped-def]
    """An intrinsic (xb, r) -> uint16: element's rounding of float32 bits xb, stochastic with
    16 random bits r, or to nearest even (r ignored)."""

    def typer(typingctx, xb, r):  # type: ignore[no-untyped-def]
        if not (isinstance(xb, types.Integer) and isinstance(r, types.Integer)):
            return None

        def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
            i32 = ir.IntType(32)
            x = context.cast(builder, args[0], signature.args[0], u4)
            bits = context.cast(builder, args[1], signature.args[1], u4)
            if element is _bfloat16_ir and stochastic:
                add = bits
            elif element is _bfloat16_ir:
                add = builder.add(builder.and_(builder.lshr(x, i32(16)), i32(1)), i32(0x7FFF))
            elif stochastic:  # carries exactly when the top 13 of the 16 bits < the fraction
                add = builder.sub(i32(0x1FFF), builder.lshr(bits, i32(3)))
            else:
                add = builder.add(builder.and_(builder.lshr(x, i32(13)), i32(1)), i32(0xFFF))
            return element(builder, x, add)

        return u2(xb, r), codegen

    return intrinsic(typer)


bfloat16_stochastic = _rounding_intrinsic(_bfloat16_ir, True)
bfloat16_nearest = _rounding_intrinsic(_bfloat16_ir, False)
float16_normal_stochastic = _rounding_intrinsic(_float16_ir, True)
float16_normal_nearest = _rounding_intrinsic(_float16_ir, False)


@intrinsic
def or_float16_tiny(typingctx, acc, xb):  # type: ignore[no-untyped-def]
    """acc | 1 if float32 bits xb are float16-tiny (is_float16_tiny), as a uint32: a flag
    gathered over a row in 32-bit lanes (numba's own integers are 64-bit: a count of them
    halved the lanes of the row's rounding)."""
    if not (isinstance(acc, types.Integer) and isinstance(xb, types.Integer)):
        return None

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        i32 = ir.IntType(32)
        a = context.cast(builder, args[0], signature.args[0], u4)
        x = builder.and_(context.cast(builder, args[1], signature.args[1], u4), i32(0x7FFFFFFF))
        tiny = builder.icmp_unsigned("<", builder.sub(x, i32(1)), i32(0x387FFFFF))
        return builder.or_(a, builder.zext(tiny, i32))

    return u4(acc, xb), codegen


@lazy_njit(u2(u4, u8, b1), inline="always")
def bfloat16_bits(xb, r, stochastic):  # type: ignore[no-untyped-def]
    """bfloat16 bits of float32 bits xb: add the 16 random bits r (or half an ulp, ties to
    even) below the cut, then truncate; NaN keeps its top bits, made quiet."""
    if stochastic:
        return bfloat16_stochastic(xb, r)
    return bfloat16_nearest(xb, r)


@lazy_njit(u2(f8, u8, b1), inline="always")
def float16_magnitude(a, r, stochastic):  # type: ignore[no-untyped-def]
    """float16 bits of a float64 a >= 0 (not NaN): reference.lowp.float16_bits, one element,
    stochastic with 16 random bits r."""
    if a >= 65536.0:
        return np.uint16(0x7C00)
    e = -14 if a < 2.0**-14 else math.frexp(a)[1] - 1
    q = a * math.ldexp(1.0, 10 - e)  # a in ulps of its float16 binade: exact
    k = math.floor(q)
    frac = q - k
    if stochastic:
        up = np.float64(r) * (1.0 / 2**16) < frac
    else:
        up = frac > 0.5 or (frac == 0.5 and np.int64(k) % 2 == 1)
    return np.uint16(((e + 14) << 10) + np.int64(k) + np.int64(up))


@lazy_njit(b1(u4), inline="always")
def is_float16_tiny(xb):  # type: ignore[no-untyped-def]
    """Whether float32 bits xb are nonzero and below float16's normal range (2^-14)."""
    a = xb & np.uint32(0x7FFFFFFF)
    return a != np.uint32(0) and a < np.uint32(0x38800000)


@lazy_njit(u2(u4, u8, b1), inline="always")
def float16_bits_normal(xb, r, stochastic):  # type: ignore[no-untyped-def]
    """float16 bits of float32 bits xb unless is_float16_tiny(xb) (then a wrong value), in
    integer selects that vectorise. In float16's normal range the 13 bits cut off are the
    fraction of an ulp: adding 0x1FFF minus the top 13 of the 16 random bits carries exactly
    when those bits, as a fraction, are below it (float16_magnitude's r / 2^16 < frac), and
    0xFFF plus the kept lowest bit rounds to nearest even; a carry into the exponent past 15
    gives infinity."""
    if stochastic:
        return float16_normal_stochastic(xb, r)
    return float16_normal_nearest(xb, r)


@lazy_njit(u2(u4, u8, b1), inline="always")
def float16_bits(xb, r, stochastic):  # type: ignore[no-untyped-def]
    """float16 bits of float32 bits xb, as reference.lowp.float16_bits."""
    if is_float16_tiny(xb):  # float16's subnormals: the float64 rule
        sign = np.uint16((xb >> np.uint32(16)) & np.uint32(0x8000))
        return sign | float16_magnitude(abs(np.float64(bits_float32(xb))), r, stochastic)
    return float16_bits_normal(xb, r, stochastic)


@lazy_njit(u2(f8), inline="always")
def float16_nearest(v):  # type: ignore[no-untyped-def]
    """float16 bits of finite v rounded to float32, then to nearest even."""
    a = abs(np.float64(np.float32(v)))
    return float16_magnitude(a, np.uint64(0), False) | np.uint16(0x8000 if v < 0 else 0)


@lazy_njit(u4(u2), inline="always")
def float16_to_float32_bits(h):  # type: ignore[no-untyped-def]
    """float32 bits of float16 bits h, exactly (numpy's conversion, NaN payloads included),
    in selects that vectorise: a subnormal's value is its mantissa times 2^-24, exact in
    float32."""
    sign = np.uint32(h & np.uint16(0x8000)) << np.uint32(16)
    e = h & np.uint16(0x7C00)
    m = np.uint32(h & np.uint16(0x3FF))
    normal = (np.uint32(h & np.uint16(0x7FFF)) << np.uint32(13)) + np.uint32(112 << 23)
    special = np.uint32(0x7F800000) | (m << np.uint32(13))  # infinities and NaNs
    tiny = float32_bits(np.float32(m) * np.float32(2.0**-24))  # subnormals and zero
    bits = special if e == np.uint16(0x7C00) else normal
    return sign | (tiny if e == np.uint16(0) else bits)


@lazy_njit(f8(u2), inline="always")
def float16_value(h):  # type: ignore[no-untyped-def]
    """float64 value of finite float16 bits h."""
    e = np.int64((h >> np.uint16(10)) & np.uint16(0x1F))
    m = np.float64(h & np.uint16(0x3FF))
    v = m * 2.0**-24 if e == 0 else math.ldexp(1024.0 + m, e - 25)
    return -v if h & np.uint16(0x8000) else v


@lazy_njit(u4(u2, i8), inline="always")
def widen_bits(h, fmt):  # type: ignore[no-untyped-def]
    if fmt == 0:
        return np.uint32(np.uint32(h) << np.uint32(16))
    return np.uint32(float16_to_float32_bits(h))


@njit(inline="always", **OPTS)
def widen_row(src, r, fmt, out, i):  # type: ignore[no-untyped-def]
    """out[i] = the float32 bits of half row src[r]: a loop per format, so each vectorises."""
    if fmt == 0:
        for j in range(src.shape[1]):
            out[i, j] = widen_bits(src[r, j], 0)
    else:
        for j in range(src.shape[1]):
            out[i, j] = widen_bits(src[r, j], 1)


@njit(inline="always", **OPTS)
def round_element(xb, bits, stochastic, fmt):  # type: ignore[no-untyped-def]
    """Half bits of float32 bits xb (float16: unless tiny); the flags are constants where a
    loop calls it, so each loop compiles one branch-free rounding."""
    if fmt == 0:
        if stochastic:
            return bfloat16_stochastic(xb, bits)
        return bfloat16_nearest(xb, bits)
    if stochastic:
        return float16_normal_stochastic(xb, bits)
    return float16_normal_nearest(xb, bits)


@njit(inline="always", **OPTS)
def _round_span(xbits, h16, i, start, stop, stochastic, fmt, out, o):  # type: ignore[no-untyped-def]
    """out[o, j - start] = column j of record i rounded, for start <= j < stop: one loop per
    format and rounding, each branch-free; returns 1 if any is float16-tiny (to redo), else 0."""
    zero = np.uint64(0)
    tiny = np.uint32(0)
    if fmt == 0 and stochastic:
        for j in range(start, stop):
            out[o, j - start] = bfloat16_stochastic(xbits[i, j], h16[i, j])
    elif fmt == 0:
        for j in range(start, stop):
            out[o, j - start] = bfloat16_nearest(xbits[i, j], zero)
    elif stochastic:
        for j in range(start, stop):
            out[o, j - start] = float16_normal_stochastic(xbits[i, j], h16[i, j])
            tiny = or_float16_tiny(tiny, xbits[i, j])
    else:
        for j in range(start, stop):
            out[o, j - start] = float16_normal_nearest(xbits[i, j], zero)
            tiny = or_float16_tiny(tiny, xbits[i, j])
    return tiny


@njit(inline="always", **OPTS)
def _redo_tiny(xbits, h16, i, start, stop, stochastic, out, o):  # type: ignore[no-untyped-def]
    """float16's subnormals among columns start .. stop of record i, by the exact rule."""
    for j in range(start, stop):
        if is_float16_tiny(xbits[i, j]):
            r = np.uint64(h16[i, j]) if stochastic else np.uint64(0)
            out[o, j - start] = float16_bits(xbits[i, j], r, stochastic)


@njit(inline="always", **OPTS)
def narrow_chunk(xbits, bases, n, stochastic, fmt, hs, rows, lo, out, out_tail):  # type: ignore[no-untyped-def]
    """Round the float32 bits xbits[i] of records i < n to format fmt, stochastically with
    the random bits of the row whose base is bases[i], into row rows[lo + i] (skipped if
    negative) of ``out`` (its first out.shape[1] columns) and of ``out_tail`` (the rest: a
    row's half slots).

    In passes of plain loops over a chunk's scratch, each of which LLVM vectorises: the group
    hashes of all n rows (one mix64 for each four columns, into hs), then each row's rounding,
    which reads column j's 16 bits as hs viewed as uint16 (column 4g + k is bits 16k .. of
    group g: the little-endian layout of reference.lowp.rounding_bits). float16's subnormals,
    rare, are redone by the exact float64 rule. (Done a row at a time, each group's hash in
    the loop that rounds, a bfloat16 push at dim 64 took 87 ns a row against 66 this way.)"""
    width, head = xbits.shape[1], out.shape[1]
    if stochastic:
        for i in range(n):
            base = bases[i]
            for g in range(hs.shape[1]):
                hs[i, g] = group_bits(base, g)
    h16 = hs.view(np.uint16)
    for i in range(n):
        o = rows[lo + i]
        if o < 0:
            continue
        tiny = _round_span(xbits, h16, i, 0, head, stochastic, fmt, out, o)
        if width > head:
            tiny |= _round_span(xbits, h16, i, head, width, stochastic, fmt, out_tail, o)
        if tiny:
            _redo_tiny(xbits, h16, i, 0, head, stochastic, out, o)
            _redo_tiny(xbits, h16, i, head, width, stochastic, out_tail, o)


@njit(inline="always", **OPTS)
def chunk_scratch(width):  # type: ignore[no-untyped-def]
    """narrow_chunk's scratch for ROW_CHUNK records of ``width`` columns: (their float32
    bits, row bases, group hashes)."""
    return (
        np.empty((ROW_CHUNK, width), np.uint32),
        np.zeros(ROW_CHUNK, np.uint64),
        np.empty((ROW_CHUNK, (width + 3) // 4), np.uint64),
    )


# -- round and widen ----------------------------------------------------------------------
_ROUND_SIG = types.void(F4_2D, I8, I8, u8, i8, b1, i8, U2_2D)


@lazy_njit(types.void(i8, F4_2D, I8, I8, u8, i8, b1, i8, U2_2D), inline="always")
def _round_chunk(c, values, rows, keys, seed, step, stochastic, fmt, out):  # type: ignore[no-untyped-def]
    xbits, bases, hs = chunk_scratch(values.shape[1])
    salt = step_salt(seed, step)
    lo = c * ROW_CHUNK
    hi = min(lo + ROW_CHUNK, rows.shape[0])
    for i in range(hi - lo):
        for j in range(values.shape[1]):
            xbits[i, j] = float32_bits(values[lo + i, j])
        bases[i] = row_base(salt, keys[lo + i])
    narrow_chunk(xbits, bases, hi - lo, stochastic, fmt, hs, rows, lo, out, out)


@lazy_njit(_ROUND_SIG)
def _round_rows_serial(values, rows, keys, seed, step, stochastic, fmt, out):  # type: ignore[no-untyped-def]
    for c in range((rows.shape[0] + ROW_CHUNK - 1) // ROW_CHUNK):
        _round_chunk(c, values, rows, keys, seed, step, stochastic, fmt, out)


@lazy_njit(_ROUND_SIG, parallel=True)
def _round_rows_parallel(values, rows, keys, seed, step, stochastic, fmt, out):  # type: ignore[no-untyped-def]
    for c in prange((rows.shape[0] + ROW_CHUNK - 1) // ROW_CHUNK):
        _round_chunk(c, values, rows, keys, seed, step, stochastic, fmt, out)


def round_rows(values, rows, keys, seed, step, stochastic, out) -> None:  # type: ignore[no-untyped-def]
    """Round float32 rows into a half-precision slab (see reference.lowp.round_rows)."""
    fmt = _fmt("out", out)
    big = rows.shape[0] >= PARALLEL_MIN_KEYS
    kernel = _round_rows_parallel if big else _round_rows_serial
    seed = np.uint64(int(seed) & (2**64 - 1))
    kernel(values, rows, keys, seed, step, bool(stochastic), fmt, out.view(np.uint16))


_WIDEN_SIG = types.void(U2_2D, I8, i8, U4_2D)


@lazy_njit(types.void(i8, U2_2D, I8, i8, U4_2D), inline="always")
def _widen_chunk(c, src, rows, fmt, out):  # type: ignore[no-untyped-def]
    for i in range(c * ROW_CHUNK, min((c + 1) * ROW_CHUNK, rows.shape[0])):
        r = rows[i]
        if r >= 0:
            widen_row(src, r, fmt, out, i)


@lazy_njit(_WIDEN_SIG)
def _widen_rows_serial(src, rows, fmt, out):  # type: ignore[no-untyped-def]
    for c in range((rows.shape[0] + ROW_CHUNK - 1) // ROW_CHUNK):
        _widen_chunk(c, src, rows, fmt, out)


@lazy_njit(_WIDEN_SIG, parallel=True)
def _widen_rows_parallel(src, rows, fmt, out):  # type: ignore[no-untyped-def]
    for c in prange((rows.shape[0] + ROW_CHUNK - 1) // ROW_CHUNK):
        _widen_chunk(c, src, rows, fmt, out)


def widen_rows(src, rows, out) -> None:  # type: ignore[no-untyped-def]
    """Gather half-precision rows as float32 (see reference.lowp.widen_rows)."""
    fmt = _fmt("src", src)
    kernel = _widen_rows_parallel if rows.shape[0] >= PARALLEL_MIN_KEYS else _widen_rows_serial
    kernel(src.view(np.uint16), rows, fmt, out.view(np.uint32))
