"""The CPU executor of the CUDA sources (tests/cuda_cpu) and what it can catch.

First the executor itself, on small kernels of its own: CUDA's coordinates, atomics and warp
intrinsics against numpy models, cupy's argument checks, and the failures that must be loud
(a ballot some lanes skip, lanes at different warp ops, a cycle of waiting lanes, a read
past its mask). Then one mutation per kernel family of evdb's sources, each applied to the
source text and run through a parity case of tests/kernels/cases.py on the executor, which
must catch it: so a green parity run on the executor means something.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from evdb.kernels import backend
from evdb.kernels.gpu import runtime

from ..cuda_cpu import rawmodule
from ..cuda_cpu.rawmodule import CompileException, RawModule
from ..kernels.cases import CASES, assert_same
from .test_gpu_parity import HostAdapter

ROOT = Path(__file__).resolve().parents[2]
# Without g++ there is no executor: skipped, except under CI, which must have it.
pytestmark = pytest.mark.skipif(
    shutil.which(rawmodule.CXX) is None and os.environ.get("CI") != "true",
    reason=f"no {rawmodule.CXX} to build the CUDA sources for the CPU",
)


class Dev:
    """The least a device array is to the executor: ``_storage``, a C-contiguous array."""

    def __init__(self, a: np.ndarray) -> None:
        self._storage = np.ascontiguousarray(a)
        self.dtype = self._storage.dtype


PROBES = r"""
typedef long long i64;
typedef unsigned long long u64;

extern "C" __global__ void coords(i64* out) {
    i64 t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    i64 b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    out[b * blockDim.x * blockDim.y * blockDim.z + t] = b * 1000 + t;
}

extern "C" __global__ void atomics(int* count, i64* lo, i64* hi, double* sum, u64* bits,
                                   unsigned* cas_wins, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    atomicAdd(count, 1);
    atomicMin(lo, (i64)(i * 7919 % n) - 5);
    atomicMax(hi, (i64)(i * 7919 % n));
    atomicAdd(sum, 0.5);
    atomicOr(bits + (i % 2), 1ULL << (i % 64));
    if (atomicCAS(cas_wins, 0u, (unsigned)i + 1u) == 0u) atomicAdd(cas_wins + 1, 1u);
}

// kind 0..3: __shfl_sync, _xor, _down, _up of the lane id, with operand b and width w.
extern "C" __global__ void shuffles(int kind, int b, int w, long long* out) {
    long long lane = threadIdx.x & 31, v = lane * 10;
    long long r = kind == 0 ? __shfl_sync(0xffffffffu, v, b, w)
                : kind == 1 ? __shfl_xor_sync(0xffffffffu, v, b, w)
                : kind == 2 ? __shfl_down_sync(0xffffffffu, v, b, w)
                            : __shfl_up_sync(0xffffffffu, v, b, w);
    out[blockIdx.x * blockDim.x + threadIdx.x] = r;
}

extern "C" __global__ void ballot(const int* pred, unsigned* out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned v = __ballot_sync(0xffffffffu, pred[i]);
    out[i] = v;
    if ((threadIdx.x & 31) == 0) out[i] = (unsigned)__popc(v);
}

extern "C" __global__ void group_sum(const double* x, double* out) {
    // groups of 8 lanes: a xor butterfly within the group's mask
    int lane = threadIdx.x & 31, first = lane & ~7;
    unsigned mask = 0xffu << first;
    double v = x[blockIdx.x * blockDim.x + threadIdx.x];
    for (int o = 4; o > 0; o >>= 1) v += __shfl_xor_sync(mask, v, o, 8);
    out[blockIdx.x * blockDim.x + threadIdx.x] = v;
}

extern "C" __global__ void shared_poison(double* out) {
    extern __shared__ double buffer[];
    if (threadIdx.x == 0) buffer[1] = 2.5;
    __syncthreads();
    out[2 * blockIdx.x] = buffer[0];  // never written: the poison shows
    out[2 * blockIdx.x + 1] = buffer[1];
}

