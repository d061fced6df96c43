// cuda_cpu.h: what g++ needs to compile evdb's CUDA sources, unmodified, for the CPU.
//
// Test support only (see rawmodule.py for the model and its limits). Every CUDA thread is
// an OS thread of cuda_cpu_runtime.cpp's pool; the built-ins below read that thread's
// coordinates, the warp intrinsics rendezvous with the other lanes of their mask through the
// runtime, and the atomics are GCC __atomic builtins with CUDA's exact overload set, so a
// call NVRTC rejects (atomicCAS on a signed 64-bit pointer, say) fails to compile here too.
// Only what evdb's sources use is defined: an unknown intrinsic is a compile error, not a
// silent stand-in.
#ifndef EVDB_CUDA_CPU_H
#define EVDB_CUDA_CPU_H

#include <cmath>
#include <cstring>

// ---- qualifiers ----------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
// Only `extern __shared__ T name[];` (dynamic shared memory) is supported: rawmodule.py
// defines `name` as the launch's per-block buffer and refuses a static __shared__ array.
#define __shared__

struct uint3 {
    unsigned x, y, z;
};
typedef uint3 dim3;

namespace evdb_cuda_cpu {

struct ThreadCoords {
    uint3 thread_idx, block_idx, block_dim, grid_dim;
};
extern thread_local ThreadCoords coords;  // set by the runtime before the thread runs

enum WarpOpKind { SHFL_IDX = 0, SHFL_XOR = 1, SHFL_DOWN = 2, SHFL_UP = 3, BALLOT = 4 };

// One warp-synchronous op of the calling lane: waits for every lane of mask at this op (the
// same call site, the same mask), then returns the value of the lane the op reads (shuffles)
// or the ballot. Errors (a lane of mask exited or at another op, a source lane outside mask,
// a timeout) abort the whole launch with a message instead of hanging.
extern "C" unsigned long long evdb_cuda_cpu_warp_op(int kind, unsigned mask,
                                                    unsigned long long value, int b, int width,
                                                    const void* site);
extern "C" void evdb_cuda_cpu_syncthreads(const void* site);

template <typename T>
__forceinline__ unsigned long long to_bits(T v) {
    static_assert(sizeof(T) <= 8, "warp ops move at most 64 bits");
    unsigned long long bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    return bits;
}

template <typename T>
__forceinline__ T from_bits(unsigned long long bits) {
    T v;
    std::memcpy(&v, &bits, sizeof(T));
    return v;
}

}  // namespace evdb_cuda_cpu

#define threadIdx (evdb_cuda_cpu::coords.thread_idx)
#define blockIdx (evdb_cuda_cpu::coords.block_idx)
#define blockDim (evdb_cuda_cpu::coords.block_dim)
#define gridDim (evdb_cuda_cpu::coords.grid_dim)
#define warpSize 32

// ---- warp intrinsics: CUDA's overloads (int, unsigned, long long, unsigned long long, float,
// double) as one template restricted to them -----------------------------------------------
namespace evdb_cuda_cpu {
template <typename T>
struct Shuffleable {
    static constexpr bool value = false;
};
#define EVDB_CUDA_CPU_SHUFFLEABLE(T) \
    template <>                      \
    struct Shuffleable<T> {          \
        static constexpr bool value = true; \
    };
EVDB_CUDA_CPU_SHUFFLEABLE(int)
EVDB_CUDA_CPU_SHUFFLEABLE(unsigned)
EVDB_CUDA_CPU_SHUFFLEABLE(long)
EVDB_CUDA_CPU_SHUFFLEABLE(unsigned long)
EVDB_CUDA_CPU_SHUFFLEABLE(long long)
EVDB_CUDA_CPU_SHUFFLEABLE(unsigned long long)
EVDB_CUDA_CPU_SHUFFLEABLE(float)
EVDB_CUDA_CPU_SHUFFLEABLE(double)
#undef EVDB_CUDA_CPU_SHUFFLEABLE

template <typename T>
__forceinline__ T shuffle(int kind, unsigned mask, T v, int b, int width, const void* site) {
    static_assert(Shuffleable<T>::value, "no CUDA shuffle overload for this type");
    return from_bits<T>(evdb_cuda_cpu_warp_op(kind, mask, to_bits(v), b, width, site));
}
}  // namespace evdb_cuda_cpu

