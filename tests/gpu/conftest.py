"""Where the gpu tests run: on a real cupy + CUDA device at full size when there is one, else
through the CPU executor (tests/cuda_cpu: the cupy stand-in, whose RawModule builds the
unmodified CUDA sources with g++) at CPU sizes. Either way ``backend("gpu")`` runs the CUDA
sources; only the sizes differ (``Device.size``)."""

from __future__ import annotations

import importlib.util
import os
import shutil
from dataclasses import dataclass
from typing import Any

import pytest

from evdb.kernels import backend


def _real_device() -> bool:
    if importlib.util.find_spec("cupy") is None:
        return False
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount()) > 0
    except Exception:  # a cupy without its CUDA runtime, or no driver
        return False


ON_DEVICE = _real_device()


@dataclass(frozen=True)
class Device:
    """The device of a test: a real GPU, or the CPU executor."""

    real: bool

    def size(self, full: int, cpu: int) -> int:
        """full on a GPU, cpu on the executor (its threads are OS threads)."""
        return full if self.real else cpu


@pytest.fixture
def device(request: pytest.FixtureRequest) -> Device:
    if ON_DEVICE:
        return Device(real=True)
    from ..cuda_cpu.rawmodule import CXX

    if shutil.which(CXX) is None:
        reason = f"no GPU, and no {CXX} to run the CUDA sources on the CPU"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    request.getfixturevalue("standin_cupy")  # cupy -> the stand-in, undone after the test
    return Device(real=False)


@pytest.fixture
def gpu(device: Device) -> Any:
    """backend("gpu"): its kernels on the real device or on the executor."""
    return backend("gpu")
