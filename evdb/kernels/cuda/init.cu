// init.cu: fill_uniform and fill_normal (evdb/kernels/reference/init.py).
//
// Memory layout: keys (n,) int64; out (n, dim) float32, C order. One thread per element
// (i, c) = (t / dim, t % dim): consecutive threads write consecutive floats (coalesced), and
// no element depends on another, so there are no atomics and no races; a key's row is the
// same whatever the batch, which is what lets lookup and pull agree on an unseen key.
// fill_normal recomputes a Box-Muller pair for each of its two columns: two log/cos instead
// of one, which the arithmetic units absorb (the kernel is bound by the write of `out`).
#include "init.cuh"

extern "C" __global__ void fill_uniform(const i64* __restrict__ keys, i64 n, i64 dim, u64 seed,
                                        double low, double high, float* __restrict__ out) {
    i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n * dim) return;
    i64 i = t / dim, c = t - i * dim;
    double u = evdb_uniform01(evdb_salt(seed, 0), (u64)keys[i], c);
    // low + (high - low) * u, rounded step by step as numpy does (no FMA)
    out[t] = (float)__dadd_rn(low, __dmul_rn(__dadd_rn(high, -low), u));
}

extern "C" __global__ void fill_normal(const i64* __restrict__ keys, i64 n, i64 dim, u64 seed,
                                       double mean, double std, int truncate,
                                       float* __restrict__ out) {
    i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n * dim) return;
    i64 i = t / dim, c = t - i * dim;
    double z = evdb_normal_z(seed, (u64)keys[i], c, truncate != 0);
    out[t] = (float)__dadd_rn(mean, __dmul_rn(std, z));
}