// An intrinsic's site is its source line (module.cu's, through #line): a code address would
// differ between copies of one op that g++ makes when it duplicates a branch's tail.
#define EVDB_CUDA_CPU_HERE ((const void*)(unsigned long)__LINE__)

// The optional width of the shuffles defaults to 32: the trailing "32, 0" fills it in.
#define __shfl_sync(...) EVDB_CUDA_CPU_SHFL(evdb_cuda_cpu::SHFL_IDX, __VA_ARGS__, 32, 0)
#define __shfl_xor_sync(...) EVDB_CUDA_CPU_SHFL(evdb_cuda_cpu::SHFL_XOR, __VA_ARGS__, 32, 0)
#define __shfl_down_sync(...) EVDB_CUDA_CPU_SHFL(evdb_cuda_cpu::SHFL_DOWN, __VA_ARGS__, 32, 0)
#define __shfl_up_sync(...) EVDB_CUDA_CPU_SHFL(evdb_cuda_cpu::SHFL_UP, __VA_ARGS__, 32, 0)
#define EVDB_CUDA_CPU_SHFL(kind, mask, v, b, width, ...) \
    evdb_cuda_cpu::shuffle((kind), (unsigned)(mask), (v), (int)(b), (int)(width), EVDB_CUDA_CPU_HERE)

__forceinline__ unsigned __ballot_sync_impl(unsigned mask, int pred, const void* site) {
    return (unsigned)evdb_cuda_cpu_warp_op(evdb_cuda_cpu::BALLOT, mask, pred ? 1ULL : 0ULL, 0,
                                           32, site);
}
#define __ballot_sync(mask, pred) __ballot_sync_impl((unsigned)(mask), (pred) ? 1 : 0, EVDB_CUDA_CPU_HERE)
#define __syncthreads() evdb_cuda_cpu::evdb_cuda_cpu_syncthreads(EVDB_CUDA_CPU_HERE)

// ---- bit and conversion intrinsics --------------------------------------------------------
__forceinline__ int __popc(unsigned x) { return __builtin_popcount(x); }
__forceinline__ int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
__forceinline__ int __ffs(int x) { return __builtin_ffs(x); }
__forceinline__ int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
__forceinline__ double __longlong_as_double(long long x) {
    return evdb_cuda_cpu::from_bits<double>((unsigned long long)x);
}
__forceinline__ long long __double_as_longlong(double x) {
    return (long long)evdb_cuda_cpu::to_bits(x);
}

// ---- floating point: round-to-nearest ops are the plain ops (rawmodule compiles with
// -ffp-contract=off, so no FMA contraction); maths from glibc, not libdevice ----------------
__forceinline__ double __dadd_rn(double a, double b) { return a + b; }
__forceinline__ double __dmul_rn(double a, double b) { return a * b; }
using std::cos;
using std::exp2;
using std::fabs;
using std::fmax;
using std::fmin;
using std::log;
using std::pow;
using std::sin;
using std::sqrt;

// ---- fences and atomics: relaxed, as CUDA's; x86 makes every RMW a full barrier anyway -----
__forceinline__ void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
__forceinline__ void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

#define EVDB_CUDA_CPU_RMW(name, T, builtin)                  \
    __forceinline__ T name(T* p, T v) { return builtin(p, v, __ATOMIC_RELAXED); }
