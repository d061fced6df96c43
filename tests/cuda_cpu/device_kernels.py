"""The kernel choice of the device=0 tests: ``cuda`` (``backend("gpu")``, the CUDA sources:
on the stand-in run on the CPU by ``rawmodule``, with EVDB_REAL_CUPY=1 on a GPU), and only
when asked (``EVDB_DEVICE_KERNELS=cuda,numba``) ``numba``, the cpu kernels behind stand-in
device arrays (``adapter``): a fast mode that tells a tier bug from a kernel bug."""

from __future__ import annotations

import os
from typing import Any

import pytest

__all__ = ["KERNEL_SETS", "require_standin", "use_kernels"]

KERNEL_SETS = os.environ.get("EVDB_DEVICE_KERNELS", "cuda").split(",")


def require_standin(cupy: Any) -> None:
    """Skip unless cupy is the stand-in (a test of its own controls or counters)."""
    if not getattr(cupy, "STANDIN", False):
        pytest.skip("needs the cupy stand-in's controls (EVDB_REAL_CUPY=1 runs a real cupy)")


def use_kernels(which: str, cupy: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the HBM tier on a device use the kernel set ``which``."""
    if which == "numba":
        require_standin(cupy)
        from tests.cuda_cpu.adapter import numba_kernels

        monkeypatch.setattr("evdb.tiers.hbm.device_kernels", numba_kernels)
    elif getattr(cupy, "STANDIN", False):
        pytest.importorskip("tests.cuda_cpu.rawmodule", reason="the CPU executor is missing")
