"""Every kernel on backend("gpu") == the numpy reference, on fresh random inputs.

The parity table of tests/kernels (``cases.py``, every name in ``KERNELS``) is run again with
``kernels`` bound to the gpu backend behind a host adapter: each numpy argument is copied to
the device, the kernel runs, and every array is copied back into the caller's numpy array, so
in-place outputs land where the case looks for them. The tests below cover what only a
parallel backend can get wrong: many threads inserting, removing and deduplicating the same
keys at once. All skip without cupy and a CUDA device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from evdb.errors import ConfigError
from evdb.kernels import backend

from ..kernels.cases import empty_index, random_keys
from ..kernels.test_parity import (  # noqa: F401 (collected here, run on the gpu)
    test_backend_matches_reference,
    test_remove_keeps_every_other_key_findable_under_heavy_clustering,
)

pytestmark = pytest.mark.gpu


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


@pytest.fixture
def gpu() -> Any:
    try:
        return backend("gpu")
    except ConfigError as exc:  # cupy installed, but no usable device
        pytest.skip(str(exc))


@pytest.fixture
def kernels(gpu: Any) -> HostAdapter:
    return HostAdapter(gpu)


def test_concurrent_insert_keeps_the_last_occurrence(kernels, reference, rng) -> None:
    # A million inserts of 1000 keys: every key is claimed by hundreds of threads at once.
    keys = random_keys(rng, 1_000_000, dup_from=1000)
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
    kernels, reference, rng, load
) -> None:
    cpu = backend("cpu")
    cap = 1 << 17
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


def test_gpu_built_index_reads_on_the_cpu(kernels, rng) -> None:
    cpu = backend("cpu")
    keys = random_keys(rng, 300_000)
    rows = np.arange(keys.shape[0], dtype=np.int64)
    slots = empty_index(1 << 19)
    kernels.hash_insert(slots, keys, rows)
    found = np.empty(keys.shape[0], np.int64)
    cpu.hash_find(slots, keys, found)
    np.testing.assert_array_equal(found, rows)


def test_big_unique_matches_reference(kernels, reference, rng) -> None:
    keys = random_keys(rng, 2_000_000, dup_from=50_000)
    outs = []
    for mod in (reference, kernels):
        n = keys.shape[0]
        u_out, inv, cnt = np.empty(n, np.int64), np.empty(n, np.int64), np.zeros(n, np.int64)
        scratch = empty_index(1 << 22)
        u = mod.unique_inverse(keys, scratch, u_out, inv, cnt)
        assert (scratch[:, 1] == -1).all()
        outs.append((u, u_out[:u].copy(), inv, cnt[:u].copy()))
    for got, want in zip(outs[1], outs[0], strict=True):
        np.testing.assert_array_equal(got, want)


def test_host_arrays_are_refused(gpu) -> None:
    from evdb.errors import InvalidTypeError

    with pytest.raises(InvalidTypeError, match="keys: expected a cupy array"):
        import cupy as cp

        gpu.hash_find(cp.asarray(empty_index(16)), np.zeros(3, np.int64), cp.empty(3, np.int64))
