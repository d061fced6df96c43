"""Reference low-precision rows: bfloat16 / float16 storage with stochastic rounding, and
row-wise int8 / int4 quantisation for serving.

Storage formats (the dtype of the stored array says which):

* ``bfloat16``: ``uint16`` arrays of bfloat16 bit patterns (numpy has no bfloat16); the top
  half of a float32, so widening is a shift and exact.
* ``float16``: ``numpy.float16`` arrays (IEEE binary16); widening is exact.

Rounding float32 to either: round-to-nearest-even (what ``astype(np.float16)`` does), or
**stochastic**: up (away from zero) with probability equal to the fraction of an ulp below x,
so the stored value is x on average (Zhang et al., SysML 2018; FBGEMM's default for fp16
training rows). Each element draws 16 random bits: column ``c`` of the row of ``key`` at
``step`` takes bits ``16 (c % 4)`` to ``16 (c % 4) + 15`` of

    ``mix64(mix64(key ^ mix64((seed ^ ROUND_SALT) + step * G)) + (c // 4 + 1) * G)``

(G the golden gamma; the scheme of ``reference.init.uniform01`` with the step as the stream,
salted so a table's rounding never reuses its initializer's bits, one mix64 serving four
columns: in little-endian order, the uint16 view of a row's hashes is its columns' bits): a
pure function of (table seed, key, step, column), so a run is reproducible whatever the batch
order or backend. bfloat16 adds the 16 bits to the float32 bit pattern and truncates, so
P(up) = frac exactly (a float32 has 16 bits below bfloat16's); float16 rounds up when
``r / 2^16 < frac``, exact wherever frac has at most 16 bits, that is in float16's normal
range (13 bits cut off); among float16's subnormals (up to 37 bits cut off) P(up) is frac
rounded up to a multiple of 2^-16, so the rounding there is unbiased to 2^-16 of an ulp.
NaN stays NaN (quiet, numpy's bit pattern), infinities stay infinite, and a finite x past the
largest finite value rounds to infinity as IEEE round-to-nearest does (float16: from 65520).

Quantised rows (FBGEMM's inference layout, ``SparseType.INT8`` / ``INT4``): ``uint8`` rows of
``stride >= quantized_row_bytes(dim, bits)`` bytes: bytes 0-1 the float16 ``scale``, bytes 2-3
the float16 ``bias`` (little-endian), then ``dim`` int8 codes, or ``ceil(dim / 2)`` bytes of
int4 codes, element 2j in the low nibble of byte j; the padding is zero. A row's value is
``code * scale + bias``. ``bias`` is the row's minimum rounded down to float16 and ``scale``
``(max - bias) / (2^bits - 1)`` rounded up, so every code is within ``[0, 2^bits - 1]`` and a
round trip errs by at most half a step (``scale / 2``) plus float32's own rounding. (FBGEMM
rounds both to nearest and clamps, which can exceed half a step at the row's ends.) The
arithmetic is float64 and exact (code * scale + bias has at most 40 significant bits), so
every backend dequantises to the same float32 bits.
"""

from __future__ import annotations

import numpy as np

from evdb.errors import ConfigError, InvalidArgumentError, InvalidTypeError
from evdb.kernels.hashing import GOLDEN_GAMMA, mix64_np
from evdb.kernels.reference.bags import default_rows, gather_combine
from evdb.kernels.reference.index import probe_gather
from evdb.kernels.reference.stamp import stamp_gather_pulled

__all__ = [
    "FLOAT16_MAX",
    "QUANT_BITS",
    "ROUND_SALT",
    "STORAGE_DTYPES",
    "dequantize_rows",
    "probe_gather_combine_dequantized",
    "probe_gather_combine_widened",
    "probe_gather_dequantized",
    "probe_gather_widened",
    "quantize_rows",
    "quantized_row_bytes",
    "round_rows",
    "rounding_bits",
    "stamp_widen_pulled",
    "storage_dtype",
    "widen_rows",
]

ROUND_SALT = np.uint64(0x53526F756E640001)  # "SRound", then 1
STORAGE_DTYPES = {"float32": np.float32, "bfloat16": np.uint16, "float16": np.float16}
QUANT_BITS = (8, 4)
QUANT_HEADER = 4  # float16 scale + float16 bias
FLOAT16_MAX = 65504.0
_F16_INF, _BF16_QUIET = 0x7C00, 0x0040


