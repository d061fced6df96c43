// cuda_cpu_runtime.cpp: the executor behind cuda_cpu.h (one shared library per process, which
// every module that rawmodule.py builds links to).
//
// A pool of OS threads, one per CUDA thread of a block, reused across blocks and launches:
// each worker sleeps on its own futex word, the launching thread posts the block's threads,
// they run the kernel concurrently, and the last to finish wakes the launcher. Blocks run one
// after another. Warp intrinsics rendezvous under a mutex per warp: an op is matched across
// the lanes of its mask by (mask, how many ops with that mask the lane has done), and every
// lane must reach it from the same source line, so a lane that exits, skips the op or sits at
// another op is reported (at once where it is a certain deadlock, else after a timeout).
// Errors unwind the CUDA threads by exception and fail the launch with a message.
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda_cpu.h"

namespace evdb_cuda_cpu {

thread_local ThreadCoords coords;

namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kPoll = std::chrono::milliseconds(50);  // how often a waiter checks for abort

struct LaunchAbort {};  // unwinds a CUDA thread after an error (the message is in g_error)

std::atomic<bool> g_abort{false};
std::mutex g_error_mu;
std::string g_error;
double g_timeout_s = 10.0;

[[noreturn]] void fail(const std::string& msg) {
    {
        std::lock_guard<std::mutex> lock(g_error_mu);
        if (!g_abort.load()) g_error = msg;
        g_abort.store(true);
    }
    throw LaunchAbort();
}

std::string hex(unsigned x) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "0x%08x", x);
    return buf;
}

std::string site_name(const void* site) {
    return "line " + std::to_string((unsigned long)site);
}

const char* kind_name(int kind) {
    static const char* names[] = {"__shfl_sync", "__shfl_xor_sync", "__shfl_down_sync",
                                  "__shfl_up_sync", "__ballot_sync"};
    return kind >= 0 && kind <= BALLOT ? names[kind] : "warp op";
}

// ---- warps --------------------------------------------------------------------------------

struct OpRecord {
    bool open = false;
    int kind = 0;
    unsigned mask = 0, ordinal = 0, arrived = 0, departed = 0;
    int width = 32;
    const void* site = nullptr;
    unsigned long long values[32];
};

struct Lane {
    bool exited = false;
    int waiting = -1;  // the record this lane waits in
    int n_masks = 0;
    unsigned masks[8], counts[8];  // ops done per mask
};

struct Warp {
    std::mutex mu;
    std::condition_variable cv;
    unsigned present = 0;  // lanes that exist in this block
    int sleepers = 0;      // lanes blocked on cv (arrivals notify only when there are some)
    Lane lanes[32];
    OpRecord records[32];

    void reset(unsigned lanes_present) {
        present = lanes_present;
        sleepers = 0;
        for (Lane& l : lanes) l = Lane();
        for (OpRecord& r : records) r.open = false;
    }
};

struct BlockState {
    unsigned n_threads = 0;
    std::unique_ptr<Warp[]> warps;
    unsigned n_warps = 0;
    // __syncthreads
    std::mutex mu;
    std::condition_variable cv;
    unsigned live = 0, arrived = 0;
    unsigned long generation = 0;
    const void* site = nullptr;

    void reset(unsigned n) {
        n_threads = n;
        unsigned w = (n + 31) / 32;
        if (w > n_warps) {
            warps.reset(new Warp[w]);
            n_warps = w;
        }
        for (unsigned i = 0; i < w; ++i) {
            unsigned count = n - i * 32 < 32 ? n - i * 32 : 32;
            warps[i].reset(count == 32 ? 0xffffffffu : ((1u << count) - 1u));
        }
        live = n;
        arrived = 0;
        site = nullptr;
    }
};

BlockState g_block;

unsigned linear_thread() {
    const uint3& t = coords.thread_idx;
    const uint3& d = coords.block_dim;
    return t.x + d.x * (t.y + d.y * t.z);
}

