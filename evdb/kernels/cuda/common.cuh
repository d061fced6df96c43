// common.cuh: what every evdb CUDA source shares (the key mixer, the index layout, groups).
//
// No system headers: cupy compiles these sources with NVRTC, which has no host include path,
// so only CUDA built-ins are used (the math functions, atomics, warp shuffles). gpu.py pastes
// this header into each source before compiling (so cupy's kernel cache keys on the whole
// text, header included); nvcc in tests/gpu resolves the #include itself.
//
// Index layout, the same bytes as evdb.kernels.reference and the numba kernels use:
//   slots (cap, 2) int64, cap a power of two; slots[j][0] = key, slots[j][1] = row.
//   row >= 0: occupied; row == -1: empty. Every int64 is a valid key: occupancy lives in the
//   row word, never in a reserved key value. Linear probing from mix64(key) & (cap - 1).
// Between calls only those two states exist, so an index built here reads on the CPU and the
// other way round. Inside one call a kernel may also leave, for a later kernel of the same
// call to resolve:
//   row == EVDB_LOCKED (-2): a thread won the empty slot (atomicCAS on the row word) and is
//     writing the key; readers spin until the row is published.
//   row <= EVDB_I64_MIN + n: "occupied, row being decided" (hash_insert: the highest batch
//     position wins) or "being removed" (hash_remove: the lowest position wins); the
//     position is encoded in the value so an atomic max (a CAS loop) or atomicMin picks
//     the winner.
#ifndef EVDB_COMMON_CUH
#define EVDB_COMMON_CUH

typedef long long i64;
typedef unsigned long long u64;

#define EVDB_EMPTY (-1LL)
#define EVDB_LOCKED (-2LL)
#define EVDB_I64_MIN (-9223372036854775807LL - 1LL)
#define EVDB_FULL_MASK 0xffffffffu
#define EVDB_DBL_MAX 1.7976931348623157e308
#define EVDB_NORM_EPS 1e-7

// splitmix64's finaliser (evdb/kernels/hashing.py): wrapping uint64 arithmetic.
__device__ __forceinline__ u64 evdb_mix64(u64 x) {
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBULL;
    x ^= x >> 31;
    return x;
}

__device__ __forceinline__ i64 evdb_home(i64 key, i64 mask) {
    return (i64)(evdb_mix64((u64)key) & (u64)mask);
}

// A load the compiler may neither cache in a register nor hoist out of a spin loop: another
// thread of the same launch may be writing that word.
__device__ __forceinline__ i64 evdb_volatile_load(const i64* p) {
    return *(const volatile i64*)p;
}

__device__ __forceinline__ bool evdb_is_inf(double x) { return x > EVDB_DBL_MAX; }

// Row of key in a quiescent index (no writer in this launch), or -1. At most cap probes, so a
// full index (which callers must never build) cannot hang the device.
__device__ __forceinline__ i64 evdb_find(const i64* __restrict__ slots, i64 mask, i64 key) {
    i64 j = evdb_home(key, mask);
    for (i64 n = 0; n <= mask; ++n) {
        i64 r = slots[2 * j + 1];
        if (r < 0) return -1;
        if (slots[2 * j] == key) return r;
        j = (j + 1) & mask;
    }
    return -1;
}

// Find-or-claim under concurrent writers: returns the slot of key, claiming an empty one for
// it if absent (row published as `claim_row`), and sets *claimed. Returns -1 if cap probes
// found no room. Publication order: key, fence, row; a reader that sees a published row
// fences before it reads the key, so it never compares against a half-written slot.
__device__ __forceinline__ i64 evdb_find_or_claim(i64* slots, i64 mask, i64 key, i64 claim_row,
                                                  bool* claimed) {
    i64 j = evdb_home(key, mask);
    *claimed = false;
    for (i64 n = 0; n <= mask; ++n) {
        i64* row = slots + 2 * j + 1;
        i64 r = evdb_volatile_load(row);
        if (r == EVDB_EMPTY) {
            r = (i64)atomicCAS((u64*)row, (u64)EVDB_EMPTY, (u64)EVDB_LOCKED);
            if (r == EVDB_EMPTY) {
                slots[2 * j] = key;
                __threadfence();
                atomicExch((u64*)row, (u64)claim_row);
                *claimed = true;
                return j;
            }
        }
        // Another thread holds the slot for a moment (it writes one key, then publishes).
        // Volta and later schedule threads of a warp independently, so this spin cannot
        // starve the writer even when both sit in one warp.
        while (r == EVDB_LOCKED) r = evdb_volatile_load(row);
        __threadfence();
        if (evdb_volatile_load(slots + 2 * j) == key) return j;
        j = (j + 1) & mask;
    }
    return -1;
}

// -- groups: G consecutive lanes of a warp (G a power of two <= 32) work on one item --------
// Shuffles and reductions name only the group's lanes, so groups of one warp may run loops of
// different lengths (bags of different sizes) without waiting for each other.
struct EvdbGroup {
    i64 id;         // item this group works on
    int lane;       // 0 .. G-1
    int size;       // G
    unsigned mask;  // the group's lanes in the warp
};

__device__ __forceinline__ EvdbGroup evdb_group(int size) {
    EvdbGroup g;
    i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    g.id = t / size;
    g.lane = (int)(t & (size - 1));
    g.size = size;
    int first = (int)(threadIdx.x & 31) & ~(size - 1);
    g.mask = size == 32 ? EVDB_FULL_MASK : (((1u << size) - 1u) << first);
    return g;
}

__device__ __forceinline__ double evdb_group_sum(const EvdbGroup& g, double v) {
    for (int o = g.size >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(g.mask, v, o, g.size);
    return v;
}

__device__ __forceinline__ i64 evdb_group_bcast(const EvdbGroup& g, i64 v, int src) {
    return __shfl_sync(g.mask, v, src, g.size);
}

#endif  // EVDB_COMMON_CUH
