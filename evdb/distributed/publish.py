"""``ShardedDatabase.publish``: one publish root for every rank's shard, merged.

The root is an ordinary publish root (``evdb.publish``): ``evdb serve ROOT --follow`` serves
it as it serves a single database's, with no notion of shards. A publication is collective:

1. the ranks agree on its kind: each rank judges its shard as a single database judges
   itself (``evdb.publish``: the first publication, a change log that overflowed, a table
   created or dropped, ``full=True``, HEAD moved by someone else, or its deltas since the
   last full adding up to more than half its rows), and one rank that needs a full makes it
   full for all, else it is a delta;
2. each rank writes its part under ``root/.<seq>.tmp-parts/rank-<r>/``: for a delta its
   tables' changed rows and removed keys (the single-database delta files), for a full its
   live rows, a chunk of whole records per file;
3. rank 0, which holds the root's lock throughout, merges the parts (the shards' keys are
   disjoint: a delta's files are concatenated and sorted, a full's rows streamed into one
   serving database) and writes the publication as a single database does
   (``evdb.publish_root.write_publication``: temporary name, checksums, rename, HEAD
   replaced);
   then removes the parts;
4. only then do the ranks forget what their change logs carried. A seq is complete when
   every rank's part is in: a crash before HEAD moves leaves the root at the previous HEAD,
   and nothing is lost (the logs still hold the changes; the next publication carries them).

A delta's cost on each rank is its changed rows; rank 0 reads every part once more (the
changed rows again, or, for a full, every live row).
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from evdb import publish as _publish
from evdb import publish_root
from evdb.config import TableConfig
from evdb.errors import CorruptDataError, EvdbError, InvalidArgumentError
from evdb.records import RecordBatch

if TYPE_CHECKING:
    from evdb.distributed.database import ShardedDatabase

__all__ = ["publish"]


def _write_full_part(sdb: ShardedDatabase, part: Path) -> int:
    """This rank's live rows, per table, as chunk files of whole records; returns how many."""
    rows = 0
    for name in sdb.local.tables():
        out = part / name
        out.mkdir(parents=True)
        t = sdb.local.table(name)
        for i, (keys, records) in enumerate(_publish.live_chunks(t)):
            np.savez(
                out / f"{i:06d}.npz",
                allow_pickle=False,
                keys=keys,
                values=records.values,
                freq=records.freq,
                last_step=records.last_step,
                version=records.version,
            )
            rows += keys.shape[0]
    return rows


def _read_full_parts(paths: list[Path], dim: int) -> _publish.RowChunks:
    """The chunk files of every rank's part of one table, in rank order."""
    for chunk in (c for path in paths for c in sorted(path.glob("*.npz"))):
        with np.load(chunk, allow_pickle=False) as z:
            n = z["keys"].shape[0]
            yield (
                z["keys"],
                RecordBatch(
                    values=z["values"].reshape(n, dim),
                    slots=np.empty((n, 0), dtype=np.float32),
                    freq=z["freq"],
                    last_step=z["last_step"],
                    version=z["version"],
                ),
            )


def _merge_deltas(parts: list[Path], tmp: Path, tables: dict[str, Any]) -> tuple[int, int]:
    """One delta of the parts' deltas: per table, every part's rows and removed keys, sorted
    (the shards' keys are disjoint)."""
    rows = removed = 0
    for name, entry in tables.items():
        loaded = [np.load(p / f"{name}.npz", allow_pickle=False) for p in parts]
        try:
            keys = np.concatenate([z["keys"] for z in loaded])
            order = np.argsort(keys, kind="stable")
            dim = int(entry["dim"])
            values = np.concatenate([z["values"].reshape(-1, dim) for z in loaded])[order]
            last_step = np.concatenate([z["last_step"] for z in loaded])[order]
            gone = np.sort(np.concatenate([z["removed"] for z in loaded]))
        finally:
            for z in loaded:
                z.close()
        np.savez(
            tmp / f"{name}.npz",
            allow_pickle=False,
            keys=keys[order],
            values=values,
            last_step=last_step,
            removed=gone,
        )
        entry.update(rows=int(keys.shape[0]), removed=int(gone.shape[0]))
        rows += int(keys.shape[0])
        removed += int(gone.shape[0])
    return rows, removed


