"""Every CUDA source compiles with NVRTC, the compiler cupy.RawModule runs at run time.

nvcc (test_cuda_compiles.py) is not what a user's machine runs: cupy hands the text of
``gpu.source_text(name)`` with ``gpu.NVRTC_OPTIONS`` to NVRTC. NVRTC comes from the pip wheel
``nvidia-cuda-nvrtc-cu12`` (in the ``test`` extra), loaded with ctypes: no driver, no device.
Each source must compile for every architecture evdb targets with an empty log (NVRTC has no
``-Werror``) and define exactly its ``extern "C" __global__`` kernels as PTX entries, and
build machine code for sm_80 and sm_90 without a register spill; a
mutated source (a kernel losing ``extern "C"``, an ``atomicCAS`` on a signed 64-bit
pointer) must fail the same check. Skipped without the wheel, except under CI (``CI=true``).
"""

from __future__ import annotations

import ctypes
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from evdb.kernels import gpu

from ..cuda_cpu.rawmodule import kernel_signatures
from .test_cuda_compiles import launched_kernels

ARCHES = ("compute_80", "compute_90")  # A100, H100/H200: PTX, as cupy compiles for the device
ENTRY = re.compile(r"\.entry\s+(\w+)\s*\(")


def _nvrtc() -> ctypes.CDLL:
    try:
        import nvidia.cuda_nvrtc as wheel
    except ImportError:
        reason = "NVRTC wheel missing: pip install nvidia-cuda-nvrtc-cu12 (in evdb[test])"
        if os.environ.get("CI") == "true":  # CI installs the test extra: a missing one is a bug
            pytest.fail(reason)
        pytest.skip(reason)
    lib_dir = Path(next(iter(wheel.__path__))) / "lib"
    lib = ctypes.CDLL(str(lib_dir / "libnvrtc.so.12"))
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    return lib


@dataclass(frozen=True)
class Compiled:
    ok: bool
    log: str
    entries: list[str]


def compile_source(
    lib: ctypes.CDLL, text: str, arch: str, name: str = "source.cu", extra: tuple[str, ...] = ()
) -> Compiled:
    """text through NVRTC with gpu.NVRTC_OPTIONS (and extra) for arch: success, log and the
    PTX entries (none for a real sm_XX architecture, which builds a cubin)."""
    prog = ctypes.c_void_p()
    check = _checker(lib)
    check(lib.nvrtcCreateProgram(ctypes.byref(prog), text.encode(), name.encode(), 0, None, None))
    try:
        opts = [*gpu.NVRTC_OPTIONS, f"--gpu-architecture={arch}", *extra]
        argv = (ctypes.c_char_p * len(opts))(*(o.encode() for o in opts))
        status = lib.nvrtcCompileProgram(prog, len(opts), argv)
        size = ctypes.c_size_t()
        check(lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)))
        log = ctypes.create_string_buffer(size.value)
        check(lib.nvrtcGetProgramLog(prog, log))
        if status != 0:
            return Compiled(False, log.value.decode(errors="replace"), [])
        if arch.startswith("sm_"):
            return Compiled(True, log.value.decode(errors="replace"), [])
        check(lib.nvrtcGetPTXSize(prog, ctypes.byref(size)))
        ptx = ctypes.create_string_buffer(size.value)
        check(lib.nvrtcGetPTX(prog, ptx))
        entries = ENTRY.findall(ptx.value.decode())
        return Compiled(True, log.value.decode(errors="replace"), entries)
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _checker(lib: ctypes.CDLL):  # type: ignore[no-untyped-def]
    def check(status: int) -> None:
        if status != 0:
            raise RuntimeError(f"NVRTC: {lib.nvrtcGetErrorString(status).decode()}")

    return check


@pytest.fixture(scope="module")
def nvrtc() -> ctypes.CDLL:
    return _nvrtc()


