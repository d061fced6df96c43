"""Every kernel x every accelerated backend == the numpy reference, from one table of cases.

The table is ``tests/kernels/cases.py``; ``tests/gpu/test_gpu_parity.py`` runs it again on the
gpu backend. The tests after it check what the table cannot: that every backend exports every
kernel, that the table covers them all, and properties of one backend (the cpu's serial and
parallel variants; many removals from one crowded index).
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from evdb.kernels import BACKENDS, DEVICE_BACKENDS, HOST_ONLY_KERNELS, KERNELS

from .cases import CASES, Case, assert_same, empty_index, random_keys

SEED = 12345


@pytest.mark.parametrize("case", CASES, ids=str)
def test_backend_matches_reference(kernels, reference, case: Case) -> None:
    want = case.run(reference, np.random.default_rng(SEED))
    got = case.run(kernels, np.random.default_rng(SEED))
    assert_same(got, want, case.rtol, case.atol)
    if case.also is not None:
        case.also(got, want)


def test_every_kernel_has_a_case() -> None:
    covered = {name for c in CASES for name in c.kernels}
    assert not set(KERNELS) - covered, f"no parity case for {sorted(set(KERNELS) - covered)}"
    assert not covered - set(KERNELS), f"cases of unregistered kernels: {covered - set(KERNELS)}"


@pytest.mark.parametrize("name", BACKENDS + DEVICE_BACKENDS)
def test_every_backend_exports_every_kernel(name: str) -> None:
    # The modules themselves: backend("gpu") needs a device, the module imports without one.
    module = importlib.import_module(f"evdb.kernels.{name}")
    owed = [k for k in KERNELS if name in BACKENDS or k not in HOST_ONLY_KERNELS]
    missing = [k for k in owed if not callable(getattr(module, k, None))]
    assert not missing, f"{name} lacks {missing}"
    unexported = [k for k in owed if k not in module.__all__]
    assert not unexported, f"{name}.__all__ lacks {unexported}"


def test_remove_keeps_every_other_key_findable_under_heavy_clustering(kernels, rng) -> None:
    # A nearly full tiny index makes long probe runs that wrap around the end: the backward
    # shift must never strand a key behind a hole.
    slots = empty_index(64)
    keys = random_keys(rng, 60)[:60]
    kernels.hash_insert(slots, keys, np.arange(60, dtype=np.int64))
    alive = dict(zip(keys.tolist(), range(60), strict=True))
    for key in rng.permutation(keys)[:50]:
        out = np.empty(1, dtype=np.int64)
        kernels.hash_remove(slots, np.array([key]), out)
        assert out[0] == alive.pop(int(key))
        found = np.empty(60, dtype=np.int64)
        kernels.hash_find(slots, keys, found)
        expected = [alive.get(k, -1) for k in keys.tolist()]
        assert found.tolist() == expected


VARIANTS = [
    ("index", "hash_find"),
    ("index", "probe_gather"),
    ("init", "fill_uniform"),
    ("init", "fill_normal"),
    ("bags", "probe_gather_combine"),
    ("bags", "gather_combine"),
    ("optim", "segment_sum_apply"),
    ("stamp", "stamp_gather"),
]


@pytest.mark.parametrize("module,name", VARIANTS)
def test_serial_and_parallel_variants_are_distinct_functions(module, name) -> None:
    # numba's on-disk cache keys entries by function name and first line: two dispatchers over
    # one Python function share an entry, and the parallel one silently ran the serial build.
    mod = importlib.import_module(f"evdb.kernels.cpu.{module}")
    serial = getattr(mod, f"_{name}_serial")
    parallel = getattr(mod, f"_{name}_parallel")
    a, b = serial.py_func.__code__, parallel.py_func.__code__
    assert (a.co_name, a.co_firstlineno) != (b.co_name, b.co_firstlineno)
    assert parallel.targetoptions.get("parallel") and not serial.targetoptions.get("parallel")


@pytest.mark.parametrize("name", ["fill_uniform", "fill_normal"])
def test_fill_is_bit_identical_in_serial_and_parallel(rng, name) -> None:
    # Lookups of a few keys and pulls of many must give a key the same start row.
    from evdb.kernels.cpu import init

    keys = random_keys(rng, 5000)
    outs = []
    for variant in ("serial", "parallel"):
        out = np.empty((keys.shape[0], 33), np.float32)
        args = (-1.0, 2.0) if name == "fill_uniform" else (0.5, 2.0, True)
        getattr(init, f"_{name}_{variant}")(keys, np.uint64(9), *args, out)
        outs.append(out)
    np.testing.assert_array_equal(outs[0], outs[1])
