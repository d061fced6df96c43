"""The CUDA sources compile and define every kernel the cupy wrappers launch: no GPU needed.

nvcc compiles exactly the text that ``evdb.kernels.gpu`` hands to NVRTC (headers pasted in)
to PTX for sm_80 (A100) and sm_90 (H100/H200) with warnings as errors; then the names that
the modules of ``evdb/kernels/gpu/`` pass to ``cuda_kernel(...)`` must each be an ``.entry``
of their source's PTX, so a typo in a name fails here rather than on the first GPU run.
Skipped where nvcc is missing.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from evdb.kernels import HOST_ONLY_KERNELS, KERNELS, backend, gpu

NVCC = shutil.which("nvcc")
ARCHES = ("sm_80", "sm_90")
ENTRY = re.compile(r"\.entry\s+(\w+)\s*\(")


def launched_kernels() -> set[tuple[str, str]]:
    """(source, name) of every ``cuda_kernel("source", "name")`` call in evdb/kernels/gpu/."""
    found = set()
    for path in sorted(Path(gpu.__file__).parent.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "cuda_kernel":
                args = [a.value for a in node.args if isinstance(a, ast.Constant)]
                where = f"{path.name} line {node.lineno}"
                assert len(args) == 2, f"{where}: cuda_kernel takes two literals"
                found.add((args[0], args[1]))
    return found


@pytest.fixture(scope="module", params=ARCHES)
def ptx(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    if NVCC is None:
        pytest.skip("nvcc is not on PATH")
    out = tmp_path_factory.mktemp(request.param)
    procs = {}
    for source in gpu.SOURCES:  # compile the sources in parallel: nvcc is single-threaded
        cu = out / f"{source}.cu"
        cu.write_text(gpu.source_text(source), encoding="utf-8")
        cmd = [NVCC, "-ptx", f"-arch={request.param}", "-std=c++17", "-Werror", "all-warnings"]
        cmd += [str(cu), "-o", str(out / f"{source}.ptx")]
        procs[source] = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    texts = {}
    for source, proc in procs.items():
        log, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0 and not log.strip(), f"{source}.cu ({request.param}):\n{log}"
        texts[source] = (out / f"{source}.ptx").read_text(encoding="utf-8")
    return texts


def test_every_launched_kernel_is_an_entry_of_its_source(ptx: dict) -> None:
    launched = launched_kernels()
    assert {source for source, _ in launched} == set(gpu.SOURCES)
    missing = [
        f"{source}.cu:{name}"
        for source, name in sorted(launched)
        if name not in ENTRY.findall(ptx[source])
    ]
    assert not missing, f"evdb/kernels/gpu launches kernels the sources do not define: {missing}"


def test_every_entry_is_launched(ptx: dict) -> None:
    launched = launched_kernels()
    unused = [
        f"{source}.cu:{name}"
        for source in gpu.SOURCES
        for name in ENTRY.findall(ptx[source])
        if (source, name) not in launched
    ]
    assert not unused, f"kernels no wrapper launches: {unused}"


def test_sources_paste_every_header() -> None:
    for source in gpu.SOURCES:
        text = gpu.source_text(source)
        kept = re.findall(r"^\s*#\s*include.*$", text, flags=re.MULTILINE)
        assert not kept, f"{source}.cu keeps includes NVRTC cannot resolve: {kept}"
        assert text.count("#define EVDB_COMMON_CUH") == 1


def test_gpu_module_defines_every_kernel_without_cupy() -> None:
    owed = [k for k in KERNELS if k not in HOST_ONLY_KERNELS]
    missing = [k for k in owed if not callable(getattr(gpu, k, None))]
    assert not missing, f"gpu lacks {missing}"


def test_gpu_backend_without_cupy_says_how_to_install() -> None:
    try:
        import cupy  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("cupy is installed here")
    from evdb.errors import ConfigError

    with pytest.raises(ConfigError, match=r"pip install evdb\[gpu\]"):
        backend("gpu")
