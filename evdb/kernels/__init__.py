"""The kernel registry: one set of names, several backends.

``backend("reference")`` is the numpy specification, ``backend("cpu")`` the numba kernels;
``"gpu"`` arrives with the HBM tier. Every backend module exports the names in ``KERNELS`` with
the same signatures, which is what ``tests/kernels/test_parity.py`` and ``bench/`` iterate over.
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
BACKENDS = ("reference", "cpu")


def backend(name: str) -> ModuleType:
    """Return the kernel module of a backend (``"reference"`` or ``"cpu"``)."""
    if name not in BACKENDS:
        raise ConfigError(f"backend: unknown kernel backend {name!r}; expected one of {BACKENDS}")
    return importlib.import_module(f"evdb.kernels.{name}")
