// index.cu: the hash index on the device (evdb/kernels/reference/index.py).
//
// Memory layout: see common.cuh (slots (cap, 2) int64 of key/row, row -1 = empty, linear
// probing from mix64(key)). keys (n,) int64; per-key outputs (n,) int64.
//
// Atomics and races, kernel by kernel (each numbered step is one launch, so a step sees every
// write of the steps before it):
// * hash_find, probe_gather, bloom_query: read only.
// * hash_insert: 1. find-or-claim each key's slot (atomicCAS -1 -> LOCKED on the row word,
//   then key, fence, row) and, on that slot, an atomic "max" of EVDB_I64_MIN + 1 + i, where
//   an old row >= 0 counts as lowest; 2. the thread whose position survived writes its row.
//   So the last occurrence of a key wins, as in the reference's sequential loop.
// * hash_remove: 1. read-only find; 2. atomicMin(row, EVDB_I64_MIN + i) marks found slots,
//   the first occurrence winning (the reference pops each key once, in order); 3. losers
//   report -1, and the first marked slot of each run (maximal stretch of non-empty slots)
//   is elected with the run's end; 4. one thread per elected run backward-shifts every mark
//   out of its run, as cpu/index.py does one key at a time. Runs are bounded by empty slots
//   that stay empty during step 4 (entries only move back toward their home, which lies in
//   their own run), so threads of different runs never touch the same slot. No tombstone
//   survives the call: the CPU backend can keep reading the index.
// * unique_*: claim a scratch slot (or a `mark` entry) per distinct key with the smallest
//   position winning (atomicMin), rank first occurrences with a prefix sum (cupy.cumsum, on
//   the host side of gpu.py), then scatter, count (atomicAdd) and clear in later launches.
// * sketch_add: saturating byte adds by atomicCAS on the enclosing 32-bit word; the query is a
//   second launch, after the whole batch, as the reference's is.
// * bloom_add: atomicOr on 64-bit words.
#include "common.cuh"

// ---- find ---------------------------------------------------------------------------------

extern "C" __global__ void hash_find(const i64* __restrict__ slots, i64 cap,
                                     const i64* __restrict__ keys, i64 n,
                                     i64* __restrict__ out) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = evdb_find(slots, cap - 1, keys[i]);
}

// ---- insert or assign ---------------------------------------------------------------------

// Atomic max under the order "any row >= 0 < every pending value": an old row of the key is
// replaced by the first pending position, and pending positions keep the highest.
__device__ __forceinline__ void evdb_pending_max(i64* row, i64 value) {
    i64 old = evdb_volatile_load(row);
    while (old >= 0 || old < value) {
        i64 seen = (i64)atomicCAS((u64*)row, (u64)old, (u64)value);
        if (seen == old) return;
        old = seen;
    }
}

extern "C" __global__ void hash_insert_claim(i64* slots, i64 cap, const i64* __restrict__ keys,
                                             i64 n, i64* __restrict__ slot_of) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    i64 pending = EVDB_I64_MIN + 1 + i;
    bool claimed;
    i64 j = evdb_find_or_claim(slots, cap - 1, keys[i], pending, &claimed);
    if (j >= 0 && !claimed) evdb_pending_max(slots + 2 * j + 1, pending);
    slot_of[i] = j;  // -1: no room (gpu.py raises CapacityError)
}

extern "C" __global__ void hash_insert_assign(i64* slots, const i64* __restrict__ slot_of,
                                              const i64* __restrict__ rows, i64 n) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    i64 j = slot_of[i];
    // Only the surviving position matches; it is the only writer of that word in this launch.
    if (j >= 0 && slots[2 * j + 1] == EVDB_I64_MIN + 1 + i) slots[2 * j + 1] = rows[i];
}

// ---- remove -------------------------------------------------------------------------------

extern "C" __global__ void hash_remove_find(const i64* __restrict__ slots, i64 cap,
                                            const i64* __restrict__ keys, i64 n,
                                            i64* __restrict__ out, i64* __restrict__ slot_of) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    i64 mask = cap - 1, key = keys[i], j = evdb_home(key, mask);
    out[i] = -1;
    slot_of[i] = -1;
    for (i64 probes = 0; probes <= mask; ++probes) {
        i64 r = slots[2 * j + 1];
        if (r < 0) return;
        if (slots[2 * j] == key) {
            out[i] = r;
            slot_of[i] = j;
            return;
        }
        j = (j + 1) & mask;
    }
}

extern "C" __global__ void hash_remove_mark(i64* slots, const i64* __restrict__ slot_of, i64 n) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && slot_of[i] >= 0) atomicMin(slots + 2 * slot_of[i] + 1, EVDB_I64_MIN + i);
}

