// lowp.cu: half-precision rows and quantised rows (evdb/kernels/reference/lowp.py and
// lowp_optim.py): rounding to bfloat16 / float16 (nearest even or stochastic), widening,
// row-wise int8 / int4 quantisation, the dequantising serving gathers and the fused update of
// half-precision rows.
//
// Memory layout: half-precision slabs (R, dim) of unsigned short bit patterns (bfloat16 or
// float16: fmt 0 or 1; gpu/lowp.py views a float16 array as uint16); float32 rows (n, dim),
// passed a second time as unsigned bits where a kernel needs NaN payloads; quantised rows
// (R, stride) bytes: float16 scale, float16 bias, then dim int8 codes or ceil(dim / 2) bytes of
// int4 codes, low nibble first (reference.lowp); rows, keys (n,) int64 (the update's row_keys
// (R,) int64, a key for each stored row); hash index as in
// common.cuh.
//
// Bit reinterpretation without intrinsics: float32 bits come in as a second view of the same
// array and widened rows go out as unsigned bits, so no __float_as_uint is needed; rounding
// works on the value in float64 (a float32 has 24 significant bits, so a * 2^k, its floor and
// the fraction are exact) and the results match the reference's integer formulation bit for
// bit: with r the element's 16 random bits, bfloat16 rounds up when r + frac * 2^16 >= 2^16
// (the reference adds r to the float32 bits), float16 when r * 2^-16 < frac. FMA contraction
// cannot change these: every product and sum above is exact.
//
// Threads and races: round_rows, widen_rows and dequantize_rows one thread per element;
// quantize_rows one thread per row; the probes one thread per key (gather) or per bag
// (combine, which accumulates in float32 as cpu/lowp_gather.py does), over quantised or
// half-precision rows; segment_sum_apply_lowp (float32 slots) and
// segment_sum_apply_lowp_half_slots (slots in the values' format) one thread per distinct row
// with its float64 gradient and row in dynamic shared memory (2 * dim doubles a thread, either
// way: half slots are rounded in place, no scratch; gpu/lowp.py sizes the block), reading its row's key from the tier's whole
// key column (row_keys[rows[t]], as it reads the row). Rows are distinct within a call (rows of
// round_rows and of the update are a batch's distinct rows), so no two threads write one
// element: no atomics, except the one count of missing keys per thread.
#include "init.cuh"

#define EVDB_ROUND_SALT 0x53526F756E640001ULL
#define EVDB_F16_INF 0x7C00u
#define EVDB_BF16_INF 0x7F80u

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned char u8;

__device__ __forceinline__ u64 evdb_step_salt(u64 seed, i64 step) {
    return evdb_mix64((seed ^ EVDB_ROUND_SALT) + (u64)step * EVDB_GAMMA);
}

__device__ __forceinline__ u64 evdb_row_base(u64 salt, i64 key) {
    return evdb_mix64((u64)key ^ salt);
}

// The 16 random bits of column c: bits 16 (c % 4) .. of the mix64 of its group of four
// columns (reference.lowp.rounding_bits).
__device__ __forceinline__ u64 evdb_column_bits(u64 base, i64 c) {
    return (evdb_mix64(base + (u64)((c >> 2) + 1) * EVDB_GAMMA) >> (16 * (c & 3))) & 0xFFFFULL;
}

// Bits of the magnitude a (finite, >= 0, a float32's value) in a format of m mantissa bits
// whose smallest normal exponent is min_e; the caller handles overflow past the format.
__device__ __forceinline__ u32 evdb_narrow_magnitude(double a, int m, int min_e, u64 r,
                                                      bool stochastic, int fmt) {
    int e = min_e;
    if (a >= ldexp(1.0, min_e)) {
        frexp(a, &e);
        e -= 1;  // a = f 2^e with f in [0.5, 1): a's binade is 2^(e - 1)
    }
    double q = a * ldexp(1.0, m - e);  // a in ulps of its binade: exact
    double k = floor(q), frac = q - k;
    bool up;
    if (!stochastic) {
        up = frac > 0.5 || (frac == 0.5 && fmod(k, 2.0) == 1.0);
    } else if (fmt == 0) {
        up = (double)r + frac * 65536.0 >= 65536.0;
    } else {
        up = (double)r * (1.0 / 65536.0) < frac;
    }
    // k spans 2^m .. 2^(m + 1) in a normal binade: its carry into the exponent field is right
    return ((u32)(e - min_e) << m) + (u32)k + (up ? 1u : 0u);
}

