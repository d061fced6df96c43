"""``ShardedDatabase.publish``: one publish root for every rank's shard, merged.

The root is an ordinary publish root (``evdb.publish``): ``evdb serve ROOT --follow`` serves
it as it serves a single database's, with no notion of shards. A publication is collective:

1. the ranks agree on its kind: full when any rank needs one (the first publication, a
   change log that overflowed, a table created or dropped, ``full=True``, HEAD moved by
   someone else, or the deltas since the last full adding up to more than half the rows over
   every shard), else a delta;
2. each rank writes its part under ``root/.<seq>.tmp-parts/rank-<r>/``: for a delta its
   tables' changed rows and removed keys (the single-database delta files), for a full its
   live rows, a chunk of whole records per file;
3. rank 0 merges the parts (the shards' keys are disjoint: a delta's files are concatenated
   and sorted, a full's rows streamed into one serving database), writes the publication
   under a temporary name, checksums it, renames it into place and replaces HEAD, exactly as
   a single database does; then removes the parts;
4. only then do the ranks forget what their change logs carried. A seq is complete when
   every rank's part is in: a crash before HEAD moves leaves the root at the previous HEAD,
   and nothing is lost (the logs still hold the changes; the next publication carries them).

A delta's cost on each rank is its changed rows; rank 0 reads every part once more (the
changed rows again, or, for a full, every live row).
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from evdb import checkpoint as _checkpoint
from evdb import publish as _publish
from evdb.config import TableConfig
from evdb.errors import CorruptDataError, EvdbError, InvalidArgumentError
from evdb.records import RecordBatch

if TYPE_CHECKING:
    from evdb.distributed.database import ShardedDatabase

__all__ = ["publish"]


@dataclass
class _State:
    """The sharded database's last publication (kept on every rank alike)."""

    root: Path
    seq: int
    digest: str
    full: int
    rows_since_full: int
    tables: dict[str, str]  # name -> this rank's table uid


def _my_reason(sdb: ShardedDatabase, root: Path, head: dict[str, Any] | None) -> str | None:
    """Why this rank needs a full publication; None if its delta is exact."""
    state: _State | None = getattr(sdb, "_publication", None)
    if head is None:
        return "first publication to this root"
    if state is None or state.root != root:
        return "first publication of this database to this root (its change logs start now)"
    if int(head["seq"]) != state.seq:
        return f"HEAD is seq {head['seq']}, this database last published seq {state.seq}"
    parent = _publish.publication_dir(root, state.seq) / _checkpoint.MANIFEST
    if not parent.exists() or _checkpoint.file_digest(parent) != state.digest:
        return f"publication {state.seq} is gone or changed"
    local = sdb.local
    if {n: local.table(n)._uid for n in local.tables()} != state.tables:
        return "tables created or dropped since the last publication"
    overflowed = sorted(n for n in local.tables() if local.table(n)._changes.overflowed)
    if overflowed:
        return f"the change log of {overflowed} overflowed on rank {sdb.rank}"
    return None