// run_from[i]: the slot where thread i starts repairing (the first mark of its run), or -1;
// run_to[i]: the empty slot that ends that run.
extern "C" __global__ void hash_remove_elect(const i64* __restrict__ slots, i64 cap, i64 n,
                                             const i64* __restrict__ slot_of,
                                             i64* __restrict__ out, i64* __restrict__ run_from,
                                             i64* __restrict__ run_to) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    i64 mask = cap - 1, j = slot_of[i];
    run_from[i] = -1;
    if (j < 0) return;
    if (slots[2 * j + 1] != EVDB_I64_MIN + i) {  // the key appeared earlier in this batch
        out[i] = -1;
        return;
    }
    // (Both walks end at an empty slot, which a loadable index always has: load < 1.)
    for (i64 k = (j - 1) & mask; slots[2 * k + 1] != EVDB_EMPTY; k = (k - 1) & mask)
        if (slots[2 * k + 1] < EVDB_EMPTY) return;  // an earlier mark of this run leads
    i64 e = (j + 1) & mask;
    while (slots[2 * e + 1] != EVDB_EMPTY) e = (e + 1) & mask;
    run_from[i] = j;
    run_to[i] = e;
}

extern "C" __global__ void hash_remove_repair(i64* slots, i64 cap, i64 n,
                                              const i64* __restrict__ run_from,
                                              const i64* __restrict__ run_to) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || run_from[i] < 0) return;
    i64 mask = cap - 1, t = run_from[i], end = run_to[i];
    while (t != end) {
        if (slots[2 * t + 1] >= EVDB_EMPTY) {  // a live entry or a hole: move on
            t = (t + 1) & mask;
            continue;
        }
        // Backward-shift deletion of the mark at t (cpu/index.py's hash_remove): pull later
        // members of the run into the hole when the hole lies on their probe path. Marks are
        // moved like entries (their keys still hash home) and removed when t reaches them;
        // t is re-examined, since a mark may have moved into it.
        i64 hole = t, k = t;
        while (true) {
            k = (k + 1) & mask;
            if (slots[2 * k + 1] == EVDB_EMPTY) break;
            i64 home = evdb_home(slots[2 * k], mask);
            if (((k - home) & mask) >= ((k - hole) & mask)) {
                slots[2 * hole] = slots[2 * k];
                slots[2 * hole + 1] = slots[2 * k + 1];
                hole = k;
            }
        }
        slots[2 * hole + 1] = EVDB_EMPTY;
    }
}

// ---- fused probe + TTL check + gather -----------------------------------------------------

// One group of G lanes per key: lane 0 probes (the run is short; its lines are cached for the
// next probe), the row is broadcast, and the G lanes copy dim floats, G consecutive floats per
// instruction. Misses are counted per warp (one atomicAdd per warp, not per key).
extern "C" __global__ void probe_gather(const i64* __restrict__ slots, i64 cap,
                                        const float* __restrict__ values, i64 dim,
                                        const i64* __restrict__ last_step,
                                        const i64* __restrict__ keys, i64 n, i64 min_live_step,
                                        float* __restrict__ out, i64* __restrict__ out_rows,
                                        u64* __restrict__ missing, int group_size) {
    EvdbGroup g = evdb_group(group_size);
    bool active = g.id < n;
    bool miss = false;
    if (active) {
        i64 r = -1;
        if (g.lane == 0) {
            r = evdb_find(slots, cap - 1, keys[g.id]);
            // Without a TTL (min_live_step = INT64_MIN) skip the last_step load: a random miss.
            if (r >= 0 && min_live_step != EVDB_I64_MIN && last_step[r] < min_live_step) r = -1;
            out_rows[g.id] = r;
            miss = r < 0;
        }
        r = evdb_group_bcast(g, r, 0);
        if (r >= 0)
            for (i64 c = g.lane; c < dim; c += g.size) out[g.id * dim + c] = values[r * dim + c];
    }
    unsigned misses = __ballot_sync(EVDB_FULL_MASK, miss);
    if ((threadIdx.x & 31) == 0 && misses) atomicAdd(missing, (u64)__popc(misses));
}

// ---- dedup: unique_inverse / unique_rows --------------------------------------------------
// where[i] >= 0: the scratch slot of keys[i]; where[i] <= -2: the mark entry -2 - where[i]
// (keys that already have a row dedup by row, by direct addressing: no hash, no probe run).
// The scratch row (or the mark) ends up holding the first position of the key.

extern "C" __global__ void unique_claim(const i64* __restrict__ keys, i64 n,
                                        const i64* __restrict__ rows, int has_rows, int* mark,
                                        i64* scratch, i64 cap, i64* __restrict__ where) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    if (has_rows && rows[i] >= 0) {
        i64 r = rows[i];
        int old = atomicCAS(mark + r, -1, (int)i);
        if (old != -1) atomicMin(mark + r, (int)i);
        where[i] = -2 - r;
        return;
    }
    bool claimed;
    i64 j = evdb_find_or_claim(scratch, cap - 1, keys[i], i, &claimed);
    if (j >= 0 && !claimed) atomicMin(scratch + 2 * j + 1, i);
    where[i] = j;  // -1 cannot happen: the caller sizes scratch to at least 2 n
}

__device__ __forceinline__ i64 evdb_first_position(const i64* where, const int* mark,
                                                   const i64* scratch, i64 i) {
    i64 w = where[i];
    return w >= 0 ? scratch[2 * w + 1] : (i64)mark[-2 - w];
}

