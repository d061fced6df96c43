"""Shared fixtures: the kernel backends, a fresh database, and the markers of DESIGN's suite."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

import evdb
from evdb.kernels import BACKENDS, backend

HAS_GPU = importlib.util.find_spec("cupy") is not None

# The default profile keeps the suite within minutes on 2 cores; HYPOTHESIS_PROFILE=thorough
# runs ten times the examples (for local soaks before touching the table's state logic).
settings.register_profile(
    "default",
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "thorough",
    max_examples=600,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_gpu = pytest.mark.skip(reason="no CUDA GPU (cupy) on this machine")
    skip_stress = pytest.mark.skip(reason="stress test: run with -m stress")
    selected = config.getoption("-m") or ""
    for item in items:
        # The markers, not item.keywords: keywords include folder names, so every test under
        # tests/gpu (the nvcc checks, which need no GPU, too) would count as a gpu test.
        if item.get_closest_marker("gpu") is not None and not HAS_GPU:
            item.add_marker(skip_gpu)
        if item.get_closest_marker("stress") is not None and "stress" not in selected:
            item.add_marker(skip_stress)


@pytest.fixture(params=[b for b in BACKENDS if b != "reference"])
def kernels(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """Each accelerated backend, compared against ``reference`` by the parity tests."""
    return backend(request.param)


@pytest.fixture
def reference():  # type: ignore[no-untyped-def]
    return backend("reference")


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(12345)


@pytest.fixture
def db(tmp_path: Path) -> Iterator[evdb.Database]:
    with evdb.open(tmp_path / "db") as database:
        yield database


REAL_CUPY = os.environ.get("EVDB_REAL_CUPY") == "1"  # bench/gpu_check.sh, on a lent GPU


@pytest.fixture
def standin_cupy(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """The CPU stand-in installed as ``cupy`` (tests/cuda_cpu): ``backend("gpu")`` then runs
    the CUDA sources on the CPU; one device, its state and counters fresh; undone after.
    With ``EVDB_REAL_CUPY=1`` it is the real cupy instead (skipped where none works), so the
    same device=0 tests run on a GPU; tests of the stand-in's own controls then skip."""
    from evdb.kernels.gpu import runtime

    runtime._module.cache_clear()  # compiled modules are memoised by device id
    runtime._function.cache_clear()
    if REAL_CUPY:
        try:
            real = runtime.cupy_module()
        except evdb.ConfigError as exc:
            pytest.skip(f"EVDB_REAL_CUPY=1 but {exc}")
        yield real
        return
    from tests.cuda_cpu import cupy_standin
    from tests.cuda_cpu.cupy_standin import _state

    _state.reset()
    monkeypatch.setitem(sys.modules, "cupy", cupy_standin)
    monkeypatch.setitem(sys.modules, "cupy.cuda", cupy_standin.cuda)
    monkeypatch.setitem(sys.modules, "cupy.cuda.runtime", cupy_standin.cuda.runtime)
    yield cupy_standin
    runtime._module.cache_clear()
    runtime._function.cache_clear()
    _state.reset()