// The lane that an op of this kind reads, by PTX's shfl rule (segments of `width` lanes).
int source_lane(int kind, int lane, int b, int width) {
    int segmask = 32 - width, cval = kind == SHFL_UP ? 0 : 0x1f;
    int max_lane = (lane & segmask) | (cval & ~segmask);
    int min_lane = lane & segmask;
    int j = lane;
    bool ok = false;
    switch (kind) {
        case SHFL_UP:
            j = lane - b;
            ok = j >= max_lane;
            break;
        case SHFL_DOWN:
            j = lane + b;
            ok = j <= max_lane;
            break;
        case SHFL_XOR:
            j = lane ^ b;
            ok = j <= max_lane;
            break;
        default:
            j = min_lane | (b & ~segmask & 0x1f);
            ok = j <= max_lane;
            break;
    }
    return ok ? j : lane;
}

}  // namespace
}  // namespace evdb_cuda_cpu

using namespace evdb_cuda_cpu;

extern "C" unsigned long long evdb_cuda_cpu_warp_op(int kind, unsigned mask,
                                                    unsigned long long value, int b, int width,
                                                    const void* site) {
    unsigned tid = linear_thread(), lane = tid & 31, bit = 1u << lane;
    Warp& w = g_block.warps[tid / 32];
    std::unique_lock<std::mutex> lock(w.mu);
    std::string where = std::string(kind_name(kind)) + " (" + site_name(site) + ", mask " +
                        hex(mask) + ") in warp " + std::to_string(tid / 32);
    if (!(mask & bit)) fail("lane " + std::to_string(lane) + " calls " + where + " without its bit");
    if (mask & ~w.present)
        fail(where + " names lanes " + hex(mask & ~w.present) + " that the block does not have");
    if (kind != BALLOT && (width < 1 || width > 32 || (width & (width - 1))))
        fail(where + ": width " + std::to_string(width) + " is not a power of two <= 32");
    Lane& me = w.lanes[lane];
    int m = 0;
    while (m < me.n_masks && me.masks[m] != mask) ++m;
    if (m == me.n_masks) {
        if (m == 8) fail(where + ": a lane used more than 8 distinct masks");
        me.masks[m] = mask;
        me.counts[m] = 0;
        ++me.n_masks;
    }
    unsigned ordinal = ++me.counts[m];
    int idx = -1, free_idx = -1;
    for (int r = 0; r < 32; ++r) {
        OpRecord& rec = w.records[r];
        if (rec.open && rec.mask == mask && rec.ordinal == ordinal) idx = r;
        if (!rec.open && free_idx < 0) free_idx = r;
    }
    if (idx < 0) {
        idx = free_idx;
        OpRecord& rec = w.records[idx];
        rec.open = true;
        rec.kind = kind;
        rec.mask = mask;
        rec.ordinal = ordinal;
        rec.arrived = rec.departed = 0;
        rec.width = width;
        rec.site = site;
    }
    OpRecord& rec = w.records[idx];
    if (rec.site != site || rec.kind != kind || rec.width != width)
        fail("divergent warp op: lane " + std::to_string(lane) + " is at " + where +
             " (width " + std::to_string(width) + ") where other lanes of its mask are at " +
             kind_name(rec.kind) + " (" + site_name(rec.site) + ", width " +
             std::to_string(rec.width) + ")");
    rec.values[lane] = value;
    __atomic_fetch_or(&rec.arrived, bit, __ATOMIC_RELEASE);  // read unlocked by spinners
    me.waiting = idx;
    if (rec.arrived == mask && w.sleepers) w.cv.notify_all();
    auto deadline = Clock::now() + std::chrono::duration<double>(g_timeout_s);
    while (rec.arrived != mask) {
        if (g_abort.load()) throw LaunchAbort();
        for (unsigned l = 0; l < 32; ++l) {
            if (!(mask & ~rec.arrived & (1u << l))) continue;
            const Lane& other = w.lanes[l];
            if (other.exited)
                fail("lane " + std::to_string(l) + " exited without reaching " + where +
                     " (lanes arrived: " + hex(rec.arrived) + ")");
            if (other.waiting >= 0) {
                const OpRecord& theirs = w.records[other.waiting];
                if ((theirs.mask & bit) && theirs.arrived != theirs.mask)
                    fail("deadlock: lane " + std::to_string(lane) + " waits at " + where +
                         " while lane " + std::to_string(l) + " waits for it at " +
                         kind_name(theirs.kind) + " (" + site_name(theirs.site) +
                         ", mask " + hex(theirs.mask) + ")");
            }
        }
        if (Clock::now() > deadline)
            fail("timeout: " + where + " waited " + std::to_string(g_timeout_s) +
                 " s for lanes " + hex(mask & ~rec.arrived));
        // Yield a little first: the lanes still missing are usually runnable, and a futex
        // sleep and wake cost far more than letting them run.
        lock.unlock();
        for (int k = 0; k < 32 && __atomic_load_n(&rec.arrived, __ATOMIC_ACQUIRE) != mask; ++k)
            sched_yield();
        lock.lock();
        if (rec.arrived == mask) break;
        ++w.sleepers;
        w.cv.wait_for(lock, kPoll);
        --w.sleepers;
    }
    unsigned long long result = 0;
    if (kind == BALLOT) {
        for (unsigned l = 0; l < 32; ++l)
            if ((mask >> l) & 1u) result |= (rec.values[l] & 1ULL) << l;
    } else {
        int j = source_lane(kind, (int)lane, b, width);
        if (!((mask >> j) & 1u))
            fail("lane " + std::to_string(lane) + " reads lane " + std::to_string(j) +
                 " outside the mask at " + where);
        result = rec.values[j];
    }
    me.waiting = -1;
    rec.departed |= bit;
    if (rec.departed == mask) rec.open = false;
    return result;
}

