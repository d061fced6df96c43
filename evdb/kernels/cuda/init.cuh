// init.cuh: the counter-based initializer (evdb/kernels/reference/init.py), one element at a
// time, shared by init.cu (fill_*) and bags.cu (default values of missing keys).
//
// The integer part is the reference's splitmix64 counter generator bit for bit. The floating
// part uses explicit round-to-nearest intrinsics (__dadd_rn, __dmul_rn) wherever the
// reference has a separate add and multiply: nvcc and NVRTC contract a * b + c into one FMA by
// default, which rounds once instead of twice and would break fill_uniform's bit-exactness
// against numpy. log, cos and sin come from CUDA's libdevice (within 1-2 ulp of glibc in
// float64), so normal draws match the reference to float32 rounding, not always bit for bit.
#ifndef EVDB_INIT_CUH
#define EVDB_INIT_CUH
#include "common.cuh"

#define EVDB_GAMMA 0x9E3779B97F4A7C15ULL
#define EVDB_TWO_PI 6.283185307179586  // 2.0 * np.pi, exactly as the reference computes it
#define EVDB_TRUNCATE_AT 2.0
#define EVDB_MAX_REDRAWS 64

__device__ __forceinline__ u64 evdb_salt(u64 seed, i64 stream) {
    return evdb_mix64(seed + (u64)stream * EVDB_GAMMA);
}

// uniform01 of the reference: 53 bits of mix64(mix64(key ^ salt) + (col + 1) * G), in (0, 1).
__device__ __forceinline__ double evdb_uniform01(u64 salt, u64 key_bits, i64 col) {
    u64 bits = evdb_mix64(evdb_mix64(key_bits ^ salt) + (u64)(col + 1) * EVDB_GAMMA);
    return __dmul_rn(__dadd_rn((double)(bits >> 11), 0.5), 1.0 / 9007199254740992.0);
}

// Column col of standard_normal(seed, key, dim, attempt): Box-Muller over the uniform pair at
// column col / 2 of streams 2 attempt and 2 attempt + 1; even columns take cos, odd sin.
__device__ __forceinline__ double evdb_normal(u64 seed, u64 key_bits, i64 col, i64 attempt) {
    double u1 = evdb_uniform01(evdb_salt(seed, 2 * attempt), key_bits, col / 2);
    double u2 = evdb_uniform01(evdb_salt(seed, 2 * attempt + 1), key_bits, col / 2);
    double r = sqrt(__dmul_rn(-2.0, log(u1)));
    double t = __dmul_rn(EVDB_TWO_PI, u2);
    return __dmul_rn(r, (col & 1) ? sin(t) : cos(t));
}

// fill_normal's z of one element: with truncate, the first of its own redraws within 2 std
// (attempts 1, 2, ...), then clipped, so it never depends on other elements of the batch.
__device__ __forceinline__ double evdb_normal_z(u64 seed, u64 key_bits, i64 col, bool truncate) {
    double z = evdb_normal(seed, key_bits, col, 0);
    if (truncate) {
        for (i64 a = 1; fabs(z) > EVDB_TRUNCATE_AT && a < EVDB_MAX_REDRAWS; ++a)
            z = evdb_normal(seed, key_bits, col, a);
        z = fmin(fmax(z, -EVDB_TRUNCATE_AT), EVDB_TRUNCATE_AT);
    }
    return z;
}

// Column col of a key's default value, as reference.bags.default_rows writes it: kind 0 =
// constant a, 1 = uniform [a, b), 2 = normal(a, b), 3 = normal(a, b) truncated at 2 std.
__device__ __forceinline__ float evdb_default_element(int kind, u64 seed, double a, double b,
                                                      u64 key_bits, i64 col) {
    if (kind == 0) return (float)a;
    if (kind == 1) {
        double u = evdb_uniform01(evdb_salt(seed, 0), key_bits, col);
        return (float)__dadd_rn(a, __dmul_rn(__dadd_rn(b, -a), u));
    }
    double z = evdb_normal_z(seed, key_bits, col, kind == 3);
    return (float)__dadd_rn(a, __dmul_rn(b, z));
}

#endif  // EVDB_INIT_CUH
