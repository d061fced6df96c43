"""The DRAM tier: the cache tier (``evdb.tiers.cache.ColumnCache``) on numpy columns with the
cpu kernels, and the way its columns grow.

The slabs grow by 1.5x. Past ``RESERVE_FROM_ROWS`` rows each column is a prefix of an anonymous
mapping reserved far ahead (16 GiB of address space, not memory: the kernel maps a page on its
first write), so growing is taking a longer prefix: no row is copied. Growing by copying every
column stalled a step of a table growing to 1M rows (dim 64, Adagrad) for 400-600 ms at each
1.5x; it still stands where the system refuses the reservation, and below the threshold.
"""

from __future__ import annotations

import contextlib
import mmap
import sys

import numpy as np

from evdb.config import DramConfig
from evdb.kernels import backend
from evdb.tiers.cache import ColumnCache
from evdb.tiers.cache_lowp import LowpColumnCache

__all__ = ["RESERVE_FROM_ROWS", "dram_tier"]

RESERVE_FROM_ROWS = 1 << 16  # smaller slabs grow by copying (cheap); bigger ones by reservation
_RESERVE_BYTES = 16 << 30  # address space reserved per column (doubled when outgrown)
_MAP_NORESERVE = 0x4000  # Linux's flag (the mmap module does not name it): reserve, don't commit
_HUGE_FROM = 64 << 20  # bytes of a column on 4 KiB pages before huge pages are asked for


def _reserve(column: np.ndarray, rows: int) -> np.ndarray | None:
    """A zeroed array of ``rows`` rows shaped like column's, over an anonymous mapping whose
    pages the kernel provides on first write; None where the system refuses the reservation
    (not Linux, strict overcommit, no address space)."""
    width = int(np.prod(column.shape[1:], dtype=np.int64))
    if sys.platform != "linux" or width == 0:
        return None
    try:
        mapping = mmap.mmap(
            -1,
            rows * width * column.dtype.itemsize,
            flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE,
        )
    except (OSError, ValueError, OverflowError):
        return None
    if hasattr(mmap, "MADV_HUGEPAGE") and len(mapping) > _HUGE_FROM:
        # 2 MiB pages past the first 64 MiB (numpy asks the same for its own big arrays): a
        # random row of a big table then costs no 4 KiB TLB walk (lookup of 65,536 keys in a
        # 10M-row table: 21-24 -> 35-40M keys/s). Not below it: moving a slab in at 65,536 rows
        # then faulted 2 MiB pages for every column at once (a 170 ms step in bench_growth).
        with contextlib.suppress(OSError):
            mapping.madvise(mmap.MADV_HUGEPAGE, _HUGE_FROM, len(mapping) - _HUGE_FROM)
    return np.frombuffer(mapping, dtype=column.dtype).reshape(rows, *column.shape[1:])


class _Reservations:
    """Grows the DRAM tier's columns: a copy below ``RESERVE_FROM_ROWS`` rows (cheap), a
    longer prefix of a reservation above it (no row is copied)."""

    def __init__(self) -> None:
        self.reserved: dict[str, np.ndarray] = {}

    def grow(self, name: str, col: np.ndarray, cap: int) -> np.ndarray:
        """Column ``name`` with room for cap rows: a longer prefix of its reservation, or a
        copy into a new array (zeroed where it is a bool column)."""
        reserved = self.reserved.get(name)
        if reserved is None or reserved.shape[0] < cap or reserved.dtype != col.dtype:
            if cap >= RESERVE_FROM_ROWS:
                row_bytes = max(1, col.itemsize * int(np.prod(col.shape[1:], dtype=np.int64)))
                reserved = _reserve(col, max(2 * cap, _RESERVE_BYTES // row_bytes))
            if reserved is None or reserved.shape[0] < cap:
                alloc = np.zeros if col.dtype == bool else np.empty
                grown = alloc((cap, *col.shape[1:]), dtype=col.dtype)
                grown[: col.shape[0]] = col
                return grown
            reserved[: col.shape[0]] = col  # once per reservation: moving in
            self.reserved[name] = reserved
        return reserved[:cap]


def dram_tier(
    dim: int,
    n_slots: int,
    config: DramConfig,
    *,
    dtype: str = "float32",
    stochastic: bool = True,
    seed: int = 0,
    slot_dtype: str = "float32",
) -> ColumnCache:
    """The DRAM tier of a table: rows in process memory, the top of the chain (or the tier
    under an HBM tier), numpy columns grown by reservation, the cpu kernels. Values stored in
    ``dtype`` (bfloat16 / float16: ``LowpColumnCache``, rounding stochastically on push with
    ``seed`` unless ``stochastic`` is False), optimizer slots in ``slot_dtype`` ("float32",
    or ``dtype``)."""
    grow = _Reservations().grow
    if dtype != "float32":
        return LowpColumnCache(
            dim, n_slots, config, dtype=dtype, stochastic=stochastic, seed=seed, name="dram",
            device="cpu", grow=grow, slot_dtype=slot_dtype,
        )  # fmt: skip
    return ColumnCache(
        dim,
        n_slots,
        config,
        name="dram",
        device="cpu",
        xp=np,
        kernels=backend("cpu"),
        grow=grow,
    )
