"""The trainer's side of freshness: ``Database.publish`` and the log servers follow.

``Database.publish(root)`` writes one publication of every table into the publish root
(``evdb.publish_root`` describes the root: HEAD, the publication directories, their
manifests and the delta files); a server (``evdb serve ROOT --follow``, ``evdb.api.follow``)
serves the newest one. Each database's ``Publisher`` remembers its last publication.

A full publication is a values-only serving snapshot (SGD: no slots, no admission) that keeps
each row's ``last_step`` and the table's ``ttl_steps``, so that the server's TTL verdicts
match the trainer's at every step. A delta holds the rows whose version rose since the
parent, and the keys whose rows left every tier since (``delete``, ``compact()``, TTL expiry,
L2 pruning, eviction without a disk tier). String tables publish their hashed keys; the
original strings are not published (serving hashes the strings it is sent).

How a delta stays proportional to what changed: each table keeps a bounded
:class:`evdb.changelog.ChangeLog` of touched and removed keys, started by the first
publication to a root; a delta reads the current rows of the touched keys, never a scan. A
publication is full when it cannot be exact as a delta: the first to a root (or after a
restart of the trainer, whose logs are in memory), ``full=True``, a log that overflowed, a
table created or dropped since, HEAD moved by someone else, or deltas since the last full
adding up to more than ``REBASE_FRACTION`` of the live rows and ``REBASE_MIN_ROWS`` (a
follower's overlay of changed rows is rebased onto the new full, so this bounds its memory).
The reason is returned.

The change logs are emptied only after HEAD is replaced, so a failed publication loses
nothing: the next one carries it. Retention (``keep=K``): publications older than the K-th
newest full one are removed after HEAD moves.

Sharded databases (``evdb.distributed``) publish into the same kind of root: each rank
writes its part, and rank 0 merges the parts into one ordinary publication
(``evdb.distributed.publish``), so a follower needs no notion of shards.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from evdb import checkpoint as _checkpoint
from evdb._types import Int64Array
from evdb.config import DiskConfig, TableConfig
from evdb.database import open as open_database
from evdb.errors import CorruptDataError, InvalidArgumentError
from evdb.optim import SGD
from evdb.publish_root import (
    HEAD,
    Delta,
    RootLock,
    Written,
    check_publication,
    clear_stale,
    list_publications,
    load_delta,
    publication_dir,
    read_head,
    retain,
    table_entry,
    write_publication,
)
from evdb.records import RecordBatch
from evdb.storage import CHECKPOINTS, WORKING

if TYPE_CHECKING:
    from evdb.database import Database
    from evdb.table import Table

__all__ = [
    "DEFAULT_KEEP",
    "HEAD",
    "REBASE_FRACTION",
    "REBASE_MIN_ROWS",
    "Delta",
    "LastPublication",
    "Publisher",
    "RowChunks",
    "check_arguments",
    "check_publication",
    "list_publications",
    "live_chunks",
    "load_delta",
    "publication_dir",
    "publish",
    "read_head",
    "write_delta",
    "write_full_rows",
]

DEFAULT_KEEP = 2  # full publications kept (and every delta after the oldest of them)
REBASE_FRACTION = 0.5  # deltas since the last full above this share of the rows: a new full
REBASE_MIN_ROWS = 65536  # ... and above this many rows (an overlay this small costs nothing)
_CHUNK_ROWS = 65536


@dataclass(frozen=True)
class LastPublication:
    """What a database remembers of its last publication (in memory: a restarted trainer
    publishes a full one first, since its change logs are new)."""

    root: Path
    seq: int
    digest: str  # xxh3-128 of its MANIFEST.json: the next delta's parent link
    full: int  # the seq of the full publication it chains to
    rows_since_full: int  # changed rows this database published since that full
    tables: dict[str, str]  # name -> uid: a table created or dropped since makes a full


class Publisher:
    """A database's side of its publications: what it remembers of the last one
    (``last``), whether the next can be an exact delta (``full_reason``), and the writing
    of it (``publish``). ``Database.publisher`` holds one per database; each rank of a
    sharded database judges its shard with its own (``evdb.distributed.publish``).

    Examples
    --------
    >>> import tempfile, evdb
    >>> root = tempfile.mkdtemp()
    >>> with evdb.open(root + "/db") as db:
    ...     _ = db.create_table("user", dim=2)
    ...     _ = db.publish(root + "/pub")
    ...     db.publisher.last.seq, db.publisher.last.full
    (1, 1)
    """

    def __init__(self, db: Database) -> None:
        self.db = db
        self.last: LastPublication | None = None

    def publish(
        self, root: str | os.PathLike[str], *, full: bool | None = None, keep: int = DEFAULT_KEEP
    ) -> dict[str, Any]:
        """``Database.publish`` (see there)."""
        check_arguments(full, keep)
        start = time.perf_counter()
        db = self.db
        root = Path(root).resolve()
        root.mkdir(parents=True, exist_ok=True)
        with RootLock(root):
            head = read_head(root)
            clear_stale(root, head)
            tables = {name: db.table(name) for name in db.tables()}
            reason = self.full_reason(root, head, tables, full)
            if reason is not None and full is False:
                raise InvalidArgumentError(
                    f"full=False, but a delta cannot be exact here: {reason}"
                )

            def write(tmp: Path, entries: dict[str, Any]) -> tuple[int, int]:
                if reason is not None:
                    sources = {name: (t.config, live_chunks(t)) for name, t in tables.items()}
                    return write_full_rows(tmp, db.step, sources, entries)
                tmp.mkdir()
                return write_delta(tmp, tables, entries)

            written = write_publication(root, head, self.chained_full(reason), db.step, write)
            self.remember(root, written, tables, reason, written.rows)
            retain(root, written.seq, keep)
        return written.result(time.perf_counter() - start, reason)

    def full_reason(
        self, root: Path, head: dict[str, Any] | None, tables: dict[str, Table], full: Any
    ) -> str | None:
        """Why the next publication to root of these tables must be a full one; None if a
        delta is exact. ``head`` is the root's HEAD, read under its lock."""
        state = self.last
        if full is True:
            return "asked (full=True)"
        if head is None:
            return "first publication to this root"
        if state is None or state.root != root:
            return "first publication of this database to this root (its change logs start now)"
        if int(head["seq"]) != state.seq:
            return f"HEAD is seq {head['seq']}, this database last published seq {state.seq}"
        parent = publication_dir(root, state.seq) / _checkpoint.MANIFEST
        if not parent.exists() or _checkpoint.file_digest(parent) != state.digest:
            return f"publication {state.seq} is gone or changed"
        now = {n: t.meta.uid for n, t in tables.items()}
        if now != state.tables:
            return "tables created or dropped since the last publication"
        for t in tables.values():
            t.changes.settle()
        overflowed = sorted(n for n, t in tables.items() if t.changes.overflowed)
        if overflowed:
            return f"the change log of {overflowed} overflowed (see stats()['changelog'])"
        pending = sum(t.changes.pending()[0].shape[0] for t in tables.values())
        live = sum(len(t) for t in tables.values())
        if state.rows_since_full + pending > max(REBASE_FRACTION * live, REBASE_MIN_ROWS):
            return "the deltas since the last full add up to more than half the rows (rebase)"
        return None

    def chained_full(self, reason: str | None) -> int | None:
        """The seq of the full publication the next one chains to as a delta; None when it
        is a full one (``reason``, from ``full_reason``, says why)."""
        return None if reason is not None or self.last is None else self.last.full

    def remember(
        self,
        root: Path,
        written: Written,
        tables: dict[str, Table],
        reason: str | None,
        rows: int,
    ) -> None:
        """HEAD moved to ``written``, durable and visible: only now may the tables' change
        logs forget what it carries (or start, after a full one); it becomes ``last``.
        ``rows``: the changed rows of this database's that it carries."""
        for t in tables.values():
            if reason is not None:
                t.changes.start()
            else:
                t.changes.clear()
        since = 0 if reason is not None or self.last is None else self.last.rows_since_full
        self.last = LastPublication(
            root,
            written.seq,
            written.digest,
            written.full,
            since + (0 if reason is not None else rows),
            {n: t.meta.uid for n, t in tables.items()},
        )


