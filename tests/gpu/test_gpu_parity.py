"""Every kernel on backend("gpu") == the numpy reference, on fresh random inputs.

The parity table of tests/kernels (``cases.py``, every name in ``KERNELS``) is run again with
the gpu backend behind a host adapter: each numpy argument is copied to the device, the
kernel runs, and every array is copied back into the caller's numpy array, so in-place
outputs land where the case looks for them. The tests below cover what only a parallel
backend can get wrong: many threads inserting, removing and deduplicating the same keys.

They run the CUDA sources on a real device when cupy has one, at full size; otherwise on the
CPU executor (tests/cuda_cpu, see tests/gpu/conftest.py), where every CUDA thread is an OS
thread: there the table's cases sized for numba's parallel drivers (any size >= 10 000,
or ``size=large``) are skipped, and the tests below shrink (``device.size``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from evdb.kernels import HOST_ONLY_KERNELS, backend

from ..kernels.cases import CASES, Case, assert_same, empty_index, random_keys
from ..kernels.test_parity import (  # noqa: F401 (collected here, run on the gpu)
    test_remove_keeps_every_other_key_findable_under_heavy_clustering,
)
from .conftest import Device

SEED = 12345
CPU_SIZE_LIMIT = 10_000  # a case with a size parameter this big runs on a real device only


class HostAdapter:
    """The gpu backend with numpy arguments (see the module docstring)."""

    def __init__(self, module: Any) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Callable[..., Any]:
        import cupy as cp

        kernel = getattr(self._module, name)

        def call(*args: Any) -> Any:
            dev = [cp.asarray(a) if isinstance(a, np.ndarray) else a for a in args]
            result = kernel(*dev)
            for host, d in zip(args, dev, strict=True):
                if isinstance(host, np.ndarray):
                    host[...] = cp.asnumpy(d)
            return result

        return call


def _sizes(value: Any) -> list[int]:
    if isinstance(value, (tuple, list)):
        return [s for v in value for s in _sizes(v)]
    return [value] if isinstance(value, int) and not isinstance(value, bool) else []


def cpu_sized(case: Case) -> bool:
    """Whether the executor runs case: no size parameter of the parallel drivers' scale."""
    params = getattr(case.run, "keywords", {})
    if params.get("size") == "large":
        return False
    return all(s < CPU_SIZE_LIMIT for v in params.values() for s in _sizes(v))


@pytest.fixture
def kernels(gpu: Any) -> HostAdapter:
    return HostAdapter(gpu)


DEVICE_CASES = [c for c in CASES if not set(c.kernels) <= set(HOST_ONLY_KERNELS)]


@pytest.mark.parametrize("case", DEVICE_CASES, ids=str)
def test_backend_matches_reference(device: Device, kernels, reference, case: Case) -> None:
    if not device.real and not cpu_sized(case):
        pytest.skip("sized for numba's parallel driver: run on a real device only")
    want = case.run(reference, np.random.default_rng(SEED))
    got = case.run(kernels, np.random.default_rng(SEED))
    assert_same(got, want, case.rtol, case.atol)
    if case.also is not None:
        case.also(got, want)


def test_the_executor_runs_a_case_of_every_kernel() -> None:
    covered = {name for c in DEVICE_CASES if cpu_sized(c) for name in c.kernels}
    left_out = {name for c in DEVICE_CASES for name in c.kernels} - covered
    assert not left_out, f"no CPU-sized parity case for {sorted(left_out)}"


def test_concurrent_insert_keeps_the_last_occurrence(device, kernels, reference, rng) -> None:
    # Many inserts of few keys: every key is claimed by many threads at once.
    keys = random_keys(rng, device.size(1_000_000, 20_000), dup_from=device.size(1000, 100))
    rows = np.arange(keys.shape[0], dtype=np.int64)
    distinct = np.unique(keys)
    outs = []
    for mod in (reference, kernels):
        slots = empty_index(4096)
        mod.hash_insert(slots, keys, rows)
        found = np.empty(distinct.shape[0], np.int64)
        mod.hash_find(slots, distinct, found)
        outs.append((found, int(np.count_nonzero(slots[:, 1] >= 0))))
    np.testing.assert_array_equal(outs[1][0], outs[0][0])
    assert outs[1][1] == outs[0][1] == distinct.shape[0]


@pytest.mark.parametrize("load", [0.5, 0.9])
def test_big_remove_matches_reference_and_the_cpu_reads_the_result(
    device, kernels, reference, rng, load
) -> None:
    cpu = backend("cpu")
    cap = device.size(1 << 17, 1 << 12)
    keys = random_keys(rng, int(cap * load))[: int(cap * load)]
    rows = rng.permutation(keys.shape[0]).astype(np.int64)
    gone = rng.permutation(np.concatenate([keys[rng.random(keys.shape[0]) < 0.5], keys[:99]]))
    results = []
    for mod in (reference, kernels):
        slots = empty_index(cap)
        cpu.hash_insert(slots, keys, rows)  # same layout on both sides
        removed = np.empty(gone.shape[0], np.int64)
        mod.hash_remove(slots, gone, removed)
        after = np.empty(keys.shape[0], np.int64)
        cpu.hash_find(slots, keys, after)  # the gpu left no marks the cpu cannot read
        assert (slots[:, 1] >= -1).all()
        results.append((removed, after))
    for got, want in zip(results[1], results[0], strict=True):
        np.testing.assert_array_equal(got, want)


def test_gpu_built_index_reads_on_the_cpu(device, kernels, rng) -> None:
    cpu = backend("cpu")
    keys = random_keys(rng, device.size(300_000, 5_000))
    rows = np.arange(keys.shape[0], dtype=np.int64)
    slots = empty_index(device.size(1 << 19, 1 << 14))
    kernels.hash_insert(slots, keys, rows)
    found = np.empty(keys.shape[0], np.int64)
    cpu.hash_find(slots, keys, found)
    np.testing.assert_array_equal(found, rows)


def test_big_unique_matches_reference(device, kernels, reference, rng) -> None:
    keys = random_keys(rng, device.size(2_000_000, 20_000), dup_from=device.size(50_000, 2_000))
    outs = []
    for mod in (reference, kernels):
        n = keys.shape[0]
        u_out, inv, cnt = np.empty(n, np.int64), np.empty(n, np.int64), np.zeros(n, np.int64)
        scratch = empty_index(device.size(1 << 22, 1 << 16))
        u = mod.unique_inverse(keys, scratch, u_out, inv, cnt)
        assert (scratch[:, 1] == -1).all()
        outs.append((u, u_out[:u].copy(), inv, cnt[:u].copy()))
    for got, want in zip(outs[1], outs[0], strict=True):
        np.testing.assert_array_equal(got, want)


def test_host_arrays_are_refused(gpu) -> None:
    import cupy as cp

    from evdb.errors import InvalidTypeError

    with pytest.raises(InvalidTypeError, match="keys: expected a cupy array"):
        gpu.hash_find(cp.asarray(empty_index(16)), np.zeros(3, np.int64), cp.empty(3, np.int64))
