"""The kernel registry: one set of names, several backends.

``backend("reference")`` is the numpy specification, ``backend("cpu")`` the numba kernels and
``backend("gpu")`` the CUDA kernels (cupy arrays in and out; it raises
:class:`~evdb.errors.ConfigError` with install advice where cupy or a CUDA device is missing).
Every backend module exports the names in ``KERNELS`` with the same signatures (a device
backend those not in ``HOST_ONLY_KERNELS``), which is what ``tests/kernels/test_parity.py``,
``tests/gpu`` and ``bench/`` iterate over.

``backend`` is the only way in: outside ``evdb/kernels`` and ``evdb/tiers`` no module imports
a backend module itself. A module that runs host kernels binds the backend once at import, so
a call costs one module attribute lookup, as an import would::

    from evdb.kernels import backend

    cpu = backend("cpu")
    cpu.hash_find(slots, keys, out)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING

from evdb.errors import ConfigError

if TYPE_CHECKING:
    from evdb.kernels.warmup import Compiled, WarmUp

__all__ = [
    "BACKENDS",
    "DEVICE_BACKENDS",
    "HOST_ONLY_KERNELS",
    "KERNELS",
    "OptimizerKind",
    "backend",
    "warm_up",
]

KERNELS = (
    "bloom_add",
    "bloom_query",
    "clear_flags",
    "combine_backward",
    "dequantize_rows",
    "fill_normal",
    "fill_uniform",
    "gather_combine",
    "group_positions",
    "hash_find",
    "hash_insert",
    "hash_remove",
    "merge_newest",
    "probe_gather",
    "probe_gather_combine",
    "probe_gather_combine_dequantized",
    "probe_gather_combine_widened",
    "probe_gather_dequantized",
    "probe_gather_widened",
    "quantize_rows",
    "round_rows",
    "search_gather_combine_dequantized",
    "search_gather_dequantized",
    "segment_sum_apply",
    "segment_sum_apply_lowp",
    "sketch_add",
    "stamp_gather_pulled",
    "stamp_pushed",
    "unique_inverse",
    "unique_rows",
    "unique_sampled",
    "victim_candidates",
    "widen_rows",
)
# Host backends: numpy arrays in and out, present wherever evdb installs. The parity suite
# runs every one of them against "reference" on numpy inputs.
BACKENDS = ("reference", "cpu")
# Device backends: arrays live on the device; they need an optional install and hardware.
DEVICE_BACKENDS = ("gpu",)
# Kernels of the host backends only, which device backends need not export: the lookups in a
# frozen (quantised serving) table, a memory-mapped file that no device tier holds, and a
# recorded pull's sampled dedup (a key trace records on the host).
HOST_ONLY_KERNELS = (
    "search_gather_combine_dequantized",
    "search_gather_dequantized",
    "unique_sampled",
)


class OptimizerKind:
    """The codes of ``segment_sum_apply``'s ``kind``: which update rule a row gets.

    Part of the kernels' shared signature, so every backend and ``evdb.optim`` read them from
    here; ``evdb/kernels/reference/optim.py`` specifies each rule, its ``hyper`` scalars and
    its slot layout. Plain ints (not an enum): they are passed to numba and CUDA as int64.
    """

    SGD = 0
    ADAGRAD = 1
    ADAM = 2
    FTRL = 3
    GROUP_FTRL = 4
    ADAGRAD_DECAY = 5
    ROWWISE_ADAGRAD = 6
    COUNT = 7


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


def warm_up(
    *, processes: int | None = None, progress: Callable[[Compiled], None] | None = None
) -> WarmUp:
    """Compile every cpu kernel now, into numba's on-disk cache, in ``processes`` worker
    processes (default: one per core); what ``evdb warmup`` runs. The cpu kernels otherwise
    compile on first use, once per machine. See :mod:`evdb.kernels.warmup`.

    Examples
    --------
    An image builder's step, after ``pip install``::

        python -c "import evdb.kernels; print(evdb.kernels.warm_up())"
    """
    from evdb.kernels import warmup

    return warmup.warm_up(processes=processes, progress=progress)