// Half-precision bits of float32 x (bits xb), as reference.lowp.narrow.
__device__ __forceinline__ u16 evdb_narrow(float x, u32 xb, u64 r, bool stochastic, int fmt) {
    u32 sign = (xb >> 16) & 0x8000u;
    bool nan = (xb & 0x7FFFFFFFu) > 0x7F800000u;
    double a = fabs((double)x);
    if (fmt == 0) {
        if (nan) return (u16)((xb >> 16) | 0x40u);
        if ((xb & 0x7FFFFFFFu) == 0x7F800000u) return (u16)(sign | EVDB_BF16_INF);
        return (u16)(sign | evdb_narrow_magnitude(a, 7, -126, r, stochastic, 0));
    }
    if (nan) {
        u32 m = EVDB_F16_INF + ((xb & 0x7FFFFFu) >> 13);
        return (u16)(sign | (m == EVDB_F16_INF ? m + 1u : m));
    }
    if (a >= 65536.0) return (u16)(sign | EVDB_F16_INF);
    return (u16)(sign | evdb_narrow_magnitude(a, 10, -14, r, stochastic, 1));
}

// float32 bits of half-precision bits h, exactly (numpy's float16 conversion for fmt 1).
__device__ __forceinline__ u32 evdb_widen_bits(u16 h, int fmt) {
    if (fmt == 0) return (u32)h << 16;
    u32 sign = (u32)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 31) return sign | 0x7F800000u | (m << 13);
    if (e == 0) {
        if (m == 0) return sign;
        u32 e32 = 113;  // normalise the subnormal: 2^-14 is float32 exponent 113
        while ((m & 0x400u) == 0) {
            m <<= 1;
            e32 -= 1;
        }
        return sign | (e32 << 23) | ((m & 0x3FFu) << 13);
    }
    return sign | ((e + 112u) << 23) | (m << 13);
}

// Value of half-precision bits h (finite), in float64.
__device__ __forceinline__ double evdb_half_value(u16 h, int fmt) {
    int mb = fmt == 0 ? 7 : 10, eb = fmt == 0 ? 255 : 31, bias = fmt == 0 ? 127 : 15;
    int e = (h >> mb) & eb;
    double m = (double)(h & ((1u << mb) - 1u));
    double v = e == 0 ? ldexp(m, 1 - bias - mb) : ldexp(m + ldexp(1.0, mb), e - bias - mb);
    if (e == eb) v = __longlong_as_double(m == 0.0 ? 0x7FF0000000000000LL : 0x7FF8000000000000LL);
    return (h & 0x8000u) ? -v : v;
}

// float16 bits of a finite v (rounded to float32 first), to nearest even; +0.0 for -0.0.
__device__ __forceinline__ u16 evdb_float16_nearest(double v) {
    double a = fabs((double)(float)v);
    if (a >= 65536.0) return (u16)((v < 0 ? 0x8000u : 0u) | EVDB_F16_INF);
    return (u16)((v < 0 ? 0x8000u : 0u) | evdb_narrow_magnitude(a, 10, -14, 0ULL, false, 1));
}

extern "C" __global__ void round_rows(const float* __restrict__ values,
                                      const u32* __restrict__ vbits, i64 n, i64 dim,
                                      const i64* __restrict__ rows, const i64* __restrict__ keys,
                                      u64 seed, i64 step, int stochastic, int fmt,
                                      u16* __restrict__ out) {
    i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n * dim) return;
    i64 i = t / dim, j = t % dim, r = rows[i];
    if (r < 0) return;
    u64 bits = 0ULL;
    if (stochastic) bits = evdb_column_bits(evdb_row_base(evdb_step_salt(seed, step), keys[i]), j);
    out[r * dim + j] = evdb_narrow(values[t], vbits[t], bits, stochastic != 0, fmt);
}

extern "C" __global__ void widen_rows(const u16* __restrict__ src, i64 dim,
                                      const i64* __restrict__ rows, i64 n, int fmt,
                                      u32* __restrict__ out) {
    i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n * dim) return;
    i64 r = rows[t / dim];
    if (r >= 0) out[t] = evdb_widen_bits(src[r * dim + t % dim], fmt);
}

