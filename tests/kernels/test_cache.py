"""The kernel cache guard: numba's cached kernels are dropped when any kernel module changes,
the inlined helpers included, and kept otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from evdb.kernels.cpu._cache import drop_stale


def _cached(sources: Path) -> set[str]:
    return {p.name for p in (sources / "__pycache__").iterdir()}


def test_an_edit_to_any_kernel_module_drops_the_cached_kernels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    (tmp_path / "index.py").write_text("def probe(): ...\n")
    (tmp_path / "_common.py").write_text("def mix64(): ...\n")
    cache = tmp_path / "__pycache__"
    cache.mkdir()
    kernel = ["index.probe-10.py311.nbi", "index.probe-10.py311.1.nbc"]
    for name in [*kernel, "index.cpython-311.pyc"]:
        (cache / name).write_bytes(b"x")
    assert drop_stale(tmp_path)  # no stamp yet: whatever is cached is of unknown sources
    assert _cached(tmp_path) == {"index.cpython-311.pyc", "evdb-kernels.sha256"}
    for name in kernel:
        (cache / name).write_bytes(b"x")  # numba caches them again
    assert not drop_stale(tmp_path)  # the same sources: kept
    assert set(kernel) <= _cached(tmp_path)
    (tmp_path / "_common.py").write_text("def mix64(): return 1\n")  # an inlined helper
    assert drop_stale(tmp_path)
    assert not set(kernel) & _cached(tmp_path)
    (tmp_path / "init.py").write_text("")  # a new module changes the digest too
    assert drop_stale(tmp_path)


def test_a_cache_numba_keeps_elsewhere_is_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "index.py").write_text("")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "index.probe-1.py311.nbi").write_bytes(b"x")
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert not drop_stale(tmp_path)
    assert _cached(tmp_path) == {"index.probe-1.py311.nbi"}
