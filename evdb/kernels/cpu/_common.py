"""Shared pieces of the numba kernels: the lazy ``kernel`` decorator, array types, compile
options, the key mixer, prefetch."""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
from llvmlite import binding as _llvm
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils, typeinfer
from numba.core import config as _numba_config
from numba.core.compiler_lock import global_compiler_lock
from numba.core.registry import CPUDispatcher
from numba.extending import intrinsic

i8, u8, f4, f8, b1 = types.int64, types.uint64, types.float32, types.float64, types.boolean
I4 = types.Array(types.int32, 1, "C")
I8 = types.Array(types.int64, 1, "C")
I8_2D = types.Array(types.int64, 2, "C")
U1 = types.Array(types.uint8, 1, "C")
U4 = types.Array(types.uint32, 1, "C")
U8 = types.Array(types.uint64, 1, "C")
B1 = types.Array(types.boolean, 1, "C")
F4 = types.Array(types.float32, 1, "C")
F8 = types.Array(types.float64, 1, "C")
F4_2D = types.Array(types.float32, 2, "C")

# error_model "numpy": a float division by zero gives inf or nan, as in the numpy reference,
# instead of a per-element zero check and exception, which kept LLVM from vectorising the
# update loops (fused Adagrad, 16,384 rows of dim 64: 4.1 -> 2.2 ms on one thread)
OPTS = {"nogil": True, "cache": True, "error_model": "numpy"}

# From this many keys (or rows) a kernel runs on numba's threads. Waking the pool costs 2-5 us
# here (64 keys: 0.5 us serial, 1.7 us parallel; 5 us after 2 ms idle), and two threads win
# from a few hundred keys: at 1,024 keys of a 1M-row dim-16 table, fused probe + gather 28 ->
# 16 us, pull's stamp + copy 25 -> 19, Adagrad push 67 -> 44, sum combine 11 -> 6. (It was
# 16,384, set in the first version after a 1.5 ms wake-up that no longer reproduces; DeepFM's
# 4,096-key batches then ran every kernel on one thread.)
PARALLEL_MIN_KEYS = 1024
I64_MIN = np.int64(-(2**63))


class Kernel(CPUDispatcher):
    """A numba dispatcher that compiles its declared signature when first used, not at import.

    ``njit(sig)`` compiles (or loads from numba's on-disk cache) at decoration, so importing
    the kernels compiled all of them: 240 s on a fresh machine, before a server could answer
    or a trainer could step, for kernels most processes never call. A ``Kernel`` keeps the
    signature and does the same compile or cache load, then disables compilation exactly as
    ``njit(sig)`` does, the first time it is called from Python or typed inside another kernel
    (inlined helpers are never compiled on their own). From then on numba's C dispatcher calls
    the machine code directly: a call costs what an ``njit(sig)`` call costs, and arguments
    that fit no declared signature raise numba's ``TypeError``, as before.
    ``evdb.kernels.warm_up`` compiles every kernel ahead of time (``evdb warmup``).
    """

    declared: tuple[Any, ...] = ()

    @property
    def is_compiled(self) -> bool:
        """Whether the declared signatures are compiled (or loaded from the cache) yet."""
        return not self._can_compile

    def compile_declared(self) -> None:
        """Compile (or load from the cache) the declared signatures once; thread-safe."""
        with global_compiler_lock:  # re-entrant: a kernel typed while another compiles
            if not self._can_compile:
                return
            with typeinfer.register_dispatcher(self):
                for sig in self.declared:
                    self.compile(sig)
            self.disable_compile()

    def _compile_for_args(self, *args: Any, **kws: Any) -> Any:
        # numba's C dispatcher calls this when no compiled signature fits the arguments, while
        # compilation is enabled, that is before the first use; it then calls what this
        # returns with the arguments: the kernel again, now compiled (or raising TypeError).
        self.compile_declared()
        return self

    def get_call_template(self, args: Any, kws: Any) -> Any:
        self.compile_declared()  # called from another kernel: the declared signature only
        return super().get_call_template(args, kws)

    def get_compile_result(self, sig: Any) -> Any:
        self.compile_declared()
        return super().get_compile_result(sig)

    def __reduce__(self) -> Any:
        # pickled by name: a process that unpickles one gets its own module's kernel
        return _kernel_by_name, (self.py_func.__module__, self.py_func.__qualname__)


def _kernel_by_name(module: str, name: str) -> Kernel:
    return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]


def lazy_njit(signature: Any, **options: Any) -> Any:
    """``njit(signature, **OPTS, **options)``, compiled on first use (see :class:`Kernel`).

    Under ``NUMBA_DISABLE_JIT=1`` it returns the Python function, as ``njit`` does.
    """

    def wrap(func: Any) -> Any:
        if _numba_config.DISABLE_JIT:
            return func
        targetoptions = {k: v for k, v in OPTS.items() if k != "cache"}
        targetoptions.update(options, nopython=True, boundscheck=None)
        disp = Kernel(py_func=func, locals={}, targetoptions=targetoptions)
        if OPTS["cache"]:
            disp.enable_caching()
        disp.declared = (signature,)
        return disp

    return wrap


# LLVM 15+ names the prefetch intrinsic by opaque pointer ("p0"), older ones by "p0i8".
_PREFETCH = "llvm.prefetch.p0" if _llvm.llvm_version_info[0] >= 15 else "llvm.prefetch.p0i8"


def _prefetch_codegen(write: int):  # type: ignore[no-untyped-def]
    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, args[1:], wraparound=False)
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, _PREFETCH)
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(write), i32(3), i32(1)])
        return context.get_dummy_value()

    return codegen


@intrinsic
def prefetch(typingctx, arr, i, j):  # type: ignore[no-untyped-def]
    """Hint the cache to fetch arr[i, j] for reading (LLVM's prefetch: read, high locality)."""
    return types.void(arr, i, j), _prefetch_codegen(0)


@intrinsic
def prefetch_write(typingctx, arr, i):  # type: ignore[no-untyped-def]
    """Hint the cache to fetch arr[i] of a 1-d array for writing."""
    return types.void(arr, i), _prefetch_codegen(1)


@njit(inline="always", **OPTS)
def copy_row(values, r, out, i):  # type: ignore[no-untyped-def]
    """out[i, :] = values[r, :] as an explicit loop: numba lowers the slice assignment
    outside a parfor through its generic broadcasting path, 3x slower (a serial gather of
    16,384 rows of dim 64: 1.75 against 0.54 ms here)."""
    for j in range(values.shape[1]):
        out[i, j] = values[r, j]


@lazy_njit(u8(u8), inline="always")
def mix64(x):  # type: ignore[no-untyped-def]
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x