def storage_dtype(name: str) -> np.dtype:
    """The numpy dtype that stores rows of dtype ``name`` (bfloat16 -> uint16 bit patterns).

    Raises
    ------
    ConfigError
        For a name other than "float32", "bfloat16" or "float16".
    """
    if name not in STORAGE_DTYPES:
        raise ConfigError(f"dtype: expected one of {tuple(STORAGE_DTYPES)}, got {name!r}")
    return np.dtype(STORAGE_DTYPES[name])


def half_format(name: str, a: np.ndarray) -> str:
    """ "bfloat16" or "float16" from a stored array's dtype, or InvalidTypeError naming both."""
    if a.dtype == np.uint16:
        return "bfloat16"
    if a.dtype == np.float16:
        return "float16"
    raise InvalidTypeError(
        f"{name}: expected uint16 (bfloat16 bits) or float16 storage, got {a.dtype}"
    )


def check_bits(bits: int) -> int:
    """bits itself, or InvalidArgumentError naming the choices."""
    if bits not in QUANT_BITS:
        raise InvalidArgumentError(f"bits: expected one of {QUANT_BITS} (int8, int4), got {bits}")
    return int(bits)


def quantized_row_bytes(dim: int, bits: int, *, align: int = 1) -> int:
    """Bytes of one quantised row: 4 (scale, bias) + dim (int8) or ceil(dim / 2) (int4),
    rounded up to a multiple of ``align`` (FBGEMM pads its rows to 16)."""
    payload = QUANT_HEADER + (dim if check_bits(bits) == 8 else (dim + 1) // 2)
    return -(-payload // align) * align


# -- stochastic rounding ------------------------------------------------------------------


def rounding_bits(seed: int, keys: np.ndarray, step: int, n_cols: int) -> np.ndarray:
    """(n, n_cols) uint16 random bits of each key's columns at ``step`` (module docstring)."""
    s = np.array([seed], dtype=np.uint64) ^ ROUND_SALT
    t = np.array([step], dtype=np.int64).view(np.uint64)
    salt = mix64_np(s + t * GOLDEN_GAMMA)  # arrays wrap silently
    base = mix64_np(keys.astype(np.int64).view(np.uint64) ^ salt)
    groups = np.arange(1, (n_cols + 3) // 4 + 1, dtype=np.uint64) * GOLDEN_GAMMA
    hashes = mix64_np(base[:, None] + groups[None, :])  # (n, ceil(n_cols / 4))
    cols = np.arange(n_cols)
    shift = (16 * (cols % 4)).astype(np.uint64)
    return ((hashes[:, cols // 4] >> shift) & np.uint64(0xFFFF)).astype(np.uint16)


def bfloat16_bits(x: np.ndarray, rbits: np.ndarray | None) -> np.ndarray:
    """bfloat16 bit patterns (uint16) of float32 x: stochastic with rbits (uint16, 16 random
    bits an element), else to nearest even."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    if rbits is None:
        u = u + np.uint64(0x7FFF) + ((u >> np.uint64(16)) & np.uint64(1))
    else:
        u = u + rbits.astype(np.uint64)
    out = (u >> np.uint64(16)).astype(np.uint16)
    nan = np.isnan(x)
    xb = x.astype(np.float32).view(np.uint32) >> np.uint32(16)
    out[nan] = xb[nan].astype(np.uint16) | np.uint16(_BF16_QUIET)
    return out


def float16_bits(x: np.ndarray, rbits: np.ndarray | None) -> np.ndarray:
    """float16 bit patterns (uint16) of float32 x: stochastic with rbits (uint16, 16 random
    bits an element), else to nearest even (equal to ``x.astype(np.float16)``, NaN payloads
    included)."""
    x = x.astype(np.float32)
    xb = x.view(np.uint32)
    sign = ((xb >> np.uint32(16)) & np.uint32(0x8000)).astype(np.uint16)
    with np.errstate(invalid="ignore"):  # signalling NaNs
        a = np.abs(x.astype(np.float64))
    finite = np.isfinite(a) & (a < 65536.0)
    af = np.where(finite, a, 0.0)
    # a = m 2^e with m in [0.5, 1): its float16 exponent is e - 1; below 2^-14 (zero and the
    # subnormals) the exponent is -14, whatever frexp says of zero
    exp = np.where(af < 2.0**-14, -14, np.frexp(af)[1] - 1)
    q = af / np.ldexp(1.0, exp - 10)  # a in ulps of its float16 binade: exact
    k = np.floor(q)
    frac = q - k
    if rbits is None:
        up = (frac > 0.5) | ((frac == 0.5) & (k % 2 == 1))
    else:
        up = rbits.astype(np.float64) * (1.0 / 2**16) < frac  # exact in float64
    # k = 2^10 .. 2^11 in a normal binade: the carry of k into the exponent field is right
    mag = ((exp + 14) << 10) + k.astype(np.int64) + up
    mag = np.where(finite, mag, _F16_INF)
    nan = np.isnan(x)
    nan_mag = _F16_INF + ((xb & np.uint32(0x7FFFFF)) >> np.uint32(13))
    nan_mag = np.where(nan_mag == _F16_INF, _F16_INF + 1, nan_mag)
    mag = np.where(nan, nan_mag, mag)
    return mag.astype(np.uint16) | sign


def narrow(x: np.ndarray, fmt: str, rbits: np.ndarray | None) -> np.ndarray:
    """float32 x rounded to the stored dtype of ``fmt`` (uint16 bits or float16)."""
    if fmt == "bfloat16":
        return bfloat16_bits(x, rbits)
    return float16_bits(x, rbits).view(np.float16)


def widen(stored: np.ndarray) -> np.ndarray:
    """float32 of stored bfloat16 bits or float16 values, exactly."""
    if stored.dtype == np.uint16:
        return (stored.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return stored.astype(np.float32)


def round_rows(
    values: np.ndarray,
    rows: np.ndarray,
    keys: np.ndarray,
    seed: int,
    step: int,
    stochastic: bool,
    out: np.ndarray,
) -> None:
    """Store float32 rows in a half-precision slab: ``out[rows[i]] = round(values[i])`` for
    each i with ``rows[i] >= 0``, others skipped.

    values (n, dim) float32; rows, keys (n,) int64 (the key of each row draws its bits; the
    rows >= 0 distinct, as a batch's are); out (R, dim) uint16 (bfloat16 bits) or float16.
    ``stochastic`` False rounds to nearest even and ignores seed, keys and step.
    """
    fmt = half_format("out", out)
    live = rows >= 0
    x = values[live]
    rbits = rounding_bits(seed, keys[live], step, x.shape[1]) if stochastic else None
    out[rows[live]] = narrow(x, fmt, rbits)


def widen_rows(src: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
    """Gather stored half-precision rows as float32: ``out[i] = src[rows[i]]`` where
    ``rows[i] >= 0``, untouched elsewhere. src (R, dim) uint16 (bfloat16) or float16."""
    half_format("src", src)
    live = rows >= 0
    out[live] = widen(src[rows[live]])


def stamp_widen_pulled(
    rows: np.ndarray,
    counts: np.ndarray,
    step: int,
    version: int,
    freq_max: int,
    freq: np.ndarray,
    last_step: np.ndarray,
    versions: np.ndarray,
    is_dirty: np.ndarray,
    is_pinned: np.ndarray,
    values: np.ndarray,
    out: np.ndarray,
) -> int:
    """``reference.stamp.stamp_gather_pulled`` over half-precision rows: the same stamps of
    each row found (``rows[i] >= 0``), and ``out[i]`` = ``values[rows[i]]`` widened to float32
    (values (R, dim) uint16 bfloat16 bits or float16); the other rows of out are left as they
    are. Returns how many rows were stamped."""
    half_format("values", values)
    no_values = np.empty((values.shape[0], 0), np.float32)
    n = stamp_gather_pulled(
        rows, counts, step, version, freq_max, freq, last_step, versions, is_dirty,
        is_pinned, no_values, np.empty((rows.shape[0], 0), np.float32),
    )  # fmt: skip
    widen_rows(values, rows, out)
    return n


# -- row-wise quantisation ----------------------------------------------------------------


def _f16_down(bits: np.ndarray) -> np.ndarray:
    """The next float16 toward -inf of (finite) float16 bit patterns."""
    bits = bits.astype(np.int64)
    neg = (bits & 0x8000) != 0
    zero = (bits & 0x7FFF) == 0
    return np.where(zero, 0x8001, np.where(neg, bits + 1, bits - 1)).astype(np.uint16)


def check_quantize_args(n: int, dim: int, bits: int, out_shape: tuple[int, ...]) -> None:
    """InvalidArgumentError unless bits is 8 or 4 and out (out_shape) holds n rows of dim
    columns quantised to bits (every implementation's quantize_rows checks this first)."""
    check_bits(bits)
    need = quantized_row_bytes(dim, bits)
    if out_shape[0] != n or out_shape[1] < need:
        raise InvalidArgumentError(
            f"out: expected ({n}, >= {need}) uint8 for dim {dim} at {bits} bits, got {out_shape}"
        )


def unquantizable_row_error(row: int) -> InvalidArgumentError:
    """The error for the first row holding a value that is not finite or beyond float16's."""
    return InvalidArgumentError(
        f"values: row {row} has a value that is not finite or beyond float16's +-{FLOAT16_MAX}"
    )


def quantize_rows(values: np.ndarray, bits: int, out: np.ndarray) -> None:
    """Quantise float32 rows (n, dim) into out (n, stride) uint8 in the module's layout.

    Raises
    ------
    InvalidArgumentError
        For bits not 8 or 4, a stride below ``quantized_row_bytes(dim, bits)``, or a row with
        a value that is not finite or exceeds float16's range (the first such row is named);
        out is then unchanged.
    """
    n, dim = values.shape
    check_quantize_args(n, dim, bits, out.shape)
    bad = ~(np.isfinite(values) & (np.abs(values) <= FLOAT16_MAX)).all(axis=1)
    if bad.any():
        raise unquantizable_row_error(int(np.flatnonzero(bad)[0]))
    levels = (1 << bits) - 1
    x = values.astype(np.float64)
    lo = (x.min(axis=1) if dim else np.zeros(n)) + 0.0  # + 0.0: -0.0 is stored as +0.0
    hi = x.max(axis=1) if dim else np.zeros(n)
    bias16 = float16_bits(lo.astype(np.float32), None)
    bias16 = np.where(widen(bias16.view(np.float16)) > lo, _f16_down(bias16), bias16)
    bias = widen(bias16.view(np.float16)).astype(np.float64)
    t = (hi - bias) / levels  # >= 0; at most 2 * 65504 / 15, within float16
    scale16 = float16_bits(t.astype(np.float32), None)
    scale16 = np.where(widen(scale16.view(np.float16)) < t, scale16 + np.uint16(1), scale16)
    scale16 = np.where(t == 0, np.uint16(0x3C00), scale16).astype(np.uint16)  # 1.0: codes all 0
    scale = widen(scale16.view(np.float16)).astype(np.float64)
    codes = np.clip(np.rint((x - bias[:, None]) / scale[:, None]), 0, levels).astype(np.uint8)
    out[:] = 0
    out[:, 0:2] = scale16.view(np.uint8).reshape(n, 2)
    out[:, 2:4] = bias16.view(np.uint8).reshape(n, 2)
    if bits == 8:
        out[:, 4 : 4 + dim] = codes
    else:
        padded = np.zeros((n, dim + dim % 2), np.uint8)
        padded[:, :dim] = codes
        out[:, 4 : 4 + (dim + 1) // 2] = padded[:, 0::2] | (padded[:, 1::2] << 4)


def dequantized(q: np.ndarray, bits: int, dim: int) -> np.ndarray:
    """float32 (n, dim) values of quantised rows q (n, stride) uint8."""
    n = q.shape[0]
    scale = widen(q[:, 0:2].copy().view(np.float16).reshape(n)).astype(np.float64)
    bias = widen(q[:, 2:4].copy().view(np.float16).reshape(n)).astype(np.float64)
    if bits == 8:
        codes = q[:, 4 : 4 + dim]
    else:
        packed = q[:, 4 : 4 + (dim + 1) // 2]
        codes = np.empty((n, dim + dim % 2), np.uint8)
        codes[:, 0::2] = packed & 0x0F
        codes[:, 1::2] = packed >> 4
        codes = codes[:, :dim]
    return (codes * scale[:, None] + bias[:, None]).astype(np.float32)  # exact, then rounded


def dequantize_rows(q: np.ndarray, bits: int, rows: np.ndarray, out: np.ndarray) -> None:
    """Gather quantised rows as float32: ``out[i] = dequantised q[rows[i]]`` (dim =
    out.shape[1]) where ``rows[i] >= 0``, untouched elsewhere."""
    check_bits(bits)
    live = rows >= 0
    out[live] = dequantized(q[rows[live]], bits, out.shape[1])


def probe_gather_dequantized(
    slots: np.ndarray,
    q: np.ndarray,
    bits: int,
    last_step: np.ndarray,
    keys: np.ndarray,
    min_live_step: int,
    out: np.ndarray,
    out_rows: np.ndarray,
) -> int:
    """``probe_gather`` over quantised rows: out (n, dim) float32 gets the dequantised live
    row of each key (untouched for the others), out_rows its row or -1; returns the number of
    keys without a live row."""
    check_bits(bits)
    missing = _probe(slots, q.shape[0], last_step, keys, min_live_step, out_rows)
    dequantize_rows(q, bits, out_rows, out)
    return missing


def _probe(slots, n_rows, last_step, keys, min_live_step, out_rows) -> int:  # type: ignore[no-untyped-def]
    stub = np.empty((n_rows, 0), np.float32)  # probe_gather's probe and TTL rule, no gather
    none = np.empty((keys.shape[0], 0), np.float32)
    return probe_gather(slots, stub, last_step, keys, min_live_step, none, out_rows)


def probe_gather_widened(
    slots: np.ndarray,
    values: np.ndarray,
    last_step: np.ndarray,
    keys: np.ndarray,
    min_live_step: int,
    out: np.ndarray,
    out_rows: np.ndarray,
) -> int:
    """``probe_gather`` over half-precision rows (values (R, dim) uint16 bfloat16 bits or
    float16): out (n, dim) float32 gets the widened live row of each key."""
    half_format("values", values)
    missing = _probe(slots, values.shape[0], last_step, keys, min_live_step, out_rows)
    widen_rows(values, out_rows, out)
    return missing


def probe_gather_combine_widened(
    slots: np.ndarray,
    values: np.ndarray,
    last_step: np.ndarray,
    keys: np.ndarray,
    bounds: np.ndarray,
    weights: np.ndarray,
    min_live_step: int,
    combiner: int,
    max_norm: float,
    init_kind: int,
    init_seed: int,
    init_a: float,
    init_b: float,
    out: np.ndarray,
) -> int:
    """``probe_gather_combine`` over half-precision rows, each widened as it is read."""
    n, dim = keys.shape[0], out.shape[1]
    x = np.empty((n, dim), np.float32)
    rows = np.empty(n, np.int64)
    missing = probe_gather_widened(slots, values, last_step, keys, min_live_step, x, rows)
    _combine_with_defaults(x, rows, keys, bounds, weights, combiner, max_norm, out,
                           (init_kind, init_seed, init_a, init_b))  # fmt: skip
    return missing


def _combine_with_defaults(x, rows, keys, bounds, weights, combiner, max_norm, out, init) -> None:  # type: ignore[no-untyped-def]
    absent = rows < 0
    x[absent] = default_rows(keys[absent], x.shape[1], *init)
    n = keys.shape[0]
    gather_combine(x, np.arange(n, dtype=np.int64), bounds, weights, combiner, max_norm, out)


def probe_gather_combine_dequantized(
    slots: np.ndarray,
    q: np.ndarray,
    bits: int,
    last_step: np.ndarray,
    keys: np.ndarray,
    bounds: np.ndarray,
    weights: np.ndarray,
    min_live_step: int,
    combiner: int,
    max_norm: float,
    init_kind: int,
    init_seed: int,
    init_a: float,
    init_b: float,
    out: np.ndarray,
) -> int:
    """``probe_gather_combine`` over quantised rows (dim = out.shape[1]): each position's
    vector is its live row dequantised, or its key's default value. (This reference builds
    the (n, dim) matrix; kernels must not.)"""
    n, dim = keys.shape[0], out.shape[1]
    x = np.empty((n, dim), np.float32)
    rows = np.empty(n, np.int64)
    missing = probe_gather_dequantized(slots, q, bits, last_step, keys, min_live_step, x, rows)
    _combine_with_defaults(x, rows, keys, bounds, weights, combiner, max_norm, out,
                           (init_kind, init_seed, init_a, init_b))  # fmt: skip
    return missing