// Failures that must be loud: mode 0, a ballot in a branch lanes 5.. skip (they exit);
// 1, two halves of the warp at different ballots; 2, lanes 0-2 each waiting for the next
// at a shuffle whose mask leaves the waiter out (a cycle only a timeout ends); 3, a read
// of a lane outside the mask; 4, a mask naming a lane the block lacks.
extern "C" __global__ void misuse(int mode, unsigned* out) {
    unsigned lane = threadIdx.x & 31;
    if (mode == 0) {
        if (lane < 5) out[lane] = __ballot_sync(0xffffffffu, 1);
    } else if (mode == 1) {
        if (lane < 16) out[lane] = __ballot_sync(0xffffffffu, 1);
        else out[lane] = __ballot_sync(0xffffffffu, 0);
    } else if (mode == 2) {
        if (lane < 3) {
            unsigned mask = (1u << lane) | (1u << ((lane + 1) % 3));
            out[lane] = __shfl_sync(mask, lane, lane);
        }
    } else if (mode == 3) {
        out[lane] = __shfl_sync(0x0000ffffu | (lane < 16 ? 0u : 0xffff0000u), lane,
                                lane < 16 ? 20 : 3);
    } else {
        out[lane] = __ballot_sync(0xffffffffu, 1);
    }
}
"""


@pytest.fixture(scope="module")
def probes() -> RawModule:
    return RawModule(code=PROBES, options=("--std=c++17",))


def test_threads_see_their_coordinates_in_3d(probes: RawModule) -> None:
    out = Dev(np.full(2 * 3 * 4 * 5 * 2 * 3, -1, np.int64))
    probes.get_function("coords")((5, 2, 3), (4, 2, 3), (out,))
    per_block = 4 * 2 * 3
    b, t = np.divmod(np.arange(out._storage.size), per_block)
    np.testing.assert_array_equal(out._storage, b * 1000 + t)


def test_atomics_give_the_sequential_answer(probes: RawModule) -> None:
    n = 3000
    count, lo, hi = Dev(np.zeros(1, np.int32)), Dev(np.full(1, 10**9)), Dev(np.full(1, -(10**9)))
    total, bits, cas = Dev(np.zeros(1)), Dev(np.zeros(2, np.uint64)), Dev(np.zeros(2, np.uint32))
    args = (count, lo, hi, total, bits, cas, np.int32(n))
    probes.get_function("atomics")(((n + 255) // 256,), (256,), args)
    perm = np.arange(n) * 7919 % n
    assert count._storage[0] == n
    assert lo._storage[0] == perm.min() - 5 and hi._storage[0] == perm.max()
    assert total._storage[0] == 0.5 * n
    want = [np.bitwise_or.reduce(np.uint64(1) << (np.arange(k, n, 2) % 64).astype(np.uint64))
            for k in (0, 1)]  # fmt: skip
    np.testing.assert_array_equal(bits._storage, want)
    assert cas._storage[1] == 1 and 1 <= cas._storage[0] <= n  # one thread won the CAS


def ptx_shuffle(kind: int, lane: int, b: int, width: int) -> int:
    """The lane a shuffle reads, as PTX's shfl.sync defines it (own lane when out of range)."""
    seg = 32 - width
    max_lane = (lane & seg) | ((0 if kind == 3 else 31) & ~seg)
    j = [(lane & seg) | (b & ~seg & 31), lane ^ b, lane + b, lane - b][kind]
    ok = j >= max_lane if kind == 3 else j <= max_lane
    return j if ok else lane


