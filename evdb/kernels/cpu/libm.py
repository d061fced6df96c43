"""float64 log and sin/cos as straight-line code, so LLVM vectorises the loops that call them.

numba lowers ``np.log``, ``np.cos`` and ``np.sin`` to calls into the C library, one element
at a time: the normal initializer spent 15 ns a value in them (6,554 new rows of dim 64,
3.1 ms on two threads). These are fdlibm's polynomials (the code behind glibc's, FreeBSD's
and musl's), accurate to under 1 ulp like the library's, with the branches replaced by
selects: the same rows come out 7-12x faster, and after rounding to float32 they equal the
library's results but for about 1 value in 20 million (by one float32 ulp). The vectorised
and the scalar code are the same IEEE operations in the same order (no fast-math, no FMA
contraction), so every caller gets bit-identical results.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from evdb.kernels.cpu._common import OPTS


@intrinsic
def _bits_of(typingctx, x):  # type: ignore[no-untyped-def]
    """The IEEE bits of a float64, as an int64 (C's memcpy into a long)."""

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.bitcast(args[0], ir.IntType(64))

    return types.int64(types.float64), codegen


@intrinsic
def _float_of(typingctx, bits):  # type: ignore[no-untyped-def]
    """The float64 whose IEEE bits are the int64 given."""

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.bitcast(args[0], ir.DoubleType())

    return types.float64(types.int64), codegen


# fdlibm e_log.c: log(1 + f) = f - hfsq + s (hfsq + R(s^2)), s = f / (2 + f)
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_LG1 = 6.666666666666735130e-01
_LG2 = 3.999999999940941908e-01
_LG3 = 2.857142874366239149e-01
_LG4 = 2.222219843214978396e-01
_LG5 = 1.818357216161805012e-01
_LG6 = 1.531383769920937332e-01
_LG7 = 1.479819860511658591e-01
_MANTISSA = np.int64((1 << 52) - 1)
_ONE_BITS = np.int64(0x3FF << 52)
_SQRT2_CARRY = np.int64(0x95F64 << 32)  # carries into bit 52 when the mantissa is >= sqrt(2)
_BIT52 = np.int64(1 << 52)


@njit(inline="always", **OPTS)
def log_positive(x):  # type: ignore[no-untyped-def]
    """ln x for a positive normal float64 x (no check: zero, negatives, subnormals, inf and
    nan give garbage). x = 2^k m with m in [sqrt(2)/2, sqrt(2)), f = m - 1."""
    bits = _bits_of(x)
    k = (bits >> 52) - 1023
    mantissa = bits & _MANTISSA
    carry = (mantissa + _SQRT2_CARRY) & _BIT52  # m >= sqrt(2): halve it, k + 1
    f = _float_of(mantissa | (carry ^ _ONE_BITS)) - 1.0
    k += carry >> 52
    hfsq = 0.5 * f * f
    s = f / (2.0 + f)
    z = s * s
    w = z * z
    r = z * (_LG1 + w * (_LG3 + w * (_LG5 + w * _LG7))) + w * (_LG2 + w * (_LG4 + w * _LG6))
    dk = np.float64(k)
    return dk * _LN2_HI - ((hfsq - (s * (hfsq + r) + dk * _LN2_LO)) - f)


# FreeBSD k_sin.c and k_cos.c: sin and cos on [-pi/4, pi/4]
_S1 = -1.66666666666666324348e-01
_S2 = 8.33333333332248946124e-03
_S3 = -1.98412698298579493134e-04
_S4 = 2.75573137070700676789e-06
_S5 = -2.50507602534068634195e-08
_S6 = 1.58969099521155010221e-10
_C1 = 4.16666666666666019037e-02
_C2 = -1.38888888888741095749e-03
_C3 = 2.48015872894767294178e-05
_C4 = -2.75573143513906633035e-07
_C5 = 2.08757232129817482790e-09
_C6 = -1.13596475577881948265e-11
_TWO_PI = 2.0 * np.pi


@njit(inline="always", **OPTS)
def cos_sin_turns(u):  # type: ignore[no-untyped-def]
    """(cos 2 pi u, sin 2 pi u) for u in [0, 1]. The reduction is exact: q = the nearest
    quarter turn, u - q / 4 is a float64 without rounding, and only then scaled by 2 pi."""
    q = np.floor(4.0 * u + 0.5)
    x = (u - 0.25 * q) * _TWO_PI  # in [-pi/4, pi/4]
    z = x * x
    w = z * z
    r = _S2 + z * (_S3 + z * _S4) + z * w * (_S5 + z * _S6)
    sin_x = x + z * x * (_S1 + z * r)
    r = z * (_C1 + z * (_C2 + z * _C3)) + w * w * (_C4 + z * (_C5 + z * _C6))
    hz = 0.5 * z
    v = 1.0 - hz
    cos_x = v + (((1.0 - v) - hz) + z * r)
    quarter = np.int64(q)  # 0..4: turn by quarter * pi / 2, as selects (a switch would
    odd = (quarter & 1) != 0  # keep LLVM from vectorising the caller's loop)
    c = sin_x if odd else cos_x
    s = cos_x if odd else sin_x
    c = -c if ((quarter + 1) & 2) != 0 else c
    s = -s if (quarter & 2) != 0 else s
    return c, s