extern "C" __global__ void unique_flag_first(i64 n, const i64* __restrict__ where,
                                             const int* __restrict__ mark,
                                             const i64* __restrict__ scratch,
                                             i64* __restrict__ is_first) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) is_first[i] = evdb_first_position(where, mark, scratch, i) == i;
}

// rank (n,) is the inclusive prefix sum of is_first: the distinct key first seen at position
// p is number rank[p] - 1 in first-occurrence order. out_counts[:u] is zero on entry.
extern "C" __global__ void unique_scatter(const i64* __restrict__ keys, i64 n,
                                          const i64* __restrict__ rows, int has_rows,
                                          const i64* __restrict__ where,
                                          const int* __restrict__ mark,
                                          const i64* __restrict__ scratch,
                                          const i64* __restrict__ rank,
                                          i64* __restrict__ out_unique,
                                          i64* __restrict__ out_inverse,
                                          i64* __restrict__ out_counts,
                                          i64* __restrict__ out_rows) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    i64 first = evdb_first_position(where, mark, scratch, i);
    i64 u = rank[first] - 1;
    out_inverse[i] = u;
    atomicAdd((u64*)(out_counts + u), 1ULL);
    if (first == i) {
        out_unique[u] = keys[i];
        if (has_rows) out_rows[u] = rows[i];
    }
}

// Leave scratch and mark empty for the next call (only the entries this call used).
extern "C" __global__ void unique_clear(i64 n, const i64* __restrict__ where, int* mark,
                                        i64* scratch, const i64* __restrict__ is_first) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || !is_first[i]) return;
    i64 w = where[i];
    if (w >= 0)
        scratch[2 * w + 1] = EVDB_EMPTY;
    else
        mark[-2 - w] = -1;
}

// ---- counting Bloom sketch and Bloom filter -----------------------------------------------
// Positions: double hashing h1 + h * h2 (mod width), h1 = mix64(key ^ seed), h2 = mix64(h1)|1.

__device__ __forceinline__ void evdb_saturating_add_u8(unsigned char* p, i64 count) {
    // No byte atomics in CUDA: CAS the aligned 32-bit word that holds the byte. The buffer's
    // allocation is padded (cupy rounds to 512 bytes), so the word never leaves it.
    unsigned* word = (unsigned*)((u64)p & ~(u64)3);
    unsigned shift = (unsigned)(((u64)p & 3) * 8);
    unsigned old = *word, seen;
    do {
        i64 c = (i64)((old >> shift) & 0xffu) + count;
        unsigned byte = (unsigned)(c < 255 ? c : 255) & 0xffu;
        unsigned next = (old & ~(0xffu << shift)) | (byte << shift);
        seen = old;
        old = atomicCAS(word, seen, next);
    } while (old != seen);
}

extern "C" __global__ void sketch_update(unsigned char* counters, i64 width,
                                         const i64* __restrict__ keys,
                                         const i64* __restrict__ counts, i64 n, i64 n_hashes,
                                         u64 seed) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    u64 h1 = evdb_mix64((u64)keys[i] ^ seed), h2 = evdb_mix64(h1) | 1ULL;
    for (i64 h = 0; h < n_hashes; ++h)
        evdb_saturating_add_u8(counters + (h1 + (u64)h * h2) % (u64)width, counts[i]);
}

extern "C" __global__ void sketch_query(const unsigned char* __restrict__ counters, i64 width,
                                        const i64* __restrict__ keys, i64 n, i64 n_hashes,
                                        u64 seed, i64* __restrict__ out) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    u64 h1 = evdb_mix64((u64)keys[i] ^ seed), h2 = evdb_mix64(h1) | 1ULL;
    i64 best = 255;
    for (i64 h = 0; h < n_hashes; ++h) {
        i64 c = counters[(h1 + (u64)h * h2) % (u64)width];
        best = c < best ? c : best;
    }
    out[i] = n_hashes > 0 ? best : 0;
}

extern "C" __global__ void bloom_add(u64* bits, i64 words, const i64* __restrict__ keys, i64 n,
                                     i64 n_hashes, u64 seed) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    u64 width = (u64)words * 64, h1 = evdb_mix64((u64)keys[i] ^ seed), h2 = evdb_mix64(h1) | 1ULL;
    for (i64 h = 0; h < n_hashes; ++h) {
        u64 p = (h1 + (u64)h * h2) % width;
        atomicOr(bits + (p >> 6), 1ULL << (p & 63));
    }
}

extern "C" __global__ void bloom_query(const u64* __restrict__ bits, i64 words,
                                       const i64* __restrict__ keys, i64 n, i64 n_hashes,
                                       u64 seed, bool* __restrict__ out) {
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    u64 width = (u64)words * 64, h1 = evdb_mix64((u64)keys[i] ^ seed), h2 = evdb_mix64(h1) | 1ULL;
    bool hit = true;
    for (i64 h = 0; h < n_hashes && hit; ++h) {
        u64 p = (h1 + (u64)h * h2) % width;
        hit = (bits[p >> 6] >> (p & 63)) & 1ULL;
    }
    out[i] = hit;
}
