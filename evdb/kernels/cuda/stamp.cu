// stamp.cu: a pull's and a push's row bookkeeping (evdb/kernels/reference/stamp.py).
//
// Memory layout: rows (u,) int64, -1 where a key has no row; the tier's columns, one entry
// per slab row: freq uint32, last_step int64, versions uint64, flags uint8, is_dirty and
// is_pinned bool (one byte each); values (R, dim) and out (u, dim) float32, C order.
//
// Atomics and races: the rows of one call are distinct (the rows of a batch's distinct keys),
// so no two threads write one row's columns and the columns need no atomics. The only shared
// words are the counts a kernel returns (rows stamped; gradients dropped and frozen), added
// once per warp (a ballot, then one atomicAdd). clear_flags may meet a row twice: every
// writer stores false, so the order does not matter.
#include "common.cuh"

// One group of G lanes per entry: lane 0 stamps the row's columns, the G lanes copy its
// dim floats into out (as probe_gather does). Entries without a row leave out as it is.
extern "C" __global__ void stamp_gather_pulled(const i64* __restrict__ rows,
                                               const i64* __restrict__ counts, i64 u, i64 step,
                                               u64 version, i64 freq_max,
                                               unsigned* __restrict__ freq,
                                               i64* __restrict__ last_step,
                                               u64* __restrict__ versions,
                                               bool* __restrict__ is_dirty,
                                               bool* __restrict__ is_pinned,
                                               const float* __restrict__ values, i64 dim,
                                               float* __restrict__ out,
                                               u64* __restrict__ stamped, int group_size) {
    EvdbGroup g = evdb_group(group_size);
    bool hit = false;
    if (g.id < u) {
        i64 r = rows[g.id];
        if (r >= 0) {
            if (g.lane == 0) {
                i64 f = (i64)freq[r] + counts[g.id];  // saturating at freq_max
                freq[r] = (unsigned)(f < freq_max ? f : freq_max);
                last_step[r] = step;
                versions[r] = version;
                is_dirty[r] = true;
                is_pinned[r] = true;
                hit = true;
            }
            for (i64 c = g.lane; c < dim; c += g.size) out[g.id * dim + c] = values[r * dim + c];
        }
    }
    unsigned hits = __ballot_sync(EVDB_FULL_MASK, hit);
    if ((threadIdx.x & 31) == 0 && hits) atomicAdd(stamped, (u64)__popc(hits));
}

// One thread per entry. counted[0] += entries without a row (their gradient is dropped),
// counted[1] += entries whose row is frozen (set to -1 here, so the update skips them).
extern "C" __global__ void stamp_pushed(i64* __restrict__ rows, i64 u,
                                        const unsigned char* __restrict__ flags, int frozen_bit,
                                        i64 step, u64 version, i64* __restrict__ last_step,
                                        u64* __restrict__ versions, bool* __restrict__ is_dirty,
                                        u64* __restrict__ counted) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    bool dropped = false, frozen = false;
    if (i < u) {
        i64 r = rows[i];
        if (r < 0) {
            dropped = true;
        } else if (flags[r] & frozen_bit) {
            rows[i] = -1;
            frozen = true;
        } else {
            last_step[r] = step;
            versions[r] = version;
            is_dirty[r] = true;
        }
    }
    unsigned d = __ballot_sync(EVDB_FULL_MASK, dropped);
    unsigned f = __ballot_sync(EVDB_FULL_MASK, frozen);
    if ((threadIdx.x & 31) == 0) {
        if (d) atomicAdd(counted, (u64)__popc(d));
        if (f) atomicAdd(counted + 1, (u64)__popc(f));
    }
}

extern "C" __global__ void clear_flags(bool* __restrict__ flags, const i64* __restrict__ rows,
                                       i64 n) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) flags[rows[i]] = false;
}
