"""CUDA kernels through cupy: the names and argument order of ``evdb.kernels.reference``.

Arrays are cupy arrays on the current device, C-contiguous, of the reference's dtypes;
outputs are written in place. Scalars may be Python or numpy numbers. Kernels that return a
count (``probe_gather``, ``probe_gather_combine``, ``unique_inverse``, ``unique_rows``, the
stamps, ``victim_candidates``, ``merge_newest``) copy it to the host, which waits for the
device; ``hash_insert`` also waits, to check that every key found room. The others only
enqueue work on cupy's current stream.

The CUDA C sources are ``evdb/kernels/cuda/*.cu``, one per concern like the reference's
modules (index, bags, optim, init, stamp, evict, merge), each opening with its memory layout,
atomics and races. They are compiled by NVRTC through ``cupy.RawModule`` on first use, once
per device (``runtime.cuda_kernel`` is memoised by device id) and cached on disk by cupy
across processes. The wrappers are grouped by family: ``index`` (hash index, dedup, sketch,
Bloom filter), ``init``, ``bags``, ``optim`` (the fused update) and ``rows`` (stamps,
eviction candidates, merge); ``runtime`` holds what they share.

Host-side steps that stay with cupy, where a hand kernel would buy nothing:

* ``unique_inverse`` / ``unique_rows``: the prefix sum that numbers first occurrences
  (``cupy.cumsum``, a CUB scan) between the claim and scatter kernels; likewise the prefix
  sums that give ``victim_candidates`` and ``merge_newest`` their output slots.
* ``group_positions``: one sort of ``inverse * n + position`` (``cupy.sort``, CUB's radix
  sort): the keys are distinct, so the result is the stable order whatever the sort; a hand
  counting sort would need the same ranks, i.e. a sort or a scan per key.
* scratch buffers (``cupy.empty`` / ``cupy.zeros`` from cupy's memory pool).

cupy is imported only when a kernel runs, so ``import evdb.kernels.gpu`` works without it;
``require()`` (which ``backend("gpu")`` calls) raises :class:`~evdb.errors.ConfigError` with
install advice when cupy or a CUDA device is missing.
"""

from __future__ import annotations

from evdb.kernels.gpu.bags import combine_backward, gather_combine, probe_gather_combine
from evdb.kernels.gpu.index import (
    bloom_add,
    bloom_query,
    hash_find,
    hash_insert,
    hash_remove,
    probe_gather,
    sketch_add,
    unique_inverse,
    unique_rows,
)
from evdb.kernels.gpu.init import fill_normal, fill_uniform
from evdb.kernels.gpu.lowp import (
    dequantize_rows,
    probe_gather_combine_dequantized,
    probe_gather_combine_widened,
    probe_gather_dequantized,
    probe_gather_widened,
    quantize_rows,
    round_rows,
    segment_sum_apply_lowp,
    widen_rows,
)
from evdb.kernels.gpu.optim import group_positions, segment_sum_apply
from evdb.kernels.gpu.rows import (
    clear_flags,
    merge_newest,
    stamp_gather_pulled,
    stamp_pushed,
    victim_candidates,
)
from evdb.kernels.gpu.runtime import (
    BLOCK,
    CUDA_DIR,
    NVRTC_OPTIONS,
    SHARED_BYTES,
    SOURCES,
    require,
    source_text,
)

__all__ = [
    "BLOCK",
    "CUDA_DIR",
    "NVRTC_OPTIONS",
    "SHARED_BYTES",
    "SOURCES",
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
    "require",
    "round_rows",
    "segment_sum_apply",
    "segment_sum_apply_lowp",
    "sketch_add",
    "source_text",
    "stamp_gather_pulled",
    "stamp_pushed",
    "unique_inverse",
    "unique_rows",
    "victim_candidates",
    "widen_rows",
]