def publish(
    db: Database,
    root: str | os.PathLike[str],
    *,
    full: bool | None = None,
    keep: int = DEFAULT_KEEP,
) -> dict[str, Any]:
    """``Database.publish`` (see there)."""
    return db.publisher.publish(root, full=full, keep=keep)


def check_arguments(full: Any, keep: Any) -> None:
    """``publish``'s options, checked before anything is written."""
    if full not in (None, True, False):
        raise InvalidArgumentError(f"full must be None, True or False, got {full!r}")
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise InvalidArgumentError(f"keep must be an int >= 1, got {keep!r}")


RowChunks = Iterator[tuple[Int64Array, RecordBatch]]


def live_chunks(t: Table) -> RowChunks:
    """A table's live rows, a chunk of whole records at a time, from every tier."""
    return t.records(_CHUNK_ROWS, live_only=True)


def write_full_rows(
    tmp: Path,
    step: int,
    sources: dict[str, tuple[TableConfig, RowChunks]],
    entries: dict[str, Any],
) -> tuple[int, int]:
    """A serving database at tmp of the given live rows per table (a sharded database's
    ranks each give theirs), each row keeping its ``last_step`` (a TTL table's rows expire on
    the server at the trainer's step); then only its checkpoint stays. Returns (rows, 0)."""
    total = 0
    out = open_database(tmp)
    try:
        out.advance(step)
        for name, (config, chunks) in sources.items():
            new = out.create_table(
                name,
                dim=config.dim,
                key_type=config.key_type,
                initializer=config.initializer,
                default_value=config.default_value,
                optimizer=SGD(),
                ttl_steps=config.ttl_steps,
                dram_rows=_CHUNK_ROWS,
                disk=DiskConfig(),
            )
            rows = 0
            for keys, records in chunks:
                m = keys.shape[0]
                copy = RecordBatch(
                    values=np.ascontiguousarray(records.values),
                    slots=np.empty((m, 0), dtype=np.float32),
                    freq=records.freq,
                    last_step=records.last_step,
                    version=records.version,
                )
                # As they are (upsert would stamp last_step = the step)
                new.restore_records(keys, copy)
                rows += m
            entries[name] = {**table_entry(config), "rows": rows, "removed": 0}
            total += rows
        out.close()
    finally:
        out.close(flush=False)  # after a failure (a full disk): tmp goes, so none of it stays
    (tmp / "LOCK").unlink()
    shutil.rmtree(tmp / WORKING)
    if not any((tmp / CHECKPOINTS).iterdir()):
        raise CorruptDataError(f"{tmp}: the serving database has no checkpoint")
    return total, 0


def write_delta(tmp: Path, tables: dict[str, Table], entries: dict[str, Any]) -> tuple[int, int]:
    """Per table, the current rows of the touched keys and the removed keys."""
    total_rows = total_removed = 0
    for name, t in tables.items():
        touched, removed = t.changes.pending()
        found, records = t.read_records(touched)  # live rows only, from whichever tier
        keys = touched[found]
        # A touched key without a live row now (deleted, expired, evicted) is removed too.
        gone = np.setdiff1d(np.union1d(removed, touched[~found]), keys, assume_unique=True)
        np.savez(
            tmp / f"{name}.npz",
            allow_pickle=False,
            keys=keys,
            values=np.ascontiguousarray(records.values, dtype=np.float32),
            last_step=records.last_step.astype(np.int64),
            removed=gone.astype(np.int64),
        )
        entries[name] = {
            **table_entry(t.config),
            "rows": int(keys.shape[0]),
            "removed": len(gone),
        }
        total_rows += int(keys.shape[0])
        total_removed += len(gone)
    return total_rows, total_removed