@pytest.mark.parametrize("kind", [0, 1, 2, 3])
@pytest.mark.parametrize("b,width", [(0, 32), (5, 32), (3, 8), (1, 4), (7, 16), (13, 2)])
def test_shuffles_read_the_lane_ptx_defines(
    probes: RawModule, kind: int, b: int, width: int
) -> None:
    out = Dev(np.full(64, -1, np.int64))
    probes.get_function("shuffles")(
        (1,), (64,), (np.int32(kind), np.int32(b), np.int32(width), out)
    )
    want = [10 * ptx_shuffle(kind, t % 32, b, width) for t in range(64)]
    np.testing.assert_array_equal(out._storage, want)


def test_ballot_and_popc(probes: RawModule, rng: np.random.Generator) -> None:
    pred = rng.integers(0, 2, 96).astype(np.int32)
    out = Dev(np.zeros(96, np.uint32))
    probes.get_function("ballot")((1,), (96,), (Dev(pred), out))
    for w in range(3):
        bits = pred[32 * w : 32 * w + 32]
        word = sum(1 << i for i in range(32) if bits[i])
        assert out._storage[32 * w] == bits.sum()
        assert (out._storage[32 * w + 1 : 32 * w + 32] == word).all()


def test_group_shuffles_stay_within_their_group(
    probes: RawModule, rng: np.random.Generator
) -> None:
    x = rng.standard_normal(128)
    out = Dev(np.zeros(128))
    probes.get_function("group_sum")((2,), (64,), (Dev(x), out))
    np.testing.assert_allclose(out._storage, np.repeat(x.reshape(-1, 8).sum(1), 8), rtol=1e-12)


def test_dynamic_shared_memory_starts_poisoned_in_every_block(probes: RawModule) -> None:
    out = Dev(np.zeros(6))
    probes.get_function("shared_poison")((3,), (32,), (out,), shared_mem=16)
    assert np.isnan(out._storage[0::2]).all()
    assert (out._storage[1::2] == 2.5).all()


@pytest.mark.parametrize(
    "mode,block,message",
    [
        (0, 32, r"lane \d+ exited without reaching __ballot_sync"),
        (1, 32, "divergent warp op"),
        (2, 32, "timeout"),
        (3, 32, "outside the mask"),
        (4, 20, "that the block does not have"),
    ],
)
def test_warp_misuse_fails_the_launch_instead_of_hanging(
    probes: RawModule, monkeypatch: pytest.MonkeyPatch, mode: int, block: int, message: str
) -> None:
    monkeypatch.setattr(rawmodule, "TIMEOUT_S", 0.5)
    out = Dev(np.zeros(32, np.uint32))
    with pytest.raises(RuntimeError, match=message):
        probes.get_function("misuse")((1,), (block,), (np.int32(mode), out))
    # the pool survives a failed launch
    ok = Dev(np.zeros(32, np.uint32))
    probes.get_function("ballot")((1,), (32,), (Dev(np.ones(32, np.int32)), ok))
    assert ok._storage[0] == 32