// ---- quantised rows ---------------------------------------------------------------------

__device__ __forceinline__ double evdb_f16_at(const u8* row, int at) {
    return evdb_half_value((u16)(row[at] | (row[at + 1] << 8)), 1);
}

extern "C" __global__ void quantize_rows(const float* __restrict__ values, i64 n, i64 dim,
                                         int bits, u8* __restrict__ out, i64 stride) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float* x = values + i * dim;
    u8* o = out + i * stride;
    int levels = (1 << bits) - 1;
    double lo = dim ? (double)x[0] : 0.0, hi = lo;
    for (i64 j = 1; j < dim; ++j) {
        lo = fmin(lo, (double)x[j]);
        hi = fmax(hi, (double)x[j]);
    }
    // bias: lo rounded down to float16; scale: (hi - bias) / levels rounded up
    u16 b16 = evdb_float16_nearest(lo);
    if (evdb_half_value(b16, 1) > lo) {
        if ((b16 & 0x7FFFu) == 0) b16 = 0x8001u;
        else b16 = (b16 & 0x8000u) ? b16 + 1 : b16 - 1;
    }
    double bias = evdb_half_value(b16, 1);
    double t = (hi - bias) / (double)levels;
    u16 s16 = 0x3C00u;  // 1.0 for a row of one value: its codes are all 0
    if (t > 0.0) {
        s16 = evdb_float16_nearest(t);
        if (evdb_half_value(s16, 1) < t) s16 += 1;
    }
    double scale = evdb_half_value(s16, 1);
    for (i64 j = 0; j < stride; ++j) o[j] = 0;
    o[0] = (u8)(s16 & 0xFFu);
    o[1] = (u8)(s16 >> 8);
    o[2] = (u8)(b16 & 0xFFu);
    o[3] = (u8)(b16 >> 8);
    for (i64 j = 0; j < dim; ++j) {
        double y = ((double)x[j] - bias) / scale;
        double f = floor(y), d = y - f;
        double code = (d > 0.5 || (d == 0.5 && fmod(f, 2.0) == 1.0)) ? f + 1.0 : f;  // rint
        code = fmin(fmax(code, 0.0), (double)levels);
        if (bits == 8) o[4 + j] = (u8)code;
        else o[4 + j / 2] |= (u8)((int)code << (4 * (j & 1)));
    }
}

// Column j of quantised row `row`: code * scale + bias, exact in float64, then float32.
__device__ __forceinline__ float evdb_dequantized(const u8* row, int bits, i64 j) {
    int code = bits == 8 ? row[4 + j] : (row[4 + j / 2] >> (4 * (j & 1))) & 0x0F;
    return (float)((double)code * evdb_f16_at(row, 0) + evdb_f16_at(row, 2));
}

extern "C" __global__ void dequantize_rows(const u8* __restrict__ q, i64 stride, int bits,
                                           const i64* __restrict__ rows, i64 n, i64 dim,
                                           float* __restrict__ out) {
    i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n * dim) return;
    i64 r = rows[t / dim];
    if (r >= 0) out[t] = evdb_dequantized(q + r * stride, bits, t % dim);
}

// Live row of key or -1 (reference.index.probe_gather's rule).
__device__ __forceinline__ i64 evdb_live_row(const i64* slots, i64 cap, const i64* last_step,
                                             i64 key, i64 min_live_step) {
    i64 r = evdb_find(slots, cap - 1, key);
    if (r >= 0 && min_live_step != EVDB_I64_MIN && last_step[r] < min_live_step) r = -1;
    return r;
}

// Rows a lookup reads: quantised (fmt = bits, 8 or 4: q, stride) or half precision (fmt 0
// bfloat16, 1 float16: half, dim columns).
struct EvdbLowpRows {
    const u8* q;
    i64 stride;
    const u16* half;
    int fmt;
    i64 dim;
};

__device__ __forceinline__ float evdb_lowp_x(const EvdbLowpRows& s, i64 r, i64 j) {
    if (s.fmt >= 4) return evdb_dequantized(s.q + r * s.stride, s.fmt, j);
    return (float)evdb_half_value(s.half[r * s.dim + j], s.fmt);
}

