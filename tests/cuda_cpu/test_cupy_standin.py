"""The cupy stand-in behaves like cupy where evdb relies on it: device arrays compute like
numpy's, host and device arrays never mix implicitly, transfers are explicit and counted, and
the devices, their memory and pinned buffers answer as cupy's runtime does."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from evdb.errors import ConfigError, InvalidTypeError
from evdb.kernels import backend
from tests.cuda_cpu.adapter import numba_kernels


def test_it_is_installed_as_cupy_and_backend_gpu_accepts_it(standin_cupy) -> None:
    import cupy

    assert cupy is standin_cupy and sys.modules["cupy.cuda.runtime"] is cupy.cuda.runtime
    assert backend("gpu").require() is None  # one visible device: no ConfigError


def test_without_a_visible_device_backend_gpu_refuses(standin_cupy) -> None:
    standin_cupy.cuda.runtime.set_device_count(0)
    with pytest.raises(ConfigError, match="no CUDA device"):
        backend("gpu")


def test_device_arrays_compute_like_numpy(standin_cupy) -> None:
    cp = standin_cupy
    host = np.arange(12, dtype=np.int64).reshape(3, 4)
    d = cp.asarray(host)
    assert isinstance(d, cp.ndarray) and not isinstance(d, np.ndarray)
    assert d.shape == (3, 4) and d.dtype == np.int64 and d.ndim == 2 and d.size == 12
    np.testing.assert_array_equal(cp.asnumpy(d * 2 + 1), host * 2 + 1)
    np.testing.assert_array_equal((d[d > 5]).get(), host[host > 5])
    np.testing.assert_array_equal(d[cp.asarray([2, 0])].get(), host[[2, 0]])
    assert int(d.sum()) == 66 and isinstance(d.sum(), cp.ndarray)  # reductions stay on device
    d[1] = 0
    d[cp.asarray([0])] = d[2]
    host[1], host[0] = 0, host[2]
    np.testing.assert_array_equal(d.get(), host)
    np.testing.assert_array_equal(cp.flatnonzero(d.ravel() > 9).get(), np.flatnonzero(host > 9))
    np.testing.assert_array_equal(cp.cumsum(d[0]).get(), np.cumsum(host[0]))
    np.testing.assert_array_equal(np.concatenate([d, d]).get(), np.concatenate([host, host]))
    assert d[1:].flags.c_contiguous and not d[:, 1].flags.c_contiguous


@pytest.mark.parametrize(
    "mix",
    [
        lambda cp, d, h: np.asarray(d),
        lambda cp, d, h: d + h,
        lambda cp, d, h: h + d,
        lambda cp, d, h: h < d,
        lambda cp, d, h: d[h],
        lambda cp, d, h: d.__setitem__(slice(None), h),
        lambda cp, d, h: cp.take(d, h),
        lambda cp, d, h: cp.concatenate([d, h]),
        lambda cp, d, h: cp.count_nonzero(h),
        lambda cp, d, h: np.add(d, 1),
    ],
)
def test_host_and_device_arrays_do_not_mix(standin_cupy, mix) -> None:
    d = standin_cupy.arange(4, dtype=np.int64)
    h = np.arange(4, dtype=np.int64)
    with pytest.raises(TypeError):
        mix(standin_cupy, d, h)
    np.testing.assert_array_equal(d.get(), h)  # nothing was written


def test_transfers_are_explicit_and_counted(standin_cupy) -> None:
    cp = standin_cupy
    before = cp.transfers()
    d = cp.asarray(np.ones(5, np.float32))
    buf = np.frombuffer(cp.cuda.alloc_pinned_memory(20), np.float32, 5)
    d.get(out=buf)
    d.set(buf * 3)
    assert cp.ascontiguousarray(d) is d  # already on the device: no copy
    after = cp.transfers()
    assert after["to_device"] - before["to_device"] == 2
    assert after["to_host"] - before["to_host"] == 1
    np.testing.assert_array_equal(d.get(), np.full(5, 3, np.float32))
    assert cp.cuda.runtime.getDeviceCount() == 1


def test_devices_and_memory_answer_as_set(standin_cupy) -> None:
    cp = standin_cupy
    rt = cp.cuda.runtime
    rt.set_device_count(2)
    rt.set_mem_info(1000, 4000)
    assert rt.memGetInfo() == (1000, 4000)
    with cp.cuda.Device(1) as dev:
        assert dev.id == 1 and rt.getDevice() == 1
        assert cp.zeros(3).device.id == 1
    assert rt.getDevice() == 0
    with pytest.raises(rt.CUDARuntimeError, match="invalid device"), cp.cuda.Device(2):
        pass
    cp.cuda.get_current_stream().synchronize()


def test_dlpack_shares_memory_both_ways(standin_cupy) -> None:
    torch = pytest.importorskip("torch")
    cp = standin_cupy
    t = torch.arange(6, dtype=torch.float32)
    d = cp.from_dlpack(t)
    d[0] = 7.0
    assert t[0].item() == 7.0  # no copy
    back = torch.from_dlpack(d)
    back[1] = 9.0
    assert float(d[1]) == 9.0


def test_the_numba_adapter_refuses_host_arrays_and_writes_through(standin_cupy) -> None:
    cp = standin_cupy
    kernels = numba_kernels()
    slots = cp.empty((16, 2), dtype=np.int64)
    slots[:, 1] = -1
    keys = cp.asarray(np.array([3, 5], np.int64))
    kernels.hash_insert(slots, keys, cp.asarray(np.array([0, 1], np.int64)))
    out = cp.empty(2, dtype=np.int64)
    kernels.hash_find(slots, keys, out)
    assert out.get().tolist() == [0, 1]
    with pytest.raises(InvalidTypeError, match="hash_find: argument 1"):
        kernels.hash_find(slots, np.array([3], np.int64), out)
