"""The kernel cache guard: the kernels cache under a directory named by the digest of every
kernel module, the inlined helpers included, so other sources never load them; idle
directories of other digests and numba's flat cache files are removed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from evdb.kernels.cpu import _cache
from evdb.kernels.cpu._cache import STALE_AFTER_S, DigestLocator, cache_dir, drop_stale


def _sources(tmp_path: Path) -> Path:
    (tmp_path / "index.py").write_text("def probe(): ...\n")
    (tmp_path / "_common.py").write_text("def mix64(): ...\n")
    (tmp_path / "__pycache__").mkdir()
    return tmp_path


def test_an_edit_to_any_kernel_module_moves_the_cache_to_another_directory(
    tmp_path: Path,
) -> None:
    sources = _sources(tmp_path)
    before = cache_dir(sources)
    assert before.parent == sources / "__pycache__" and before.name.startswith("evdb-")
    assert cache_dir(sources) == before  # the same sources: the same directory
    (sources / "_common.py").write_text("def mix64(): return 1\n")  # an inlined helper
    edited = cache_dir(sources)
    assert edited != before
    (sources / "init.py").write_text("")  # a new module changes the digest too
    assert cache_dir(sources) not in (before, edited)


def test_idle_directories_of_other_digests_and_flat_files_are_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    sources = _sources(tmp_path)
    cache = sources / "__pycache__"
    current = cache_dir(sources)
    recent, idle = cache / "evdb-0000000000000001", cache / "evdb-0000000000000002"
    for d in (current, recent, idle):
        d.mkdir()
        (d / "index.probe-1.py311.nbi").write_bytes(b"x")
    flat, stamp = cache / "index.probe-10.py311.nbi", cache / "evdb-kernels.sha256"
    flat.write_bytes(b"x")
    stamp.write_text("0" * 64)
    (cache / "index.cpython-311.pyc").write_bytes(b"x")
    now = 1e9
    for p in [*idle.iterdir(), idle]:
        os.utime(p, (now - STALE_AFTER_S - 1,) * 2)
    for p in [*recent.iterdir(), recent, *current.iterdir(), current]:
        os.utime(p, (now - STALE_AFTER_S - 1,) * 2)
    os.utime(recent / "index.probe-1.py311.nbi", (now - 5,) * 2)  # an old process still writes

    removed = drop_stale(sources, now=now)
    assert set(removed) == {flat, stamp, idle}
    assert {p.name for p in cache.iterdir()} == {current.name, recent.name, "index.cpython-311.pyc"}


def test_a_cache_numba_keeps_elsewhere_is_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sources = _sources(tmp_path)
    (sources / "__pycache__" / "index.probe-1.py311.nbi").write_bytes(b"x")
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert drop_stale(sources) == []
    assert {p.name for p in (sources / "__pycache__").iterdir()} == {"index.probe-1.py311.nbi"}


def test_the_kernels_cache_under_their_digest_and_other_modules_under_numbas_own() -> None:
    from numba.core import config

    assert config.CACHE_LOCATOR_CLASSES.split(",")[:2] == [
        "UserProvidedCacheLocator",
        "evdb.kernels.cpu._cache.DigestLocator",
    ]
    kernels = Path(_cache.__file__).parent
    from evdb.kernels.cpu import index

    func = next(f for f in vars(index).values() if hasattr(f, "py_func"))
    located = DigestLocator.from_function(func.py_func, str(kernels / "index.py"))
    if located is None:
        pytest.skip("the kernel directory cannot be written here")
    assert Path(located.get_cache_path()) == cache_dir(kernels)
    import evdb.sizing_kernels as elsewhere

    assert DigestLocator.from_function(len, elsewhere.__file__) is None


def test_a_kernel_cached_by_another_process_is_found_under_the_digest(tmp_path: Path) -> None:
    # a fresh interpreter compiles (or loads) a kernel; its files are in the digest's directory
    env = dict(os.environ)
    env.pop("NUMBA_CACHE_DIR", None)
    env.pop("NUMBA_DISABLE_JIT", None)
    code = (
        "import evdb.kernels.cpu.index as m; "
        "k = min((f for f in vars(m).values() if getattr(f, 'declared', ())), "
        "key=lambda f: f.py_func.__name__); k.compile_declared(); print(k.py_func.__name__)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    name = done.stdout.strip()
    kernels = Path(_cache.__file__).parent
    if not os.access(kernels / "__pycache__", os.W_OK):
        pytest.skip("the kernel directory cannot be written here")
    assert any(p.name.startswith(f"index.{name}-") for p in cache_dir(kernels).iterdir())
