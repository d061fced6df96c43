"""Numba merge of two sorted row sets, the newer winning (see ``reference.merge``): one linear
pass that releases the GIL, so a server folding a delta into its overlay leaves the request
threads running on the other cores. The numpy version (a stable sort of both key sets and
gathers holding the GIL) made lookups during an apply wait for it."""

from __future__ import annotations

from evdb.kernels.cpu._common import B1, F4_2D, I8, i8, lazy_njit


@lazy_njit(i8(I8, F4_2D, I8, B1, I8, F4_2D, I8, B1, I8, F4_2D, I8, B1))
def merge_newest(  # type: ignore[no-untyped-def]
    a_keys,
    a_values,
    a_steps,
    a_removed,
    b_keys,
    b_values,
    b_steps,
    b_removed,
    out_keys,
    out_values,
    out_steps,
    out_removed,
):
    na, nb, dim = a_keys.shape[0], b_keys.shape[0], out_values.shape[1]
    i = j = m = 0
    while i < na or j < nb:
        take_b = j < nb and (i >= na or b_keys[j] <= a_keys[i])
        if take_b:
            if i < na and a_keys[i] == b_keys[j]:
                i += 1  # the same key in both: the newer row replaces the older
            out_keys[m] = b_keys[j]
            for c in range(dim):
                out_values[m, c] = b_values[j, c]
            out_steps[m] = b_steps[j]
            out_removed[m] = b_removed[j]
            j += 1
        else:
            out_keys[m] = a_keys[i]
            for c in range(dim):
                out_values[m, c] = a_values[i, c]
            out_steps[m] = a_steps[i]
            out_removed[m] = a_removed[i]
            i += 1
        m += 1
    return m
