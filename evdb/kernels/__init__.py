"""The kernel registry: one set of names, several backends.

``backend("reference")`` is the numpy specification, ``backend("cpu")`` the numba kernels and
``backend("gpu")`` the CUDA kernels (cupy arrays in and out; it raises
:class:`~evdb.errors.ConfigError` with install advice where cupy or a CUDA device is missing).
Every backend module exports the names in ``KERNELS`` with the same signatures, which is what
``tests/kernels/test_parity.py``, ``tests/gpu`` and ``bench/`` iterate over.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from evdb.errors import ConfigError

KERNELS = (
    "bloom_add",
    "bloom_query",
    "combine_backward",
    "fill_normal",
    "fill_uniform",
    "gather_combine",
    "group_positions",
    "hash_find",
    "hash_insert",
    "hash_remove",
    "probe_gather",
    "probe_gather_combine",
    "segment_sum_apply",
    "sketch_add",
    "unique_inverse",
    "unique_rows",
)
# Host backends: numpy arrays in and out, present wherever evdb installs. The parity suite
# runs every one of them against "reference" on numpy inputs.
BACKENDS = ("reference", "cpu")
# Device backends: arrays live on the device; they need an optional install and hardware.
DEVICE_BACKENDS = ("gpu",)


def backend(name: str) -> ModuleType:
    """Return the kernel module of a backend (``"reference"``, ``"cpu"`` or ``"gpu"``).

    Raises
    ------
    ConfigError
        For an unknown name, or for ``"gpu"`` where cupy or a CUDA device is missing.
    """
    if name not in BACKENDS + DEVICE_BACKENDS:
        known = BACKENDS + DEVICE_BACKENDS
        raise ConfigError(f"backend: unknown kernel backend {name!r}; expected one of {known}")
    module = importlib.import_module(f"evdb.kernels.{name}")
    if name in DEVICE_BACKENDS:
        module.require()  # never a silent fallback to the CPU (DESIGN, anti-pattern 2)
    return module