extern "C" void evdb_cuda_cpu_syncthreads(const void* site) {
    BlockState& b = g_block;
    std::unique_lock<std::mutex> lock(b.mu);
    if (b.arrived == 0) b.site = site;
    if (b.site != site)
        fail("divergent __syncthreads: thread " + std::to_string(linear_thread()) + " at " +
             site_name(site) + ", others at " + site_name(b.site));
    unsigned long gen = b.generation;
    if (++b.arrived == b.live) {
        b.arrived = 0;
        ++b.generation;
        b.cv.notify_all();
        return;
    }
    auto deadline = Clock::now() + std::chrono::duration<double>(g_timeout_s);
    while (b.generation == gen) {
        if (g_abort.load()) throw LaunchAbort();
        if (Clock::now() > deadline) fail("timeout at __syncthreads (" + site_name(site) + ")");
        b.cv.wait_for(lock, kPoll);
    }
}

// ---- the pool -----------------------------------------------------------------------------

namespace evdb_cuda_cpu {
namespace {

long futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
    return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

struct Pool;

struct Worker {
    Pool* pool;
    unsigned index;
    std::atomic<uint32_t> go{0};
};

struct Pool {
    std::vector<std::unique_ptr<Worker>> workers;
    std::atomic<uint32_t> remaining{0};
    void (*tramp)(const void*) = nullptr;
    const void* args = nullptr;
    uint3 block_idx{}, block_dim{}, grid_dim{};
};

void run_thread(Pool* pool, unsigned index) {
    coords.block_idx = pool->block_idx;
    coords.block_dim = pool->block_dim;
    coords.grid_dim = pool->grid_dim;
    const uint3& d = pool->block_dim;
    coords.thread_idx = uint3{index % d.x, (index / d.x) % d.y, index / (d.x * d.y)};
    try {
        pool->tramp(pool->args);
    } catch (const LaunchAbort&) {
    } catch (const std::exception& e) {
        try {
            fail(std::string("a CUDA thread threw: ") + e.what());
        } catch (const LaunchAbort&) {
        }
    }
    Warp& w = g_block.warps[index / 32];
    {
        std::lock_guard<std::mutex> lock(w.mu);
        w.lanes[index & 31].exited = true;
        w.cv.notify_all();
    }
    std::lock_guard<std::mutex> lock(g_block.mu);
    --g_block.live;
    if (g_block.arrived > 0 && g_block.arrived == g_block.live) {
        g_block.arrived = 0;
        ++g_block.generation;
        g_block.cv.notify_all();
    }
}

void* worker_main(void* arg) {
    Worker* self = static_cast<Worker*>(arg);
    uint32_t seen = 0;
    for (;;) {
        uint32_t now;
        while ((now = self->go.load(std::memory_order_acquire)) == seen)
            futex(&self->go, FUTEX_WAIT_PRIVATE, seen, nullptr);
        seen = now;
        Pool* pool = self->pool;
        run_thread(pool, self->index);
        if (pool->remaining.fetch_sub(1, std::memory_order_acq_rel) == 1)
            futex(&pool->remaining, FUTEX_WAKE_PRIVATE, 1, nullptr);
    }
    return nullptr;
}

Pool* g_pool = new Pool();  // replaced (the old one leaked) if its threads ever hang
std::mutex g_launch_mu;

// A forked child has none of the pool's threads: it starts a pool of its own.
const int g_atfork = pthread_atfork(nullptr, nullptr, [] { g_pool = new Pool(); });

bool grow(Pool* pool, unsigned n) {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 512 * 1024);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    bool ok = true;
    while (pool->workers.size() < n) {
        auto w = std::make_unique<Worker>();
        w->pool = pool;
        w->index = (unsigned)pool->workers.size();
        pthread_t th;
        if (pthread_create(&th, &attr, worker_main, w.get()) != 0) {
            ok = false;
            break;
        }
        pool->workers.push_back(std::move(w));
    }
    pthread_attr_destroy(&attr);
    return ok;
}

// Runs one block; false if its threads did not all finish (the pool is then abandoned).
bool run_block(Pool* pool, unsigned n, double timeout_s) {
    pool->remaining.store(n, std::memory_order_relaxed);
    for (unsigned i = 0; i < n; ++i) {
        Worker* w = pool->workers[i].get();
        w->go.fetch_add(1, std::memory_order_release);
        futex(&w->go, FUTEX_WAKE_PRIVATE, 1, nullptr);
    }
    // Past the warp ops' own timeout, a thread can only be stuck in the kernel's own code
    // (a spin loop); abort, give the others a moment, then give the pool up.
    auto abort_at = Clock::now() + std::chrono::duration<double>(2 * timeout_s + 1);
    auto give_up_at = abort_at + std::chrono::duration<double>(timeout_s + 1);
    uint32_t left;
    while ((left = pool->remaining.load(std::memory_order_acquire)) != 0) {
        auto now = Clock::now();
        if (now > give_up_at) return false;
        if (now > abort_at && !g_abort.load()) {
            std::lock_guard<std::mutex> lock(g_error_mu);
            g_error = "timeout: the block's threads did not finish in " +
                      std::to_string(2 * timeout_s + 1) + " s";
            g_abort.store(true);
        }
        timespec ts{0, 50 * 1000 * 1000};
        futex(&pool->remaining, FUTEX_WAIT_PRIVATE, left, &ts);
    }
    return true;
}

}  // namespace
}  // namespace evdb_cuda_cpu

