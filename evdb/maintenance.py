"""A ``Table``'s whole-table operations: ``compact`` (the cached rows, then a scan of the rows
only on disk), the ``items`` scan and the ``stats`` report.

``Table`` keeps the public methods and their documentation; these functions are their bodies.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

from evdb._types import Float32Array, Int64Array
from evdb.errors import ConcurrentModificationError, InvalidArgumentError
from evdb.records import RecordBatch

if TYPE_CHECKING:
    from evdb.table import Table

__all__ = ["compact", "items", "records", "scan", "stats"]

_SCAN_ROWS = 65536  # rows only on disk are judged a chunk of this many at a time


def compact(table: Table) -> dict[str, int]:
    """``Table.compact`` (see there)."""
    table._db.check_writable()
    table._db.check_open()
    min_live = table._min_live()
    threshold = table.config.l2_threshold
    live = table._dram.live_rows()
    expired = table._dram.last_step[live] < min_live
    weak = np.zeros_like(expired)
    if threshold is not None:
        weak[~expired] = np.linalg.norm(table._dram.values[live[~expired]], axis=1) < threshold
    table._chain.remove_rows(live[expired | weak])
    n_expired, n_l2 = int(np.count_nonzero(expired)), int(np.count_nonzero(weak))
    if table._chain.has_rows_below:
        below_expired, below_l2 = _compact_below(table, min_live, threshold)
        n_expired += below_expired
        n_l2 += below_l2
    forgotten = 0
    if table.config.ttl_steps is not None:
        forgotten = table._admission.compact(min_live)
    if table._strings is not None:  # strings whose row is gone (by any rule, any time)
        table._strings.drop_orphans(table.contains)
    if n_expired or n_l2:
        table._bump_version()
    return {"expired": n_expired, "l2": n_l2, "admission_forgotten": forgotten}


def _compact_below(table: Table, min_live: int, threshold: float | None) -> tuple[int, int]:
    """Remove the expired and weak rows that are only on disk, a chunk at a time; returns
    how many of each went."""
    assert table._chain.backing is not None
    n_expired = n_l2 = 0
    for keys, records in table._chain.backing.scan(_SCAN_ROWS):
        mine = table._dram.locate(keys) < 0  # a cached copy was judged by the caller
        dead = mine & (records.last_step < min_live)
        drop = dead.copy()
        if threshold is not None:
            drop |= mine & ~dead & (np.linalg.norm(records.values, axis=1) < threshold)
        if drop.any():
            table._chain.remove_fetched(keys[drop], records.last_step[drop])
        n_expired += int(np.count_nonzero(dead))
        n_l2 += int(np.count_nonzero(drop & ~dead))
    return n_expired, n_l2


def items(table: Table, chunk_rows: int) -> Iterator[tuple[Int64Array, Float32Array]]:
    """``Table.items`` (see there). A generator: like the method before it, it checks its
    argument at the first ``next``, not at the call."""
    if isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 1:
        raise InvalidArgumentError(f"chunk_rows must be an int >= 1, got {chunk_rows!r}")
    with _reading(table):
        table._db.check_open()
        min_live = table._min_live()
    for keys, records in scan(table, chunk_rows, strict=True):
        live = records.last_step >= min_live
        if live.any():
            yield keys[live], records.values[live]


def scan(
    table: Table, chunk_rows: int, *, strict: bool
) -> Iterator[tuple[Int64Array, RecordBatch]]:
    """Every row once (expired ones too), a chunk at a time, as ``TierChain.scan``, each chunk
    read holding the database's lock (shared), never across a ``yield`` (a generator left
    unfinished would keep writers out for good).

    A write to the database between two chunks (``RWLock.writes`` moved: rows may have moved
    between tiers) could make the scan miss or repeat rows: with ``strict`` the next chunk
    raises ``ConcurrentModificationError``; without, the scan goes on (a sample, a dashboard). A
    scan inside its caller's exclusive hold (checkpoint, publish) sees only its own writes."""
    lock = table._rwlock
    own = lock.held_exclusive()
    chunks = table._chain.scan(chunk_rows)  # a generator: it reads nothing until next()
    writes = lock.writes
    while True:
        with _reading(table):
            table._db.check_open()  # a closed store cannot be read
            if strict and not own and lock.writes != writes:
                raise ConcurrentModificationError(
                    f"table {table.name!r} changed while it was being scanned (a write to the "
                    "database came between two chunks of items()); iterate again, or hold the "
                    "writes until the scan ends"
                )
            chunk = next(chunks, None)
            writes = lock.writes
        if chunk is None:
            return
        yield chunk


def records(
    table: Table,
    chunk_rows: int,
    live_only: bool,
    since_version: int | None,
    strict: bool,
    step: int | None,
) -> Iterator[tuple[Int64Array, RecordBatch]]:
    """``Table.records`` (see there)."""
    if isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 1:
        raise InvalidArgumentError(f"chunk_rows must be an int >= 1, got {chunk_rows!r}")
    min_live = table._min_live(step)
    for keys, recs in scan(table, chunk_rows, strict=strict):
        keep = None
        if live_only:
            keep = recs.last_step >= min_live
        if since_version is not None:
            newer = recs.version > np.uint64(since_version)
            keep = newer if keep is None else keep & newer
        if keep is not None and not keep.all():
            keys, recs = keys[keep], recs.take(keep)
        if keys.shape[0]:
            yield keys, recs


def stats(table: Table) -> dict[str, Any]:
    """``Table.stats`` (see there)."""
    policy = table.config.admission
    return {
        "name": table.name,
        "dim": table.dim,
        "rows": len(table),
        "step": table._db.step,
        "version": table.meta.version,
        "pushes": table.meta.pushes,
        "tiers": table._chain.stats(),
        "scratch_bytes": int(table._dedup.nbytes + sum(b.nbytes for b in list(table._out_rows))),
        "admission": {
            "policy": policy.kind,
            "min_count": policy.min_count,
            "not_admitted": table.meta.counters["not_admitted"],
            **table._admission.stats(),
        },
        "expired_on_pull": table.meta.counters["expired_on_pull"],
        "dropped_gradients": table.meta.counters["dropped_gradients"],
        "frozen_gradients": table.meta.counters["frozen_gradients"],
        "pulls_not_pushed": table.meta.counters["pulls_not_pushed"],
        "changelog": table._changes.stats(),
    }


@contextmanager
def _reading(table: Table) -> Iterator[None]:
    """The database's lock, as ``evdb.locking.reading`` takes it, around one chunk of a scan."""
    lock = table._rwlock
    nested = lock.acquire_shared()
    alone = False
    try:
        if not nested and table._reads_mutate():
            lock.release_shared()
            lock.acquire_exclusive()
            alone = True
        yield
    finally:
        if alone:
            lock.release_exclusive()
        else:
            lock.release_shared()
