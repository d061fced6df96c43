"""``RawModule``: cupy's run-time compiled module, with the CUDA C run on the CPU (test support).

``RawModule(code=text, options=...)`` builds the unmodified CUDA source with g++ against
``cuda_cpu.h`` into a shared library (cached on disk by a hash of the text, the header, the
runtime and the options), with a generated launcher per ``extern "C" __global__`` kernel;
``get_function(name)`` returns a kernel called as cupy's is,
``kernel(grid, block, args, shared_mem=0, stream=None)``. Every argument is checked against
the kernel's C signature, more strictly than cupy (which checks nothing): a pointer takes a
device array (any object whose ``_storage`` is a C-contiguous numpy array holding its
memory) of exactly the pointee's dtype; a numpy array raises ``TypeError`` as in cupy
(``Unsupported type <class 'numpy.ndarray'>``), so a missing host-to-device copy fails; a
scalar takes a numpy scalar of exactly its C type (``np.int32`` for ``int``, ``np.int64``
for ``long long``...), where cupy would pass a Python int as 8 bytes to an ``int``.

Execution (cuda_cpu_runtime.cpp): each CUDA thread of a block is an OS thread of a pool
reused across blocks and launches, so threads of a block really run concurrently; blocks run
one after another, and launches are synchronous (``stream`` is ignored). Dynamic shared
memory is one buffer, set to all ones bits (NaN, -1) before each block, so a read before
the block's own write shows. Warp intrinsics (``__shfl*_sync``, ``__ballot_sync``) wait for
every lane of their mask at the same call site: a lane of the mask that exited, skipped the
op or waits at another op, a source lane outside the mask, or a lane naming itself out of
the mask fails the launch with ``RuntimeError`` (at once for a certain deadlock, after
``$EVDB_CUDA_CPU_TIMEOUT_S``, 10 s, otherwise) instead of hanging CI.

Limits of the model, which only a device can lift:

* x86's memory ordering (TSO) is stronger than a GPU's: a missing ``__threadfence`` or
  ``volatile`` that lets a GPU reorder or cache a load is not caught.
* Blocks are serialised: races between blocks never happen here; within a block, with two
  cores, threads interleave rarely and coarsely, so a check-then-set in place of an atomic
  usually passes. A wrong atomic, a wrong index, a missing or misplaced warp op (which is
  strict here: the whole mask must arrive) and a read of uninitialised shared memory are
  caught; a race of plain loads and stores mostly is not.
* Maths come from glibc, not libdevice: ``log``, ``sin``, ``cos``, ``pow``, ``exp2`` may
  differ in the last ulp or two, so normal fills compare to 2 ulp, not bit for bit. g++
  compiles with ``-ffp-contract=off`` (no FMA), so ``__dadd_rn``/``__dmul_rn`` are exact.
* A kernel that spins forever outside any warp op (say on a slot no thread will publish)
  fails the launch after about three timeouts, and its threads stay behind, leaked.
* No memcheck: an access out of bounds corrupts or crashes the test process, as it would
  corrupt device memory (``compute-sanitizer`` on a device finds those).
* Threads cost OS context switches (measured on 2 shared cores: about 2-4 us a CUDA thread,
  plus about 1.5 us a warp op): keep launches to thousands of threads, not millions.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import subprocess
import tempfile
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["RawKernel", "RawModule", "cache_dir", "kernel_signatures"]

HERE = Path(__file__).parent
HEADER = HERE / "cuda_cpu.h"
RUNTIME = HERE / "cuda_cpu_runtime.cpp"
CXX = os.environ.get("CXX", "g++")
CXXFLAGS = (
    "-O2",
    "-std=c++17",
    "-pthread",
    "-fPIC",
    "-shared",
    "-ffp-contract=off",  # __dadd_rn / __dmul_rn round each step, as on the device
    "-fno-strict-aliasing",  # the sources view int64 words as uint64 for atomics
    "-Wno-unknown-pragmas",  # #pragma unroll
)
TIMEOUT_S = float(os.environ.get("EVDB_CUDA_CPU_TIMEOUT_S", "10"))
SHARED_CAPACITY = 227 * 1024  # the most dynamic shared memory a kernel may opt in to (sm_90)
MAX_BLOCK = 1024

# C type (const, volatile and __restrict__ dropped) -> numpy dtype.
C_TYPES: dict[str, np.dtype[Any]] = {
    name: np.dtype(dt)
    for names, dt in [
        (("bool",), np.bool_),
        (("char", "signed char"), np.int8),
        (("unsigned char",), np.uint8),
        (("short", "short int", "signed short"), np.int16),
        (("unsigned short", "unsigned short int"), np.uint16),
        (("int", "signed", "signed int"), np.int32),
        (("unsigned", "unsigned int"), np.uint32),
        (("long", "long int", "long long", "long long int", "signed long long"), np.int64),
        (
            (
                "unsigned long",
                "unsigned long int",
                "unsigned long long",
                "unsigned long long int",
                "size_t",
            ),
            np.uint64,
        ),
        (("float",), np.float32),
        (("double",), np.float64),
    ]
    for name in names
}

_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
_TYPEDEF = re.compile(r"\btypedef\s+([\w\s]+?)\s+(\w+)\s*;")
_KERNEL = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(([^)]*)\)')
_SHARED = re.compile(r"\b(extern\s+)?__shared__\s+([\w\s]+?)\s+(\w+)\s*\[\s*\]")
_QUALIFIERS = re.compile(r"\b(const|volatile|__restrict__|__restrict)\b")

_build_lock = threading.Lock()
_launch_lock = threading.Lock()
_runtime: ctypes.CDLL | None = None
LAUNCHES: Counter[str] = Counter()  # launches per kernel name in this process


@dataclass(frozen=True)
class Param:
    name: str
    ctype: str  # base C type, qualifiers dropped
    pointer: bool
    dtype: np.dtype[Any] | None  # None: void*


def cache_dir() -> Path:
    """Where built libraries are kept: $EVDB_CUDA_CPU_CACHE, else $XDG_CACHE_HOME/evdb-cuda-cpu,
    else /tmp/evdb-cuda-cpu-<uid>."""
    if os.environ.get("EVDB_CUDA_CPU_CACHE"):
        return Path(os.environ["EVDB_CUDA_CPU_CACHE"])
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "evdb-cuda-cpu"
    return Path(tempfile.gettempdir()) / f"evdb-cuda-cpu-{os.getuid()}"


def kernel_signatures(code: str) -> dict[str, tuple[Param, ...]]:
    """The ``extern "C" __global__`` kernels of code: name -> parameters, in order."""
    text = _COMMENTS.sub(" ", code)
    aliases = {alias: " ".join(base.split()) for base, alias in _TYPEDEF.findall(text)}
    kernels = {}
    for name, params in _KERNEL.findall(text):
        parsed = []
        for i, raw in enumerate(p for p in params.split(",") if p.strip()):
            words = _QUALIFIERS.sub(" ", raw).replace("*", " * ").split()
            pointer = words.count("*")
            if pointer > 1 or len(words) < 2:
                raise NotImplementedError(f"{name}: parameter {i} {raw.strip()!r}")
            pname = words[-1]
            base = " ".join(w for w in words[:-1] if w != "*")
            base = aliases.get(base, base)
            if base == "void" and pointer:
                dtype = None
            elif base in C_TYPES:
                dtype = C_TYPES[base]
            else:
                raise NotImplementedError(f"{name}: parameter {pname} of type {base!r}")
            parsed.append(Param(pname, base, bool(pointer), dtype))
        kernels[name] = tuple(parsed)
    return kernels


def _launcher(code: str, kernels: dict[str, tuple[Param, ...]]) -> tuple[str, str]:
    """The prelude (dynamic shared memory) and the launchers appended to the source."""
    text = _COMMENTS.sub(" ", code)
    shared = _SHARED.findall(text)
    if any(not extern for extern, _, _ in shared):
        raise NotImplementedError("static __shared__ arrays: only extern __shared__ is supported")
    names = {name for _, _, name in shared}
    if len(names) > 1:
        raise NotImplementedError(f"more than one extern __shared__ name: {sorted(names)}")
    if names:
        (ctype,) = {" ".join(t.split()) for _, t, _ in shared}
        (name,) = names
        prelude = f"alignas(16) {ctype} {name}[{SHARED_CAPACITY} / sizeof({ctype})];\n"
        base = name
    else:
        base = "evdb_cuda_cpu_no_shared"
        prelude = f"alignas(16) static unsigned char {base}[{SHARED_CAPACITY}];\n"
    lines = [
        '\nextern "C" void* evdb_cuda_cpu_shared() { return (void*)' + base + "; }",
    ]
    for kname, params in kernels.items():
        unpacked = ", ".join(
            f"*({'void' if p.dtype is None else p.ctype}"
            f"{'*' if p.pointer else ''}*)((const char*)a + {8 * i})"
            for i, p in enumerate(params)
        )
        lines.append(
            f'extern "C" void evdb_tramp_{kname}(const void* a) {{ {kname}({unpacked}); }}'
        )
    return prelude, "\n".join(lines) + "\n"


def _build(source: str, key_parts: list[bytes], extra: list[str], stem: str) -> Path:
    """Compile source into a cached shared library; returns its path."""
    h = hashlib.sha256()
    for part in key_parts:
        h.update(hashlib.sha256(part).digest())
    out = cache_dir() / f"{stem}-{h.hexdigest()[:24]}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_src = tempfile.mkstemp(suffix=".cpp", dir=out.parent)
    os.close(fd)
    tmp_so = f"{tmp_src[:-4]}.so"
    try:
        Path(tmp_src).write_text(source, encoding="utf-8")
        cmd = [CXX, *CXXFLAGS, f"-I{HERE}", tmp_src, "-o", tmp_so, *extra]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise CompileException(f"g++ failed on {stem}:\n{proc.stderr}")
        os.replace(tmp_so, out)  # atomic: parallel pytest processes never load half a file
    finally:
        for p in (tmp_src, tmp_so):
            if os.path.exists(p):
                os.unlink(p)
    return out


def _runtime_library() -> tuple[ctypes.CDLL, Path]:
    global _runtime
    path = _build(
        RUNTIME.read_text(encoding="utf-8"),
        [HEADER.read_bytes(), RUNTIME.read_bytes(), " ".join((CXX, *CXXFLAGS)).encode()],
        [],
        "runtime",
    )
    if _runtime is None:
        lib = ctypes.CDLL(str(path))
        lib.evdb_cuda_cpu_launch.restype = ctypes.c_int
        lib.evdb_cuda_cpu_launch.argtypes = [
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_uint),
            ctypes.POINTER(ctypes.c_uint),
            ctypes.c_void_p,
            ctypes.c_ulonglong,
            ctypes.c_double,
            ctypes.c_char_p,
            ctypes.c_ulonglong,
        ]
        _runtime = lib
    return _runtime, path


class CompileException(RuntimeError):
    """g++ rejected the source (cupy raises its own CompileException for NVRTC's log)."""


class RawModule:
    """cupy.RawModule's constructor and ``get_function``, for the CPU executor."""

    def __init__(
        self,
        code: str | None = None,
        path: str | None = None,
        options: tuple[str, ...] = (),
        backend: str = "nvrtc",
        translate_cucomplex: bool = False,
        *,
        enable_cooperative_groups: bool = False,
        name_expressions: Any = None,
        jitify: bool = False,
    ) -> None:
        if code is None:
            if path is None:
                raise TypeError("RawModule: give code or path")
            code = Path(path).read_text(encoding="utf-8")
        self.code = code
        self.options = tuple(options)
        self._signatures = kernel_signatures(code)
        defines = [o for o in self.options if o.startswith("-D")]
        prelude, launchers = _launcher(code, self._signatures)
        with _build_lock:
            self._runtime, runtime_path = _runtime_library()
            source = (
                '#include "cuda_cpu.h"\n'
                + prelude
                + '#line 1 "module.cu"\n'
                + code
                + '\n#line 1 "launchers"\n'
                + launchers
            )
            path_so = _build(
                source,
                [
                    source.encode(),
                    HEADER.read_bytes(),
                    str(runtime_path).encode(),
                    repr(self.options).encode(),
                    " ".join((CXX, *CXXFLAGS)).encode(),
                ],
                [*defines, str(runtime_path), f"-Wl,-rpath,{runtime_path.parent}"],
                "module",
            )
            self._lib = ctypes.CDLL(str(path_so))
        shared_fn = self._lib.evdb_cuda_cpu_shared
        shared_fn.restype = ctypes.c_void_p
        self._shared_ptr: int = int(shared_fn())

    def get_function(self, name: str) -> RawKernel:
        if name not in self._signatures:
            raise AttributeError(f'no extern "C" __global__ kernel named {name!r} in the module')
        tramp = getattr(self._lib, f"evdb_tramp_{name}")
        return RawKernel(
            self, name, self._signatures[name], ctypes.cast(tramp, ctypes.c_void_p).value or 0
        )


def _dims(name: str, value: Any) -> tuple[int, int, int]:
    dims = (value,) if isinstance(value, (int, np.integer)) else tuple(value)
    if not 1 <= len(dims) <= 3 or not all(isinstance(d, (int, np.integer)) for d in dims):
        raise TypeError(f"{name}: expected an int or a tuple of 1 to 3 ints, got {value!r}")
    out = tuple(int(d) for d in dims) + (1,) * (3 - len(dims))
    if min(out) < 1:
        raise ValueError(f"{name}: every dimension must be >= 1, got {value!r}")
    return out  # type: ignore[return-value]


class RawKernel:
    """One kernel of a RawModule, called as cupy's: ``kernel(grid, block, args, shared_mem=0)``."""

    def __init__(self, module: RawModule, name: str, params: tuple[Param, ...], tramp: int) -> None:
        self.module = module
        self.name = name
        self.params = params
        self._tramp = tramp

    def pack(self, args: tuple[Any, ...]) -> np.ndarray:
        """The arguments as 8-byte words, after checking each against the C signature."""
        if not isinstance(args, tuple):
            raise TypeError(f"{self.name}: args must be a tuple, got {type(args).__name__}")
        if len(args) != len(self.params):
            raise TypeError(
                f"{self.name}: takes {len(self.params)} arguments "
                f"({', '.join(p.name for p in self.params)}), got {len(args)}"
            )
        words = np.zeros(max(len(args), 1), np.uint64)
        raw = words.view(np.uint8)
        for i, (p, a) in enumerate(zip(self.params, args, strict=True)):
            where = f"{self.name}: argument {i} ({p.name}, {p.ctype}{'*' if p.pointer else ''})"
            if isinstance(a, np.ndarray):
                raise TypeError(f"Unsupported type {type(a)} ({where}: a host array)")
            if p.pointer:
                storage = getattr(a, "_storage", None)
                if not isinstance(storage, np.ndarray):
                    raise TypeError(f"Unsupported type {type(a)} ({where})")
                if not storage.flags.c_contiguous:
                    raise ValueError(f"{where}: the device array is not C-contiguous")
                dtype = getattr(a, "dtype", storage.dtype)
                if p.dtype is not None and np.dtype(dtype) != p.dtype:
                    raise TypeError(f"{where}: expected a {p.dtype} array, got {np.dtype(dtype)}")
                words[i] = storage.ctypes.data
            else:
                if not isinstance(a, np.generic) or a.dtype != p.dtype:
                    got = a.dtype if isinstance(a, np.generic) else type(a).__name__
                    raise TypeError(f"{where}: expected a numpy {p.dtype} scalar, got {got}")
                raw[8 * i : 8 * i + a.dtype.itemsize] = np.frombuffer(a.tobytes(), np.uint8)
        return words

    def __call__(
        self,
        grid: Any,
        block: Any,
        args: tuple[Any, ...],
        *,
        shared_mem: int = 0,
        stream: Any = None,
        enable_cooperative_groups: bool = False,
    ) -> None:
        g, b = _dims("grid", grid), _dims("block", block)
        if b[0] * b[1] * b[2] > MAX_BLOCK:
            raise ValueError(f"{self.name}: block {b} has more than {MAX_BLOCK} threads")
        if not 0 <= int(shared_mem) <= SHARED_CAPACITY:
            raise ValueError(f"{self.name}: shared_mem {shared_mem} > {SHARED_CAPACITY} bytes")
        words = self.pack(args)
        grid_c = (ctypes.c_uint * 3)(*g)
        block_c = (ctypes.c_uint * 3)(*b)
        err = ctypes.create_string_buffer(4096)
        with _launch_lock:  # one launch at a time: the runtime's pool and shared buffer
            rc = self.module._runtime.evdb_cuda_cpu_launch(
                self._tramp,
                words.ctypes.data,
                grid_c,
                block_c,
                self.module._shared_ptr,
                int(shared_mem),
                TIMEOUT_S,
                err,
                len(err),
            )
        LAUNCHES[self.name] += 1
        if rc != 0:
            raise RuntimeError(f"{self.name}: {err.value.decode(errors='replace')}")