// Runs grid x block CUDA threads of tramp(args), blocks in order; shared (shared_bytes) is
// the dynamic shared memory, poisoned (all bits set: NaN, -1) before each block. Returns 0,
// or 1 with a message in err.
extern "C" int evdb_cuda_cpu_launch(void (*tramp)(const void*), const void* args,
                                    const unsigned* grid, const unsigned* block, void* shared,
                                    unsigned long long shared_bytes, double timeout_s, char* err,
                                    unsigned long long err_len) {
    std::lock_guard<std::mutex> launch_lock(g_launch_mu);
    unsigned n = block[0] * block[1] * block[2];
    g_timeout_s = timeout_s;
    g_abort.store(false);
    g_error.clear();
    Pool* pool = g_pool;
    auto report = [&](const std::string& msg) {
        std::snprintf(err, err_len, "%s", msg.c_str());
        return 1;
    };
    if (!grow(pool, n)) return report("could not start " + std::to_string(n) + " threads");
    pool->tramp = tramp;
    pool->args = args;
    pool->block_dim = uint3{block[0], block[1], block[2]};
    pool->grid_dim = uint3{grid[0], grid[1], grid[2]};
    for (unsigned z = 0; z < grid[2]; ++z)
        for (unsigned y = 0; y < grid[1]; ++y)
            for (unsigned x = 0; x < grid[0]; ++x) {
                if (shared_bytes) std::memset(shared, 0xff, shared_bytes);
                g_block.reset(n);
                pool->block_idx = uint3{x, y, z};
                std::string at = "block (" + std::to_string(x) + ", " + std::to_string(y) +
                                 ", " + std::to_string(z) + "): ";
                if (!run_block(pool, n, timeout_s)) {
                    g_pool = new Pool();
                    return report(at + g_error +
                                  "; a thread never finished (a spin outside any warp op?): "
                                  "its pool is abandoned");
                }
                if (g_abort.load()) return report(at + g_error);
            }
    return 0;
}