def test_a_forked_child_launches_on_a_pool_of_its_own(probes: RawModule) -> None:
    kernel = probes.get_function("coords")
    kernel((1,), (32,), (Dev(np.zeros(32, np.int64)),))  # the parent's pool has its threads
    pid = os.fork()
    if pid == 0:  # the child: none of those threads
        code = 3
        try:
            out = Dev(np.zeros(64, np.int64))
            kernel((2,), (32,), (out,))
            code = (
                0 if (out._storage == np.arange(64) // 32 * 1000 + np.arange(64) % 32).all() else 2
            )
        finally:
            os._exit(code)
    deadline = time.monotonic() + 60  # bounded: a child stuck on dead threads is killed
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child's launch hung")
    assert os.waitstatus_to_exitcode(done[1]) == 0


def test_arguments_are_checked_against_the_c_signature(probes: RawModule) -> None:
    kernel = probes.get_function("shuffles")
    out = Dev(np.zeros(32, np.int64))
    i = np.int32(0)
    with pytest.raises(TypeError, match=r"Unsupported type <class 'numpy\.ndarray'>"):
        kernel((1,), (32,), (i, i, np.int32(32), np.zeros(32, np.int64)))
    with pytest.raises(TypeError, match=r"argument 3 \(out, long long\*\).*got int32"):
        kernel((1,), (32,), (i, i, np.int32(32), Dev(np.zeros(32, np.int32))))
    with pytest.raises(TypeError, match=r"argument 0 \(kind, int\).*got int64"):
        kernel((1,), (32,), (np.int64(0), i, np.int32(32), out))
    with pytest.raises(TypeError, match=r"argument 1 \(b, int\).*got int"):
        kernel((1,), (32,), (i, 0, np.int32(32), out))
    with pytest.raises(TypeError, match="takes 4 arguments"):
        kernel((1,), (32,), (i, i, out))
    with pytest.raises(ValueError, match="more than 1024 threads"):
        kernel((1,), (1025,), (i, i, np.int32(32), out))
    assert (out._storage == 0).all()  # nothing ran


def test_what_nvrtc_rejects_g_plus_plus_rejects() -> None:
    # No atomicCAS on a signed 64-bit pointer in CUDA: so none here either.
    code = PROBES.replace("atomicCAS(cas_wins, 0u,", "atomicCAS((i64*)lo, 0LL,").replace(
        "(unsigned)i + 1u) == 0u", "(i64)i) == 0LL"
    )
    with pytest.raises(CompileException, match="atomicCAS"):
        RawModule(code=code)


def test_processes_building_one_source_at_once_share_one_library(tmp_path) -> None:
    # pytest processes in parallel build into one cache: each writes a temporary file and
    # renames it, so both load a whole library and one file is left.
    code = PROBES + f"\n// {tmp_path.name}\n"  # a source no cache has seen
    script = (
        "import sys, numpy as np\n"
        "from tests.cuda_cpu.rawmodule import RawModule\n"
        "from tests.gpu.test_cuda_cpu import Dev\n"
        "out = Dev(np.zeros(32, np.int64))\n"
        "RawModule(code=sys.stdin.read()).get_function('coords')((1,), (32,), (out,))\n"
        "assert (out._storage == np.arange(32)).all()\n"
    )
    env = {**os.environ, "EVDB_CUDA_CPU_CACHE": str(tmp_path / "cache")}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script], stdin=subprocess.PIPE, env=env, cwd=ROOT, text=True
        )
        for _ in range(2)
    ]
    for p in procs:
        p.stdin.write(code)  # type: ignore[union-attr]
        p.stdin.close()  # type: ignore[union-attr]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    built = sorted(f.name.split("-")[0] for f in (tmp_path / "cache").iterdir())
    assert built == ["module", "runtime"]


def test_a_missing_kernel_is_an_attribute_error(probes: RawModule) -> None:
    with pytest.raises(AttributeError, match="no_such_kernel"):
        probes.get_function("no_such_kernel")


# ---- mutations of evdb's sources, each caught by a parity case on the executor ------------

CASE_BY_ID = {str(c): c for c in CASES}