def publish(sdb: ShardedDatabase, root: Path, full: bool | None, keep: int) -> dict[str, Any]:
    """``ShardedDatabase.publish`` (see there)."""
    x, rank, local = sdb.exchange, sdb.rank, sdb.local
    start = time.perf_counter()
    try:
        _publish.check_arguments(full, keep)
    except EvdbError:
        x.begin("publish", failed=True)
        raise
    root = root.resolve()
    x.begin("publish", arg={None: 0, True: 1, False: 2}[full])
    tables = {n: local.table(n) for n in local.tables()}
    with contextlib.ExitStack() as rank0:  # rank 0 holds the root's lock throughout
        _agree(x, "lock the root", lambda: _lock_and_clear(rank0, root) if rank == 0 else None)
        head = publish_root.read_head(root)
        # Each rank's own verdict on its shard (its logs, its tables, its share of the rows
        # since the last full); one that needs a full makes it full for every rank.
        mine = local.publisher.full_reason(root, head, tables, full)
        verdicts = x.gather_objects(mine, "publish")
        first = next(((r, v) for r, v in enumerate(verdicts) if v is not None), None)
        reason = None if first is None else f"rank {first[0]}: {first[1]}"
        if reason is not None and full is False:
            raise InvalidArgumentError(f"full=False, but a delta cannot be exact here: {reason}")
        seq = 1 if head is None else int(head["seq"]) + 1
        parts_dir = root / f".{seq:012d}.tmp-parts"
        part = parts_dir / f"rank-{rank:05d}"
        try:

            def write_part() -> int:
                part.mkdir(parents=True)
                if reason is not None:
                    return _write_full_part(sdb, part)
                return _publish.write_delta(part, tables, {})[0]

            my_rows = _agree(x, "write its part", write_part)
            written = _agree(
                x,
                "merge the parts",
                lambda: _merge(sdb, root, head, reason, parts_dir, keep) if rank == 0 else None,
            )
        finally:
            if rank == 0:
                shutil.rmtree(parts_dir, ignore_errors=True)
    written = x.gather_objects(written, "publish")[0]  # rank 0's
    assert isinstance(written, publish_root.Written)
    # Durable and visible: only now may the logs forget what this publication carries.
    local.publisher.remember(root, written, tables, reason, my_rows)
    return written.result(time.perf_counter() - start, reason)


def _lock_and_clear(stack: contextlib.ExitStack, root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    stack.enter_context(publish_root.RootLock(root))
    publish_root.clear_stale(root, publish_root.read_head(root))


def _agree(x: Any, what: str, step: Callable[[], Any]) -> Any:
    """Run this rank's step; if any rank's fails, every rank raises, naming it."""
    try:
        out, error = step(), None
    except (EvdbError, OSError) as e:
        out, error = None, e
    errors = x.gather_objects(error, "publish")
    failed = next(((r, e) for r, e in enumerate(errors) if e is not None), None)
    if failed is not None:
        raise CorruptDataError(f"publish: rank {failed[0]} could not {what}: {failed[1]}")
    return out


def _merge(
    sdb: ShardedDatabase,
    root: Path,
    head: dict[str, Any] | None,
    reason: str | None,
    parts_dir: Path,
    keep: int,
) -> publish_root.Written:
    """Rank 0: the parts merged into the next publication, HEAD replaced."""
    parts = [parts_dir / f"rank-{r:05d}" for r in range(sdb.world_size)]
    configs = {n: sdb.local.table(n).config for n in sdb.local.tables()}

    def full(tmp: Path, entries: dict[str, Any]) -> tuple[int, int]:
        sources: dict[str, tuple[TableConfig, _publish.RowChunks]] = {
            name: (c, _read_full_parts([p / name for p in parts], c.dim))
            for name, c in configs.items()
        }
        return _publish.write_full_rows(tmp, sdb.step, sources, entries)

    def delta(tmp: Path, entries: dict[str, Any]) -> tuple[int, int]:
        tmp.mkdir()
        entries.update({n: publish_root.table_entry(c) for n, c in configs.items()})
        return _merge_deltas(parts, tmp, entries)

    chained = sdb.local.publisher.chained_full(reason)
    written = publish_root.write_publication(
        root,
        head,
        chained,
        sdb.step,
        full if chained is None else delta,
        {"shards": sdb.world_size},
    )
    publish_root.retain(root, written.seq, keep)
    return written
