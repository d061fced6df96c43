"""A ``Table``'s reads that create no row and count nothing: ``lookup`` (plain and bagged),
``contains`` and whole-record reads, over the top tier and the tiers below it.

``Table`` keeps the public methods and their documentation; these functions are their bodies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from evdb._types import BoolArray, Float32Array, Int64Array
from evdb.bags import parse_bags
from evdb.errors import InvalidArgumentError
from evdb.kernels import cpu
from evdb.records import FIELDS, RecordBatch

if TYPE_CHECKING:
    from evdb.table import Table

__all__ = ["contains", "lookup", "promote", "read_records"]


def lookup(
    table: Table,
    keys: Any,
    offsets: Any,
    weights: Any,
    combiner: str | None,
    max_norm: float | None,
    out: Float32Array | None,
    promote: bool,
    found: BoolArray | None,
    min_live: int,
    later: list[Int64Array] | None = None,
) -> Float32Array:
    """``Table.lookup`` (see there). It changes nothing unless ``promote`` (the caller holds
    the database alone then): readers share it. ``later``, if given, collects the keys of the
    rows read from disk, for ``promote`` to cache once the caller may write."""
    k = table._keys(keys)
    n = k.shape[0]
    plain = offsets is None and weights is None and combiner is None and max_norm is None
    bags = None if plain else parse_bags(n, offsets, weights, combiner, max_norm)
    shape = (n if bags is None else bags.n_bags, table.dim)
    if out is None:
        out = np.empty(shape, dtype=np.float32)
    elif out.shape != shape or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise InvalidArgumentError(
            f"out must be a C-contiguous float32 array of shape {shape}, "
            f"got {out.dtype} {out.shape}"
        )
    if found is not None and (found.shape != (n,) or found.dtype != np.bool_):
        raise InvalidArgumentError(
            f"found must be a bool array of shape {(n,)}, got {found.dtype} {found.shape}"
        )
    if bags is not None and table._chain.has_rows_below and (table._dram.locate(k) < 0).any():
        # Some rows may be on disk: read them all, then combine (the fused kernel reads
        # the DRAM tier only).
        values = lookup(table, k, None, None, None, None, None, promote, found, min_live, later)
        cpu.gather_combine(
            values,
            np.arange(n, dtype=np.int64),
            bags.bounds,
            bags.weights,
            bags.combiner,
            bags.max_norm,
            out,
        )
        return out
    if bags is not None:
        kind, seed, a, b = _default_params(table)
        cpu.probe_gather_combine(
            table._dram.index.slots,
            table._dram.values,
            table._dram.last_step,
            k,
            bags.bounds,
            bags.weights,
            min_live,
            bags.combiner,
            bags.max_norm,
            kind,
            np.uint64(seed),
            a,
            b,
            out,
        )
        if found is not None:
            found[:] = contains(table, k, min_live)
        return out
    try:  # a probe buffer of this table's that no other lookup is using (list.pop is atomic)
        rows = table._out_rows.pop()
    except IndexError:
        rows = np.empty(0, dtype=np.int64)
    if rows.shape[0] < n:
        rows = np.empty(n, dtype=np.int64)
    missing = table._dram.probe_gather(k, min_live, out, rows[:n])
    # Readers count at once without a lock: each ``counters[name] += n`` (str key, int value)
    # runs without an eval-breaker check between its read and its write, so CPython's GIL
    # is not handed over in between and no count is lost (a lock here cost 0.35 us a call).
    table._chain.count_cache_reads(n - missing, missing)
    if found is not None:
        np.greater_equal(rows[:n], 0, out=found)
    if missing:
        miss = rows[:n] < 0
        if table._chain.has_rows_below:
            out[miss], have = _read_below(table, k[miss], promote, later, min_live)
            if found is not None:
                found[miss] = have
        else:
            out[miss] = table.defaults(k[miss])
    table._out_rows.append(rows)
    return out


def _default_params(table: Table) -> tuple[int, int, float, float]:
    dv = table.config.default_value
    if dv == "init":
        return table.config.initializer.kernel_params()
    return 0, 0, float(dv), 0.0


def _read_below(
    table: Table, keys: Int64Array, promote: bool, later: list[Int64Array] | None, min_live: int
) -> tuple[Float32Array, BoolArray]:
    """Values of keys the DRAM tier lacks: their rows below where live, else defaults,
    and which keys had a live row; with ``promote``, the rows found are cached (clean);
    with ``later``, their keys are added to it."""
    uniq, inverse = np.unique(keys, return_inverse=True)
    values = np.empty((uniq.shape[0], table.dim), dtype=np.float32)
    have = np.zeros(uniq.shape[0], dtype=bool)
    found, records = _fetch(table, uniq)
    if records is not None and len(records):
        live = records.last_step >= min_live
        at = np.flatnonzero(found)[live]
        values[at] = records.values[live]
        have[at] = True
        if promote and at.size:
            _cache(table, uniq[at], records.take(live))
        elif later is not None and at.size:
            later.append(uniq[at])
    if not have.all():  # defaults only where no row was found (they cost a hash each)
        values[~have] = table.defaults(uniq[~have])
    inverse = inverse.ravel()
    return values[inverse], have[inverse]


def promote(table: Table, keys: Int64Array) -> None:
    """Cache (clean) the live rows below of keys the DRAM tier still lacks: what a shared
    lookup read from disk, promoted by its caller once it holds the database alone (read
    again: a writer may have changed them in between). A cache fill: a closed database
    skips it."""
    if table._db._closed or not table._chain.has_rows_below:
        return
    uniq = np.unique(keys)
    uniq = uniq[table._dram.locate(uniq) < 0]
    found, records = _fetch(table, uniq)
    if records is None or len(records) == 0:
        return
    live = records.last_step >= table._min_live()
    at = np.flatnonzero(found)[live]
    if at.size:
        _cache(table, uniq[at], records.take(live))


def _cache(table: Table, keys: Int64Array, records: RecordBatch) -> None:
    """Cache rows read from below (clean), then evict down to the watermark: the rows just
    cached are not victims of their own promotion."""
    rows = table._chain.promote(keys, records, dirty=False)
    table._chain.evict(table._db.step, table._min_live(), protect=rows)


def _fetch(table: Table, keys: Int64Array) -> tuple[BoolArray, RecordBatch | None]:
    """``TierChain.fetch`` for a reader: readers sharing the database take turns below (the
    disk tier's read-ahead and counters are not safe to share)."""
    with table._below:
        return table._chain.fetch(keys)


def contains(table: Table, keys: Any, min_live: int) -> BoolArray:
    """``Table.contains`` (see there)."""
    k = table._keys(keys)
    rows = table._dram.locate(k)
    live = rows >= 0
    live[table._expired(rows, min_live)] = False
    uncached = np.flatnonzero(rows < 0)
    if uncached.size and table._chain.has_rows_below:
        found, records = _fetch(table, k[uncached])
        if records is not None:
            live[uncached[found]] = records.last_step >= min_live
    return live


def read_records(table: Table, keys: Any, min_live: int) -> tuple[BoolArray, RecordBatch]:
    """``Table.read_records`` (see there)."""
    k = table._keys(keys)
    rows = table._dram.locate(k)
    uncached = np.flatnonzero(rows < 0)  # an expired cached row hides its copy below
    rows[table._expired(rows, min_live)] = -1
    found = rows >= 0
    parts = [(np.flatnonzero(found), table._dram.read(rows[found]))]
    if uncached.size and table._chain.has_rows_below:
        hit, records = _fetch(table, k[uncached])
        if records is not None:
            live = records.last_step >= min_live
            at = uncached[hit][live]
            found[at] = True
            parts.append((at, records.take(live)))
    order = np.argsort(np.concatenate([p[0] for p in parts]), kind="stable")
    merged = RecordBatch(
        *(np.concatenate([getattr(p[1], f) for p in parts])[order] for f in FIELDS)
    )
    return found, merged