extern "C" __global__ void probe_gather_dequantized(
    const i64* __restrict__ slots, i64 cap, const u8* __restrict__ q, i64 stride, int bits,
    const i64* __restrict__ last_step, const i64* __restrict__ keys, i64 n, i64 dim,
    i64 min_live_step, float* __restrict__ out, i64* __restrict__ out_rows,
    u64* __restrict__ missing) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    i64 r = evdb_live_row(slots, cap, last_step, keys[i], min_live_step);
    out_rows[i] = r;
    if (r < 0) {
        atomicAdd(missing, 1ULL);
        return;
    }
    for (i64 j = 0; j < dim; ++j) out[i * dim + j] = evdb_dequantized(q + r * stride, bits, j);
}

// Widened rows go out as float32 bits (out_bits), so NaN payloads survive as in numpy.
extern "C" __global__ void probe_gather_widened(
    const i64* __restrict__ slots, i64 cap, const u16* __restrict__ half, int fmt,
    const i64* __restrict__ last_step, const i64* __restrict__ keys, i64 n, i64 dim,
    i64 min_live_step, u32* __restrict__ out_bits, i64* __restrict__ out_rows,
    u64* __restrict__ missing) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    i64 r = evdb_live_row(slots, cap, last_step, keys[i], min_live_step);
    out_rows[i] = r;
    if (r < 0) {
        atomicAdd(missing, 1ULL);
        return;
    }
    for (i64 j = 0; j < dim; ++j) out_bits[i * dim + j] = evdb_widen_bits(half[r * dim + j], fmt);
}

// Column j of the vector at position p: its live row r converted, or its key's default.
__device__ __forceinline__ float evdb_position_x(const EvdbLowpRows& s, i64 r, i64 key, i64 j,
                                                 int init_kind, u64 init_seed, double init_a,
                                                 double init_b) {
    if (r >= 0) return evdb_lowp_x(s, r, j);
    return evdb_default_element(init_kind, init_seed, init_a, init_b, (u64)key, j);
}

// Bag b of a fused probe + convert + combine; returns its positions without a live row.
__device__ __forceinline__ u64 evdb_lowp_combine_bag(
    const EvdbLowpRows& s, const i64* slots, i64 cap, const i64* last_step, const i64* keys,
    const i64* bounds, const float* weights, i64 b, i64 min_live_step, int combiner,
    double max_norm, int init_kind, u64 init_seed, double init_a, double init_b, float* out) {
    i64 lo = bounds[b], hi = bounds[b + 1], dim = s.dim;
    double div = 1.0;
    if (combiner != 0) {
        div = 0.0;
        for (i64 p = lo; p < hi; ++p)
            div += combiner == 1 ? (double)weights[p] : (double)weights[p] * weights[p];
        if (combiner == 2) div = sqrt(div);
    }
    float* o = out + b * dim;
    for (i64 j = 0; j < dim; ++j) o[j] = 0.0f;
    u64 mine = 0;
    for (i64 p = lo; p < hi; ++p) {
        i64 r = evdb_live_row(slots, cap, last_step, keys[p], min_live_step);
        if (r < 0) ++mine;
        if (div == 0.0) continue;  // zeros, as TF's div_no_nan; misses are still counted
        double clip = 1.0;
        if (!evdb_is_inf(max_norm)) {
            double sq = 0.0;
            for (i64 j = 0; j < dim; ++j) {
                double x = evdb_position_x(s, r, keys[p], j, init_kind, init_seed, init_a, init_b);
                sq += x * x;
            }
            double norm = sqrt(sq);
            if (norm > max_norm) clip = max_norm / (norm + EVDB_NORM_EPS);
        }
        float scale = (float)(clip * (double)weights[p] / div);
        for (i64 j = 0; j < dim; ++j)
            o[j] += scale * evdb_position_x(s, r, keys[p], j, init_kind, init_seed, init_a, init_b);
    }
    return mine;
}

