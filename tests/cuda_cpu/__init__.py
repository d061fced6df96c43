"""The CPU execution backend for evdb's CUDA sources: test support, not shipped as a device.

No GPU has been lent to this project's CI, so the GPU path is exercised on the CPU:

* ``cupy_standin``: a numpy-backed stand-in for the parts of cupy that evdb uses. A device
  array (``cupy_standin.ndarray``) wraps a numpy array (``_storage``) but is not one: mixing
  host and device arrays raises as it does in cupy (``numpy.asarray(device)``, a numpy array
  given to a cupy function, operator or index, a numpy array assigned into a device array), so
  a missing transfer fails a test instead of passing silently. ``cuda.Device``, the runtime's
  device count and ``memGetInfo`` (settable, for the HBM tier's size check), pinned memory,
  streams and transfer counters are there too.
* ``rawmodule`` and ``cuda_cpu.h``: ``cupy.RawModule`` on the CPU. The unmodified CUDA C is
  built with g++ against a header that runs each CUDA thread as an OS thread, so the kernels
  the tests run are the real sources (their limits are in that module's docstring).
* ``adapter``: the cpu (numba) kernels behind device arrays, a fast mode for suites too slow
  on the executor; which tests use it is said where they do.

The ``standin_cupy`` fixture (tests/conftest.py) installs the stand-in as ``cupy``.
"""