# (name, source, the text replaced, its replacement, parity case, what catches it)
MUTATIONS = [
    (
        "atomicMin -> atomicMax: the last duplicate wins the dedup",  # a wrong atomic
        "index",
        "if (old != -1) atomicMin(mark + r, (int)i);",
        "if (old != -1) atomicMax(mark + r, (int)i);",
        "unique_rows[n_pool=(5000, 300)]",
        AssertionError,
    ),
    (
        "atomicMin -> a plain store: a repeated key's later mark wins the remove",
        "index",
        "atomicMin(slots + 2 * slot_of[i] + 1, EVDB_I64_MIN + i);",
        "slots[2 * slot_of[i] + 1] = EVDB_I64_MIN + i;",
        "insert_find_remove[n=700]",
        AssertionError,
    ),
    (
        "a group broadcast without its width reads lanes of another group",  # wrong index
        "bags",  # (common.cuh, pasted into every source)
        "return __shfl_sync(g.mask, v, src, g.size);",
        "return __shfl_sync(g.mask, v, src);",
        "probe_gather_combine[combiner=1,max_norm=0.5,weighted=True,init_kind=2,n_bags=300]",
        RuntimeError,
    ),
    (
        "a group sum that starts its butterfly at the wrong offset",  # wrong index
        "bags",
        "for (int o = g.size >> 1; o > 0; o >>= 1)",
        "for (int o = g.size >> 2; o > 0; o >>= 1)",
        "probe_gather_combine[combiner=2,max_norm=0.5,weighted=True,init_kind=0,n_bags=300]",
        RuntimeError,  # lanes disagree on a bag's divisor, so on the loop's trip count
    ),
    (
        "a ballot in a branch that lanes without a hit skip",  # missing barrier
        "stamp",
        "unsigned hits = __ballot_sync(EVDB_FULL_MASK, hit);",
        "unsigned hits = hit ? __ballot_sync(EVDB_FULL_MASK, hit) : 0u;",
        "stamp_gather_pulled[n_rows_u_dim=(50, 40, 5)]",
        RuntimeError,
    ),
    (
        "shared memory read before it is written (the new value's copy dropped)",
        "optim",
        "        w[c] = v[c];\n",
        "",
        "segment_sum_apply[kind=2,per_position=True,size=small]",
        AssertionError,
    ),
    (
        "each element hashes the key of its column, not of its row",  # wrong index
        "init",
        "double u = evdb_uniform01(evdb_salt(seed, 0), (u64)keys[i], c);",
        "double u = evdb_uniform01(evdb_salt(seed, 0), (u64)keys[c], c);",
        "fill_uniform[n_dim=(5000, 32)]",
        AssertionError,
    ),
    (
        "b's rows placed without subtracting the keys they replace",  # wrong index
        "merge",
        "m = i + k - (k > 0 ? dups[k - 1] : 0);",
        "m = i + k;",
        "merge_newest[na_nb_pool=(50, 40, 60)]",
        AssertionError,
    ),
    (
        "the pinned test reads the protected column",  # wrong index
        "evict",
        "return !is_pinned[r] || last_step[r] < min_live_step;",
        "return !is_protected[r] || last_step[r] < min_live_step;",
        "victim_candidates[h=5000,lfu=True,min_live=100]",
        AssertionError,
    ),
]


@pytest.fixture
def executor(standin_cupy: Any) -> Iterator[Any]:
    """backend("gpu") on the executor; the compiled-module memo cleared after a mutation."""
    yield backend("gpu")
    runtime._module.cache_clear()
    runtime._function.cache_clear()


@pytest.mark.parametrize(
    "name,source,old,new,case_id,caught_as", MUTATIONS, ids=[m[0] for m in MUTATIONS]
)
def test_a_mutated_source_fails_its_parity_case(
    executor: Any,
    reference: Any,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    source: str,
    old: str,
    new: str,
    case_id: str,
    caught_as: type[Exception],
) -> None:
    case = CASE_BY_ID[case_id]
    original = runtime.source_text
    assert old in original(source), f"the mutation's anchor is gone from {source}: {old!r}"
    kernels = HostAdapter(executor)
    want = case.run(reference, np.random.default_rng(12345))
    # the unmutated source passes the case, so the failure below is the mutation's
    assert_same(case.run(kernels, np.random.default_rng(12345)), want, case.rtol, case.atol)
    monkeypatch.setattr(runtime, "source_text", lambda s: original(s).replace(old, new, 1))
    runtime._module.cache_clear()
    runtime._function.cache_clear()
    with pytest.raises(caught_as):
        got = case.run(kernels, np.random.default_rng(12345))
        assert_same(got, want, case.rtol, case.atol)
        if case.also is not None:
            case.also(got, want)
