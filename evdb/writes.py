"""A ``Table``'s direct writes, which bypass admission: ``upsert`` and ``delete``.

``Table`` keeps the public methods and their documentation; these functions are their bodies.
They share the row mechanics of the training path (TTL, promotion, fresh records) through
the Table's private helpers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from evdb._types import Int64Array
from evdb.arrays import float_matrix
from evdb.errors import CapacityError
from evdb.records import FROZEN, RecordBatch

if TYPE_CHECKING:
    from evdb.table import Table

__all__ = ["delete", "upsert"]


def upsert(table: Table, keys: Any, values: Any, freeze: bool | None) -> None:
    """``Table.upsert`` (see there)."""
    table._db.check_writable()
    k = table._keys(keys)
    v = float_matrix(values, (k.shape[0], table.dim), "values")
    uniq, inverse, _ = table._dedup.unique(k)
    new_strings = None if table._strings is None else table._strings.check(uniq)
    last = np.zeros(uniq.shape[0], dtype=np.int64)
    np.maximum.at(last, inverse, np.arange(k.shape[0], dtype=np.int64))
    v = v[last]
    _check_room(table, uniq, "keys")
    if table._strings is not None:  # first: a write that fails here has changed no row
        table._strings.store(new_strings, uniq)
    version = table._bump_version()
    rows = table._drop_expired(table._dram.locate(uniq))
    table._promote_misses(uniq, rows)  # a row on disk keeps its slots and freq
    have = rows >= 0
    r = rows[have]
    table._dram.values[r] = v[have]
    table._dram.last_step[r] = table._db.step
    table._dram.version[r] = version
    table._dram.is_dirty[r] = True
    if freeze is not None:
        table._dram.flags[r] = FROZEN if freeze else 0
    if not have.all():
        new_keys = uniq[~have]
        zero = np.zeros(new_keys.shape[0], dtype=np.int64)
        records = table._fresh_records(new_keys, v[~have], zero, version)
        if freeze:
            records.flags[:] = FROZEN
        rows[~have] = table._chain.create(new_keys, records)
    table._changes.touched(uniq)
    table._admission.forget(uniq)
    # Without a disk tier, the rows just written are not victims of their own insert;
    # with one, they may go straight down to it.
    protect = None if table._chain.spill else rows
    table._evict_after_write("upsert", protect)


def _check_room(table: Table, keys: Int64Array, arg: str) -> None:
    """Raise before any change if keys cannot all be resident with the pinned batch."""
    cap = table._dram.capacity_rows
    if cap is None or table._chain.spill:
        return
    rows = table._live_rows(keys)
    found = rows >= 0
    pinned_here = np.zeros(rows.shape[0], dtype=bool)
    pinned_here[found] = table._dram.is_pinned[rows[found]]
    extra = int(np.count_nonzero(~pinned_here))
    pinned = table._dram.n_pinned(table._min_live())
    if pinned + extra > cap:
        raise CapacityError(
            f"{arg}: {keys.shape[0]} distinct keys plus {pinned} rows of the batch in "
            f"flight need {pinned + extra} resident rows, more than dram_rows={cap}, and "
            "this table has no lower tier to spill to"
        )


def delete(table: Table, keys: Any) -> int:
    """``Table.delete`` (see there)."""
    table._db.check_writable()
    k = table._keys(keys)
    uniq, _, _ = table._dedup.unique(k)
    rows = table._dram.locate(uniq)
    cached = rows >= 0
    n_live = int(np.count_nonzero(cached & ~table._expired(rows)))
    table._chain.remove_rows(rows[cached])
    if not cached.all() and table._chain.has_rows_below:
        _, records = table._chain.remove_uncached(uniq[~cached])
        if records is not None:
            n_live += int(np.count_nonzero(records.last_step >= table._min_live()))
    table._admission.forget(uniq)
    if table._strings is not None:
        table._strings.remove(uniq)
    if n_live:
        table._bump_version()
    return n_live


def restore_records(table: Table, keys: Int64Array, records: RecordBatch) -> None:
    """``Table.restore_records`` (see there)."""
    n = keys.shape[0]
    if n == 0:
        return
    cap = table._dram.capacity_rows
    if cap is not None and not table._chain.spill and len(table._dram) + n > cap:
        raise CapacityError(
            f"keys: {len(table._dram) + n} rows do not fit dram_rows={cap} of table "
            f"{table.name!r}, which has no lower tier to spill to"
        )
    table._chain.create(keys, records)
    table._changes.touched(keys)  # new rows: the next publication carries them
    table.meta.version = max(table.meta.version, int(records.version.max()))
    table._chain.evict(table._db.step, table._min_live())