extern "C" __global__ void probe_gather_combine_dequantized(
    const i64* __restrict__ slots, i64 cap, const u8* __restrict__ q, i64 stride, int bits,
    const i64* __restrict__ last_step, const i64* __restrict__ keys,
    const i64* __restrict__ bounds, const float* __restrict__ weights, i64 n_bags, i64 dim,
    i64 min_live_step, int combiner, double max_norm, int init_kind, u64 init_seed,
    double init_a, double init_b, float* __restrict__ out, u64* __restrict__ missing) {
    i64 b = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= n_bags) return;
    EvdbLowpRows s = {q, stride, 0, bits, dim};
    u64 mine = evdb_lowp_combine_bag(s, slots, cap, last_step, keys, bounds, weights, b,
                                     min_live_step, combiner, max_norm, init_kind, init_seed,
                                     init_a, init_b, out);
    if (mine) atomicAdd(missing, mine);
}

extern "C" __global__ void probe_gather_combine_widened(
    const i64* __restrict__ slots, i64 cap, const u16* __restrict__ half, int fmt,
    const i64* __restrict__ last_step, const i64* __restrict__ keys,
    const i64* __restrict__ bounds, const float* __restrict__ weights, i64 n_bags, i64 dim,
    i64 min_live_step, int combiner, double max_norm, int init_kind, u64 init_seed,
    double init_a, double init_b, float* __restrict__ out, u64* __restrict__ missing) {
    i64 b = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= n_bags) return;
    EvdbLowpRows s = {0, 0, half, fmt, dim};
    u64 mine = evdb_lowp_combine_bag(s, slots, cap, last_step, keys, bounds, weights, b,
                                     min_live_step, combiner, max_norm, init_kind, init_seed,
                                     init_a, init_b, out);
    if (mine) atomicAdd(missing, mine);
}

// ---- the fused update of half-precision rows --------------------------------------------

// Stored bits of column c of a row's record whose update gave v: v rounded to float32, then to
// the half format with column c's random bits of the row (base), or to nearest.
__device__ __forceinline__ u16 evdb_rounded(double v, u64 base, i64 c, int stochastic, int fmt) {
    float x = (float)v;
    // x is no NaN here unless the update made one: its bits matter only for NaN payloads
    double a = fabs((double)x);
    u32 sign = (x < 0.0f || (x == 0.0f && 1.0f / x < 0.0f)) ? 0x80000000u : 0u;
    u32 xb = x != x ? 0x7FC00000u : (a > 3.4028234663852886e38 ? sign | 0x7F800000u : sign);
    u64 bits = stochastic ? evdb_column_bits(base, c) : 0ULL;
    return evdb_narrow(x, xb, bits, stochastic != 0, fmt);
}

// A row's optimizer slots as the update reads and writes them. float32: the rule's float64
// result rounded to float32. Half precision (the values' format, a table's slot_dtype): read
// widened, written rounded as columns dim.. of the row's record, so a slot draws its own
// random bits, never its row's (reference.lowp_optim). The rules read each slot before they
// write it and never read it again, so a slot is rounded in place as soon as it is written.
struct EvdbFloatSlots {
    float* s;
    __device__ __forceinline__ double get(i64 j) const { return (double)s[j]; }
    __device__ __forceinline__ void set(i64 j, double x) const { s[j] = (float)x; }
};

struct EvdbHalfSlots {
    u16* s;
    u64 base;
    i64 dim;
    int stochastic;
    int fmt;
    __device__ __forceinline__ double get(i64 j) const { return evdb_half_value(s[j], fmt); }
    __device__ __forceinline__ void set(i64 j, double x) const {
        s[j] = evdb_rounded(x, base, dim + j, stochastic, fmt);
    }
};