def _write_full_part(sdb: ShardedDatabase, part: Path) -> None:
    """This rank's live rows, per table, as chunk files of whole records."""
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
    x, rank = sdb._x, sdb.rank
    start = time.perf_counter()
    try:
        if full not in (None, True, False):
            raise InvalidArgumentError(f"full must be None, True or False, got {full!r}")
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise InvalidArgumentError(f"keep must be an int >= 1, got {keep!r}")
    except EvdbError:
        x.begin("publish", failed=True)
        raise
    root = root.resolve()
    x.begin("publish", arg={None: 0, True: 1, False: 2}[full])
    head = _publish.read_head(root) if root.exists() else None
    local = sdb.local
    mine = (
        _my_reason(sdb, root, head) if full is not True else "asked (full=True)",
        sum(local.table(n)._changes.pending()[0].shape[0] for n in local.tables()),
        sum(len(local.table(n)) for n in local.tables()),
    )
    views = x.gather_objects(mine, "publish")
    reasons = [(r, v[0]) for r, v in enumerate(views) if v[0] is not None]
    state: _State | None = getattr(sdb, "_publication", None)
    pending, live = sum(v[1] for v in views), sum(v[2] for v in views)
    reason = f"rank {reasons[0][0]}: {reasons[0][1]}" if reasons else None
    if reason is None and state is not None:
        limit = max(_publish.REBASE_FRACTION * live, _publish.REBASE_MIN_ROWS)
        if state.rows_since_full + pending > limit:
            reason = "the deltas since the last full add up to more than half the rows (rebase)"
    if reason is not None and full is False:
        raise InvalidArgumentError(f"full=False, but a delta cannot be exact here: {reason}")
    seq = 1 if head is None else int(head["seq"]) + 1
    parts_dir = root / f".{seq:012d}.tmp-parts"
    part = parts_dir / f"rank-{rank:05d}"
    error: Any = None
    try:
        if rank == 0:
            shutil.rmtree(parts_dir, ignore_errors=True)
        x.barrier("publish")
        part.mkdir(parents=True)
        if reason is not None:
            _write_full_part(sdb, part)
        else:
            _publish._write_delta(part, {n: local.table(n) for n in local.tables()}, {})
    except (EvdbError, OSError) as e:
        error = e
    written = x.gather_objects(error, "publish")
    failed = [(r, e) for r, e in enumerate(written) if e is not None]
    outcome: Any = None
    if not failed and rank == 0:
        try:
            outcome = _merge(sdb, root, seq, head, reason, parts_dir, keep)
        except (EvdbError, OSError) as e:
            outcome = e
    if rank == 0:
        shutil.rmtree(parts_dir, ignore_errors=True)
    outcome = x.gather_objects(outcome, "publish")[0]
    if failed:
        r, why = failed[0]
        raise CorruptDataError(f"publish: rank {r} could not write its part: {why}")
    if isinstance(outcome, BaseException):
        raise CorruptDataError(f"publish: rank 0 could not merge the parts: {outcome}")
    # Durable and visible: only now may the logs forget what this publication carries.
    for name in local.tables():
        changes = local.table(name)._changes
        if reason is not None:
            changes.start()
        else:
            changes.clear()
    since = 0 if reason is not None else (state.rows_since_full if state else 0) + outcome["rows"]
    sdb._publication = _State(  # type: ignore[attr-defined]
        root,
        seq,
        outcome["digest"],
        outcome["full"],
        since,
        {n: local.table(n)._uid for n in local.tables()},
    )
    result = {k: outcome[k] for k in ("seq", "kind", "rows", "deleted", "bytes")}
    result["seconds"] = time.perf_counter() - start
    if reason is not None:
        result["reason"] = reason
    return result


def _merge(
    sdb: ShardedDatabase,
    root: Path,
    seq: int,
    head: dict[str, Any] | None,
    reason: str | None,
    parts_dir: Path,
    keep: int,
) -> dict[str, Any]:
    """Rank 0: the parts merged into publication seq, HEAD replaced; what it wrote."""
    parts = [parts_dir / f"rank-{r:05d}" for r in range(sdb.world_size)]
    local = sdb.local
    configs = {n: local.table(n).config for n in local.tables()}
    state: _State | None = getattr(sdb, "_publication", None)
    with _publish._RootLock(root):
        parent_digest = None
        if head is not None:
            parent = _publish.publication_dir(root, int(head["seq"])) / _checkpoint.MANIFEST
            parent_digest = _checkpoint.file_digest(parent) if parent.exists() else None
        dest = _publish.publication_dir(root, seq)
        tmp = root / f".{dest.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        entry: dict[str, Any] = {
            "seq": seq,
            "kind": "full" if reason is not None else "delta",
            "parent": None if head is None else int(head["seq"]),
            "parent_manifest": parent_digest,
            "full": seq if reason is not None or state is None else state.full,
            "step": sdb.step,
            "tables": {},
            "shards": sdb.world_size,
        }
        try:
            if reason is not None:
                sources: dict[str, tuple[TableConfig, _publish.RowChunks]] = {
                    name: (c, _read_full_parts([p / name for p in parts], c.dim))
                    for name, c in configs.items()
                }
                rows, removed = _publish.write_full_rows(tmp, sdb.step, sources, entry["tables"])
            else:
                tmp.mkdir()
                entry["tables"] = {n: _publish._table_entry(c) for n, c in configs.items()}
                rows, removed = _merge_deltas(parts, tmp, entry["tables"])
            entry["published"] = time.time()
            manifest: dict[str, Any] = {
                "format": _checkpoint.FORMAT,
                "kind": f"publish-{entry['kind']}",
                "created": entry["published"],
                "step": sdb.step,
                "publication": entry,
            }
            _checkpoint._finish(tmp, dest, manifest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        digest = _checkpoint.file_digest(dest / _checkpoint.MANIFEST)
        _publish._write_head(
            root, {"format": _publish.FORMAT, "seq": seq, "full": entry["full"]}, entry
        )
        _publish._retain(root, seq, keep)
    return {
        "seq": seq,
        "kind": entry["kind"],
        "rows": rows,
        "deleted": removed,
        "bytes": sum(int(f["size"]) for f in manifest["files"].values()),
        "digest": digest,
        "full": entry["full"],
    }
