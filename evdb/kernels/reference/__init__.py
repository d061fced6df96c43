"""Every kernel in plain numpy (and, where numpy cannot say it, plain Python): the specification.

Slow, obvious and commented. ``cpu`` (numba) and ``gpu`` (CUDA) implement the same
names with the same argument order, and ``tests/kernels/test_parity.py`` compares them with these
functions on random inputs. Where a kernel's result depends on layout (the slots a key lands in),
the reference states the *observable* contract instead: what ``hash_find`` returns after
``hash_insert``, not which slot was used.

Outputs come last and are written in place (``out``). One module per concern: ``index``
(hash index), ``init`` (initializers), ``bags`` (combiners), ``optim`` (fused updates),
``stamp`` (a pull's and a push's row bookkeeping), ``evict`` (victim candidates) and ``merge``
(the newer of two sorted row sets).
"""

from __future__ import annotations

from evdb.kernels.reference.bags import combine_backward, gather_combine, probe_gather_combine
from evdb.kernels.reference.evict import victim_candidates
from evdb.kernels.reference.frozen import (
    search_gather_combine_dequantized,
    search_gather_dequantized,
)
from evdb.kernels.reference.index import (
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
from evdb.kernels.reference.init import fill_normal, fill_uniform
from evdb.kernels.reference.lowp import (
    dequantize_rows,
    probe_gather_combine_dequantized,
    probe_gather_combine_widened,
    probe_gather_dequantized,
    probe_gather_widened,
    quantize_rows,
    round_rows,
    widen_rows,
)
from evdb.kernels.reference.lowp_optim import segment_sum_apply_lowp
from evdb.kernels.reference.merge import merge_newest
from evdb.kernels.reference.optim import group_positions, segment_sum_apply
from evdb.kernels.reference.stamp import clear_flags, stamp_gather_pulled, stamp_pushed

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
