// evict.cu: the victim candidates of a cache tier's eviction (evdb/kernels/reference/evict.py).
//
// Memory layout: the tier's columns over rows [0, h): is_live, is_pinned, is_protected bool
// (one byte each), freq uint32, last_step int64; outputs out_rows int64, out_scores float64,
// out_expired bool, of which the first m entries are written (m = the number of candidates).
//
// The candidates are written in row order, as the reference's flatnonzero gives them: a
// stream compaction in three launches. 1. victim_flag: take[r] = 1 for a candidate row;
// 2. an inclusive prefix sum of take (cupy.cumsum, on the host side of gpu.py) gives each
// candidate its output slot rank[r] - 1; 3. victim_scatter writes row, score and expiry there.
// One thread per row in each; every output slot has one writer: no atomics, no races.
#include "common.cuh"

#define EVDB_NEG_INF __longlong_as_double((i64)0xfff0000000000000ULL)  // no math headers

__device__ __forceinline__ bool evdb_is_candidate(const bool* is_live, const bool* is_pinned,
                                                  const bool* is_protected,
                                                  const i64* last_step, i64 r,
                                                  i64 min_live_step) {
    if (!is_live[r] || is_protected[r]) return false;
    return !is_pinned[r] || last_step[r] < min_live_step;  // an expired row goes, pinned or not
}

extern "C" __global__ void victim_flag(const bool* __restrict__ is_live,
                                       const bool* __restrict__ is_pinned,
                                       const bool* __restrict__ is_protected,
                                       const i64* __restrict__ last_step, i64 h,
                                       i64 min_live_step, i64* __restrict__ take) {
    i64 r = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (r < h)
        take[r] = evdb_is_candidate(is_live, is_pinned, is_protected, last_step, r, min_live_step);
}

// Score, lowest evicted first: -inf when expired; else LFU freq * 2^(-age / half_life_steps)
// with age = max(step - last_step, 0), or LRU last_step; in float64, as the reference.
extern "C" __global__ void victim_scatter(const bool* __restrict__ is_live,
                                          const bool* __restrict__ is_pinned,
                                          const bool* __restrict__ is_protected,
                                          const i64* __restrict__ last_step, i64 h,
                                          i64 min_live_step, const unsigned* __restrict__ freq,
                                          i64 step, double half_life_steps, int lfu,
                                          const i64* __restrict__ rank,
                                          i64* __restrict__ out_rows,
                                          double* __restrict__ out_scores,
                                          bool* __restrict__ out_expired) {
    i64 r = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= h ||
        !evdb_is_candidate(is_live, is_pinned, is_protected, last_step, r, min_live_step))
        return;
    i64 last = last_step[r];
    bool expired = last < min_live_step;
    double score;
    if (expired) {
        score = EVDB_NEG_INF;
    } else if (lfu) {
        i64 age = step > last ? step - last : 0;
        score = (double)freq[r] * exp2(-(double)age / half_life_steps);
    } else {
        score = (double)last;
    }
    i64 m = rank[r] - 1;
    out_rows[m] = r;
    out_scores[m] = score;
    out_expired[m] = expired;
}