@pytest.fixture(scope="module")
def compiled(nvrtc: ctypes.CDLL) -> dict[tuple[str, str], Compiled]:
    return {
        (source, arch): compile_source(nvrtc, gpu.source_text(source), arch, f"{source}.cu")
        for source in gpu.SOURCES
        for arch in ARCHES
    }


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("source", gpu.SOURCES)
def test_source_compiles_with_an_empty_log_and_exactly_its_kernels(
    compiled: dict[tuple[str, str], Compiled], source: str, arch: str
) -> None:
    result = compiled[(source, arch)]
    assert result.ok and not result.log.strip(), f"{source}.cu ({arch}):\n{result.log}"
    declared = sorted(kernel_signatures(gpu.source_text(source)))
    assert declared, f'{source}.cu declares no extern "C" __global__ kernel'
    assert sorted(result.entries) == declared


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("source", gpu.SOURCES)
def test_source_builds_machine_code_without_register_spills(
    nvrtc: ctypes.CDLL, source: str, arch: str
) -> None:
    # ptxas through NVRTC, as the driver would JIT the PTX: a spill is a warning in the log.
    text = gpu.source_text(source)
    result = compile_source(
        nvrtc, text, arch, f"{source}.cu", ("--ptxas-options=--warn-on-spills",)
    )
    assert result.ok and not result.log.strip(), f"{source}.cu ({arch}):\n{result.log}"


def test_every_launched_kernel_is_an_nvrtc_entry(
    compiled: dict[tuple[str, str], Compiled],
) -> None:
    entries = {(s, e) for (s, _), c in compiled.items() for e in c.entries}
    missing = sorted(launched_kernels() - entries)
    assert not missing, f"evdb/kernels/gpu launches kernels NVRTC does not build: {missing}"


def _mutate(text: str, old: str, new: str) -> str:
    assert old in text, f"the mutation's anchor {old!r} is gone from the source"
    return text.replace(old, new, 1)


def test_a_kernel_without_extern_c_drops_out_of_the_entries(nvrtc: ctypes.CDLL) -> None:
    text = _mutate(
        gpu.source_text("index"),
        'extern "C" __global__ void hash_find(',
        "__global__ void hash_find(",
    )
    result = compile_source(nvrtc, text, ARCHES[0])
    # It still compiles, but under a mangled name: the exact entry list is what catches it.
    assert result.ok
    assert "hash_find" not in result.entries
    assert sorted(result.entries) != sorted(kernel_signatures(gpu.source_text("index")))


def test_atomic_cas_on_a_signed_64_bit_pointer_is_rejected(nvrtc: ctypes.CDLL) -> None:
    text = _mutate(
        gpu.source_text("index"),
        "(i64)atomicCAS((u64*)row, (u64)EVDB_EMPTY, (u64)EVDB_LOCKED)",
        "atomicCAS(row, EVDB_EMPTY, EVDB_LOCKED)",
    )
    result = compile_source(nvrtc, text, ARCHES[0])
    assert not result.ok
    assert "atomicCAS" in result.log


def test_a_standard_include_is_rejected(nvrtc: ctypes.CDLL) -> None:
    result = compile_source(nvrtc, "#include <cstdio>\n" + gpu.source_text("init"), ARCHES[0])
    assert not result.ok
    assert "cstdio" in result.log


def test_a_warning_fails_the_empty_log_check(nvrtc: ctypes.CDLL) -> None:
    # An unused variable is only a warning: the check must still see it.
    text = _mutate(
        gpu.source_text("merge"),
        "    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;\n    if (i >= na) return;",
        "    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x, unused = 7;\n"
        "    if (i >= na) return;",
    )
    result = compile_source(nvrtc, text, ARCHES[0])
    assert result.ok and result.log.strip()


def test_a_register_spill_fails_the_spill_check(nvrtc: ctypes.CDLL) -> None:
    # Too few registers for bags.cu: the same options must then report the spills.
    extra = ("--ptxas-options=--warn-on-spills", "--maxrregcount=24")
    result = compile_source(nvrtc, gpu.source_text("bags"), "sm_80", "bags.cu", extra)
    assert result.ok and "spilled" in result.log
