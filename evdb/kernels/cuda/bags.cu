// bags.cu: combine the rows of each bag, and its backward (evdb/kernels/reference/bags.py).
//
// Memory layout: values / rows (r, dim) float32 C order; keys or inverse (n,) int64;
// bounds (B + 1,) int64 (bag b = positions bounds[b] : bounds[b + 1]); weights (n,) float32;
// out (B, dim) float32. combiner 0 = sum, 1 = mean, 2 = sqrtn; max_norm = inf disables the
// clip; init_kind/seed/a/b give the default value of a key without a live row.
//
// One group of G lanes per bag (G from the dim, gpu.py's _group_size). The lanes probe G keys
// of the bag at once, then walk them one by one, each lane accumulating its own columns in
// float64 registers, so no (n, dim) matrix is ever written and a bag's output row is written
// once, by its own group: no atomics in the forward kernels. Wide rows are done in passes of
// G * EVDB_COLS_PER_LANE columns (a pass re-probes the bag's keys, which are cached by then).
//
// combine_backward sums into a float64 scratch (u, dim) with atomicAdd (positions of different
// bags share keys): the order of the adds varies from run to run, but in float64 the result
// rounds to the same float32 almost always; then one group per key applies the Jacobian of
// the max_norm clip to the summed gradient (every position of a key saw the same row).
#include "init.cuh"

#define EVDB_COLS_PER_LANE 4

__device__ __forceinline__ double evdb_bag_divisor(const EvdbGroup& g, const float* weights,
                                                   i64 lo, i64 hi, int combiner) {
    if (combiner == 0) return 1.0;
    double d = 0.0;
    for (i64 p = lo + g.lane; p < hi; p += g.size) {
        double w = weights[p];
        d += combiner == 1 ? w : w * w;
    }
    d = evdb_group_sum(g, d);
    return combiner == 1 ? d : sqrt(d);
}

struct EvdbBagSource {
    const i64* slots;  // null: positions read rows[inverse[p]] (gather_combine)
    i64 cap;
    const float* values;
    i64 dim;
    const i64* last_step;
    const i64* keys;  // keys (probe) or inverse (gather)
    i64 min_live_step;
    int init_kind;
    u64 init_seed;
    double init_a, init_b;
};

// Column c of the vector at position p, whose row (or -1) is r.
__device__ __forceinline__ double evdb_bag_x(const EvdbBagSource& s, i64 r, i64 p, i64 c) {
    if (r >= 0) return s.values[r * s.dim + c];
    return evdb_default_element(s.init_kind, s.init_seed, s.init_a, s.init_b, (u64)s.keys[p], c);
}

// Combine bag b into out[b]; returns how many of its positions this lane found without a row.
__device__ __forceinline__ int evdb_combine_bag(const EvdbGroup& g, const EvdbBagSource& s,
                                                i64 b, const i64* bounds, const float* weights,
                                                int combiner, double max_norm, float* out) {
    i64 lo = bounds[b], hi = bounds[b + 1], dim = s.dim;
    double div = evdb_bag_divisor(g, weights, lo, hi, combiner);
    bool clip = !evdb_is_inf(max_norm);
    int missing = 0;
    i64 pass = (i64)g.size * EVDB_COLS_PER_LANE;
    for (i64 c0 = 0; c0 == 0 || c0 < dim; c0 += pass) {
        double acc[EVDB_COLS_PER_LANE];
#pragma unroll
        for (int k = 0; k < EVDB_COLS_PER_LANE; ++k) acc[k] = 0.0;
        for (i64 p0 = lo; p0 < hi; p0 += g.size) {
            i64 p = p0 + g.lane, r = -1;
            if (p < hi) {
                if (s.slots) {
                    r = evdb_find(s.slots, s.cap - 1, s.keys[p]);
                    if (r >= 0 && s.min_live_step != EVDB_I64_MIN &&
                        s.last_step[r] < s.min_live_step)
                        r = -1;
                    if (c0 == 0 && r < 0) ++missing;
                } else {
                    r = s.keys[p];
                }
            }
            if (div == 0.0) continue;  // zeros, as TF's div_no_nan; misses are still counted
            int count = (int)(hi - p0 < g.size ? hi - p0 : g.size);
            for (int q = 0; q < count; ++q) {
                i64 rq = evdb_group_bcast(g, r, q), pq = p0 + q;
                double scale = 1.0;
                if (clip) {  // torch's embedding_renorm_ factor, computed in float64
                    double sq = 0.0;
                    for (i64 c = g.lane; c < dim; c += g.size) {
                        double x = evdb_bag_x(s, rq, pq, c);
                        sq += x * x;
                    }
                    double norm = sqrt(evdb_group_sum(g, sq));
                    if (norm > max_norm) scale = max_norm / (norm + EVDB_NORM_EPS);
                }
                double coef = scale * (double)weights[pq] / div;
#pragma unroll
                for (int k = 0; k < EVDB_COLS_PER_LANE; ++k) {
                    i64 c = c0 + (i64)k * g.size + g.lane;
                    if (c < dim) acc[k] += coef * evdb_bag_x(s, rq, pq, c);
                }
            }
        }
#pragma unroll
        for (int k = 0; k < EVDB_COLS_PER_LANE; ++k) {
            i64 c = c0 + (i64)k * g.size + g.lane;
            if (c < dim) out[b * dim + c] = div != 0.0 ? (float)acc[k] : 0.0f;
        }
    }
    return missing;
}