EVDB_CUDA_CPU_RMW(atomicAdd, int, __atomic_fetch_add)
EVDB_CUDA_CPU_RMW(atomicAdd, unsigned, __atomic_fetch_add)
EVDB_CUDA_CPU_RMW(atomicAdd, unsigned long long, __atomic_fetch_add)
EVDB_CUDA_CPU_RMW(atomicSub, int, __atomic_fetch_sub)
EVDB_CUDA_CPU_RMW(atomicSub, unsigned, __atomic_fetch_sub)
EVDB_CUDA_CPU_RMW(atomicExch, int, __atomic_exchange_n)
EVDB_CUDA_CPU_RMW(atomicExch, unsigned, __atomic_exchange_n)
EVDB_CUDA_CPU_RMW(atomicExch, unsigned long long, __atomic_exchange_n)
EVDB_CUDA_CPU_RMW(atomicAnd, int, __atomic_fetch_and)
EVDB_CUDA_CPU_RMW(atomicAnd, unsigned, __atomic_fetch_and)
EVDB_CUDA_CPU_RMW(atomicAnd, unsigned long long, __atomic_fetch_and)
EVDB_CUDA_CPU_RMW(atomicOr, int, __atomic_fetch_or)
EVDB_CUDA_CPU_RMW(atomicOr, unsigned, __atomic_fetch_or)
EVDB_CUDA_CPU_RMW(atomicOr, unsigned long long, __atomic_fetch_or)
EVDB_CUDA_CPU_RMW(atomicXor, int, __atomic_fetch_xor)
EVDB_CUDA_CPU_RMW(atomicXor, unsigned, __atomic_fetch_xor)
EVDB_CUDA_CPU_RMW(atomicXor, unsigned long long, __atomic_fetch_xor)
#undef EVDB_CUDA_CPU_RMW

// atomicCAS: int, unsigned, unsigned long long, unsigned short only (no signed 64-bit).
#define EVDB_CUDA_CPU_CAS(T)                                                       \
    __forceinline__ T atomicCAS(T* p, T compare, T v) {                            \
        __atomic_compare_exchange_n(p, &compare, v, false, __ATOMIC_RELAXED,       \
                                    __ATOMIC_RELAXED);                             \
        return compare;                                                            \
    }
EVDB_CUDA_CPU_CAS(int)
EVDB_CUDA_CPU_CAS(unsigned)
EVDB_CUDA_CPU_CAS(unsigned long long)
EVDB_CUDA_CPU_CAS(unsigned short)
#undef EVDB_CUDA_CPU_CAS

namespace evdb_cuda_cpu {
// A read-modify-write by compare-and-swap: f(old) is stored, old returned.
template <typename T, typename F>
__forceinline__ T cas_loop(T* p, F f) {
    T old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(p, &old, f(old), true, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
    }
    return old;
}
template <typename T, typename U>
__forceinline__ T cas_loop_bits(T* p, T v) {  // float/double add on their bit pattern
    U* bits = reinterpret_cast<U*>(p);
    U old = __atomic_load_n(bits, __ATOMIC_RELAXED), next;
    do {
        next = to_bits(from_bits<T>(old) + v);
    } while (!__atomic_compare_exchange_n(bits, &old, next, true, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    return from_bits<T>(old);
}
}  // namespace evdb_cuda_cpu

__forceinline__ float atomicAdd(float* p, float v) {
    return evdb_cuda_cpu::cas_loop_bits<float, unsigned>(p, v);
}
__forceinline__ double atomicAdd(double* p, double v) {
    return evdb_cuda_cpu::cas_loop_bits<double, unsigned long long>(p, v);
}
__forceinline__ float atomicExch(float* p, float v) {
    return evdb_cuda_cpu::from_bits<float>(
        __atomic_exchange_n(reinterpret_cast<unsigned*>(p), (unsigned)evdb_cuda_cpu::to_bits(v),
                            __ATOMIC_RELAXED));
}

// atomicMin / atomicMax: int, unsigned, long long, unsigned long long.
#define EVDB_CUDA_CPU_MINMAX(T)                                                              \
    __forceinline__ T atomicMin(T* p, T v) {                                                 \
        return evdb_cuda_cpu::cas_loop(p, [v](T old) { return v < old ? v : old; });         \
    }                                                                                        \
    __forceinline__ T atomicMax(T* p, T v) {                                                 \
        return evdb_cuda_cpu::cas_loop(p, [v](T old) { return v > old ? v : old; });         \
    }
EVDB_CUDA_CPU_MINMAX(int)
EVDB_CUDA_CPU_MINMAX(unsigned)
EVDB_CUDA_CPU_MINMAX(long long)
EVDB_CUDA_CPU_MINMAX(unsigned long long)
#undef EVDB_CUDA_CPU_MINMAX

#endif  // EVDB_CUDA_CPU_H
