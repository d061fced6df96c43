// merge.cu: merge two sorted row sets, the newer winning (evdb/kernels/reference/merge.py).
//
// Memory layout: a (older) and b (newer) each have keys (n,) int64 sorted and distinct,
// values (n, dim) float32 C order, steps (n,) int64, removed (n,) bool; the out arrays have at
// least na + nb entries, of which the first m are written, sorted by key.
//
// Each output row has one writer, so there are no atomics: its slot follows from ranks alone.
// 1. merge_flag: dup[i] = 1 when a_keys[i] is also in b (a binary search of b); 2. an
// inclusive prefix sum of dup (cupy.cumsum, on the host side of gpu.py): dups[i] = a's keys in
// a[0 .. i] that b replaces; 3. merge_scatter, one thread per row of a and of b:
//   a[i] not in b goes to i - dups[i] + (b's keys below a_keys[i]);
//   b[j] goes to j + k - dups[k - 1], k = a's keys below b_keys[j] (those replaced dropped).
// So m = na + nb - dups[na - 1].
#include "common.cuh"

// The number of keys[0 .. n) below key (keys sorted ascending).
__device__ __forceinline__ i64 evdb_lower_bound(const i64* keys, i64 n, i64 key) {
    i64 lo = 0, hi = n;
    while (lo < hi) {
        i64 mid = lo + ((hi - lo) >> 1);
        if (keys[mid] < key) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

extern "C" __global__ void merge_flag(const i64* __restrict__ a_keys, i64 na,
                                      const i64* __restrict__ b_keys, i64 nb,
                                      i64* __restrict__ dup) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= na) return;
    i64 k = evdb_lower_bound(b_keys, nb, a_keys[i]);
    dup[i] = k < nb && b_keys[k] == a_keys[i];
}

extern "C" __global__ void merge_scatter(const i64* __restrict__ a_keys,
                                         const float* __restrict__ a_values,
                                         const i64* __restrict__ a_steps,
                                         const bool* __restrict__ a_removed, i64 na,
                                         const i64* __restrict__ b_keys,
                                         const float* __restrict__ b_values,
                                         const i64* __restrict__ b_steps,
                                         const bool* __restrict__ b_removed, i64 nb,
                                         const i64* __restrict__ dups, i64 dim,
                                         i64* __restrict__ out_keys,
                                         float* __restrict__ out_values,
                                         i64* __restrict__ out_steps,
                                         bool* __restrict__ out_removed) {
    i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= na + nb) return;
    const i64* keys;
    const float* values;
    const i64* steps;
    const bool* removed;
    i64 i, m;
    if (t < na) {
        i = t;
        i64 before = evdb_lower_bound(b_keys, nb, a_keys[i]);
        if (before < nb && b_keys[before] == a_keys[i]) return;  // b's row replaces it
        keys = a_keys, values = a_values, steps = a_steps, removed = a_removed;
        m = i - dups[i] + before;
    } else {
        i = t - na;
        i64 k = evdb_lower_bound(a_keys, na, b_keys[i]);
        keys = b_keys, values = b_values, steps = b_steps, removed = b_removed;
        m = i + k - (k > 0 ? dups[k - 1] : 0);
    }
    out_keys[m] = keys[i];
    for (i64 c = 0; c < dim; ++c) out_values[m * dim + c] = values[i * dim + c];
    out_steps[m] = steps[i];
    out_removed[m] = removed[i];
}