__device__ __forceinline__ void evdb_count_missing(u64* missing, int mine) {
    // Every thread of the warp gets here (no early return above): one atomic per warp.
    for (int o = 16; o > 0; o >>= 1) mine += __shfl_xor_sync(EVDB_FULL_MASK, mine, o);
    if ((threadIdx.x & 31) == 0 && mine) atomicAdd(missing, (u64)mine);
}

extern "C" __global__ void probe_gather_combine(
    const i64* __restrict__ slots, i64 cap, const float* __restrict__ values, i64 dim,
    const i64* __restrict__ last_step, const i64* __restrict__ keys,
    const i64* __restrict__ bounds, const float* __restrict__ weights, i64 n_bags,
    i64 min_live_step, int combiner, double max_norm, int init_kind, u64 init_seed,
    double init_a, double init_b, float* __restrict__ out, u64* __restrict__ missing,
    int group_size) {
    EvdbGroup g = evdb_group(group_size);
    EvdbBagSource s = {slots, cap, values, dim, last_step, keys, min_live_step,
                       init_kind, init_seed, init_a, init_b};
    int mine = 0;
    if (g.id < n_bags) mine = evdb_combine_bag(g, s, g.id, bounds, weights, combiner, max_norm, out);
    evdb_count_missing(missing, mine);
}

extern "C" __global__ void gather_combine(const float* __restrict__ rows, i64 dim,
                                          const i64* __restrict__ inverse,
                                          const i64* __restrict__ bounds,
                                          const float* __restrict__ weights, i64 n_bags,
                                          int combiner, double max_norm,
                                          float* __restrict__ out, int group_size) {
    EvdbGroup g = evdb_group(group_size);
    if (g.id >= n_bags) return;  // no warp-wide step follows: whole groups may leave
    EvdbBagSource s = {0, 0, rows, dim, 0, inverse, EVDB_I64_MIN, 0, 0ULL, 0.0, 0.0};
    evdb_combine_bag(g, s, g.id, bounds, weights, combiner, max_norm, out);
}

// acc (u, dim) float64, zero on entry: acc[inverse[p]] += (w_p / div_b) grad_out[b].
extern "C" __global__ void combine_backward_scatter(const float* __restrict__ grad_out, i64 dim,
                                                    const i64* __restrict__ inverse,
                                                    const i64* __restrict__ bounds,
                                                    const float* __restrict__ weights,
                                                    i64 n_bags, int combiner,
                                                    double* __restrict__ acc, int group_size) {
    EvdbGroup g = evdb_group(group_size);
    if (g.id >= n_bags) return;
    i64 b = g.id, lo = bounds[b], hi = bounds[b + 1];
    double div = evdb_bag_divisor(g, weights, lo, hi, combiner);
    if (div == 0.0) return;
    for (i64 p = lo; p < hi; ++p) {
        double coef = (double)weights[p] / div;
        i64 r = inverse[p];
        for (i64 c = g.lane; c < dim; c += g.size)
            atomicAdd(acc + r * dim + c, coef * (double)grad_out[b * dim + c]);
    }
}

// out[k] = J_k^T acc[k], J_k the Jacobian of the clip at x = rows[k]:
// s g - max_norm (x . g) x / (|x| (|x| + eps)^2) when |x| > max_norm, else g.
extern "C" __global__ void combine_backward_finish(const float* __restrict__ rows, i64 u, i64 dim,
                                                   double max_norm,
                                                   const double* __restrict__ acc,
                                                   float* __restrict__ out, int group_size) {
    EvdbGroup g = evdb_group(group_size);
    if (g.id >= u) return;
    const float* x = rows + g.id * dim;
    const double* gk = acc + g.id * dim;
    double scale = 1.0, proj = 0.0;
    if (!evdb_is_inf(max_norm)) {
        double sq = 0.0, dot = 0.0;
        for (i64 c = g.lane; c < dim; c += g.size) {
            sq += (double)x[c] * x[c];
            dot += (double)x[c] * gk[c];
        }
        double norm = sqrt(evdb_group_sum(g, sq));
        dot = evdb_group_sum(g, dot);
        if (norm > max_norm) {
            double d = norm + EVDB_NORM_EPS;
            scale = max_norm / d;
            proj = max_norm * dot / (norm * d * d);
        }
    }
    for (i64 c = g.lane; c < dim; c += g.size)
        out[g.id * dim + c] = (float)(scale * gk[c] - proj * (double)x[c]);
}