// Thread t's row: its gradient summed over its positions into g, the rule applied in float64
// to w (the row widened) and its slots, the row rounded back (base: its random bits).
template <typename Slots>
__device__ __forceinline__ void evdb_update_lowp_row(
    const float* grads, i64 dim, const i64* positions, const i64* bounds, i64 t, int kind,
    double h0, double h1, double h2, double h3, u64 base, int stochastic, int fmt, u16* v,
    const Slots& s, double* g) {
    double* w = g + dim;
    for (i64 c = 0; c < dim; ++c) {
        double acc = 0.0;
        for (i64 k = bounds[t]; k < bounds[t + 1]; ++k) acc += grads[positions[k] * dim + c];
        g[c] = acc;
        w[c] = evdb_half_value(v[c], fmt);
    }
    double lr = h0, lasso = 0.0;
    if (kind == 0) {  // SGD
        double wd = h1;
        lasso = h2;
        for (i64 c = 0; c < dim; ++c) w[c] = w[c] - lr * (g[c] + wd * w[c]);
    } else if (kind == 1) {  // Adagrad
        double eps = h1, wd = h2;
        lasso = h3;
        for (i64 c = 0; c < dim; ++c) {
            double gc = g[c] + wd * w[c];
            double acc = s.get(c) + gc * gc;
            s.set(c, acc);
            w[c] = w[c] - lr * gc / (sqrt(acc) + eps);
        }
    } else if (kind == 2) {  // lazy Adam; h0 is the bias-corrected step size
        double b1 = h1, b2 = h2, eps = h3;
        for (i64 c = 0; c < dim; ++c) {
            double m = b1 * s.get(c) + (1.0 - b1) * g[c];
            double vv = b2 * s.get(dim + c) + (1.0 - b2) * g[c] * g[c];
            s.set(c, m);
            s.set(dim + c, vv);
            w[c] = w[c] - lr * m / (sqrt(vv) + eps);
        }
    } else {  // row-wise Adagrad
        double eps = h1, sq = 0.0;
        for (i64 c = 0; c < dim; ++c) sq += g[c] * g[c];
        double acc = s.get(0) + sq / (double)dim;
        s.set(0, acc);
        for (i64 c = 0; c < dim; ++c) w[c] = w[c] - lr * g[c] / (sqrt(acc) + eps);
    }
    if (lasso != 0.0) {
        double sq = 0.0;
        for (i64 c = 0; c < dim; ++c) sq += w[c] * w[c];
        double norm = sqrt(sq);
        double shrink = norm > 0.0 ? fmax(0.0, 1.0 - lr * lasso / norm) : 0.0;
        for (i64 c = 0; c < dim; ++c) w[c] *= shrink;
    }
    for (i64 c = 0; c < dim; ++c) v[c] = evdb_rounded(w[c], base, c, stochastic, fmt);
}

// float32 slots (n_slots a row)
extern "C" __global__ void segment_sum_apply_lowp(
    const float* __restrict__ grads, i64 dim, const i64* __restrict__ positions,
    const i64* __restrict__ bounds, const i64* __restrict__ rows,
    const i64* __restrict__ row_keys, i64 u, int kind, double h0, double h1, double h2,
    double h3, u64 seed, i64 step, int stochastic, int fmt, u16* __restrict__ values,
    float* __restrict__ slots, i64 n_slots) {
    extern __shared__ double evdb_shared[];
    i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= u || rows[t] < 0) return;
    i64 r = rows[t];
    u64 base = evdb_row_base(evdb_step_salt(seed, step), row_keys[r]);
    EvdbFloatSlots s = {slots + r * n_slots};
    evdb_update_lowp_row(grads, dim, positions, bounds, t, kind, h0, h1, h2, h3, base,
                         stochastic, fmt, values + r * dim, s,
                         evdb_shared + (i64)threadIdx.x * 2 * dim);
}

// Slots in the values' half format (fmt), n_slots a row: the same update, the slots rounded
// with the row as one record (columns dim .. dim + n_slots - 1)
extern "C" __global__ void segment_sum_apply_lowp_half_slots(
    const float* __restrict__ grads, i64 dim, const i64* __restrict__ positions,
    const i64* __restrict__ bounds, const i64* __restrict__ rows,
    const i64* __restrict__ row_keys, i64 u, int kind, double h0, double h1, double h2,
    double h3, u64 seed, i64 step, int stochastic, int fmt, u16* __restrict__ values,
    u16* __restrict__ slots, i64 n_slots) {
    extern __shared__ double evdb_shared[];
    i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= u || rows[t] < 0) return;
    i64 r = rows[t];
    u64 base = evdb_row_base(evdb_step_salt(seed, step), row_keys[r]);
    EvdbHalfSlots s = {slots + r * n_slots, base, dim, stochastic, fmt};
    evdb_update_lowp_row(grads, dim, positions, bounds, t, kind, h0, h1, h2, h3, base,
                         stochastic, fmt, values + r * dim, s,
                         evdb_shared + (i64)threadIdx.x * 2 * dim);
}
