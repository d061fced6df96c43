"""Numba versions of the kernels in ``evdb.kernels.reference``: same names, same argument order.

Every kernel has an explicit signature and ``nogil=True, cache=True``, and compiles on its
first call (``_common.Kernel``): a process pays only for the kernels it uses, once per machine,
and loads them from numba's on-disk cache after that. ``evdb warmup`` compiles them all ahead
of time (``evdb.kernels.warm_up``).
Parallel kernels (``prange``) use numba's thread pool; NUMBA_NUM_THREADS caps it. Kernels with
a serial and a parallel variant pick one by batch size (``PARALLEL_MIN_KEYS``).
"""

from __future__ import annotations

from evdb.kernels.cpu import _cache  # noqa: F401 (first: it drops a stale kernel cache)
from evdb.kernels.cpu.bags import combine_backward, gather_combine, probe_gather_combine
from evdb.kernels.cpu.evict import victim_candidates
from evdb.kernels.cpu.frozen import search_gather_combine_dequantized, search_gather_dequantized
from evdb.kernels.cpu.index import (
    bloom_add,
    bloom_query,
    hash_find,
    hash_insert,
    hash_remove,
    probe_gather,
    sketch_add,
    unique_inverse,
    unique_rows,
    unique_sampled,
)
from evdb.kernels.cpu.init import fill_normal, fill_uniform
from evdb.kernels.cpu.lowp import round_rows, widen_rows
from evdb.kernels.cpu.lowp_gather import (
    probe_gather_combine_dequantized,
    probe_gather_combine_widened,
    probe_gather_dequantized,
    probe_gather_widened,
)
from evdb.kernels.cpu.lowp_optim import segment_sum_apply_lowp
from evdb.kernels.cpu.merge import merge_newest
from evdb.kernels.cpu.optim import group_positions, segment_sum_apply
from evdb.kernels.cpu.quantize import dequantize_rows, quantize_rows
from evdb.kernels.cpu.stamp import clear_flags, stamp_gather_pulled, stamp_pushed

__all__ = [
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
]
