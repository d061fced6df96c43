"""Sharded checkpoints, resharding, and the merged views of a sharded database.

A sharded checkpoint is one ordinary evdb checkpoint per rank (``shard-<rank>/``) plus
``sharding.json``, which rank 0 writes last: the layout, the step, and the xxh3-128 of every
shard's ``MANIFEST.json`` (each of which checksums its shard's files). A checkpoint without
that file, or whose shards do not match it, is refused.

Resharding is offline and needs no process group: every new shard is built in turn from the
old shards that hold any of its keys, streamed a chunk of rows at a time, and written as an
ordinary checkpoint. Under ``"hash"`` placement the old and new bucket ranges say which old
shards overlap a new one, so the others are not read.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from evdb import database as _database
from evdb._types import BoolArray, Int64Array
from evdb.checkpoint import MANIFEST, file_digest, fsync_path, temp_dir_beside
from evdb.config import TableConfig
from evdb.database import Database
from evdb.distributed.layout import LAYOUT, read_layout, shard_dir, write_json
from evdb.distributed.placement import Placement
from evdb.errors import CorruptDataError, EvdbError, InvalidArgumentError
from evdb.io.export import export as _export_one
from evdb.offline import info as offline_info
from evdb.table import Table, TableSummary

if TYPE_CHECKING:
    from evdb.distributed.database import ShardedDatabase

__all__ = ["checkpoint", "export", "info", "reshard"]

Progress = Callable[[int, int], object]


def checkpoint(sdb: ShardedDatabase, dest: Path, base: Path | None) -> dict[str, Any]:
    """``ShardedDatabase.checkpoint`` (see there)."""
    x, rank = sdb.exchange, sdb.rank
    error: Any = None
    try:
        if rank == 0 and (dest / LAYOUT).exists():
            raise InvalidArgumentError(f"dest: {dest} already holds a sharded checkpoint")
        base_shard = None
        if base is not None:
            layout = read_layout(base)
            if layout is None or "checkpoint" not in layout:
                raise InvalidArgumentError(f"base: {base} is not a sharded checkpoint")
            if layout["world_size"] != sdb.world_size:
                raise InvalidArgumentError(
                    f"base: {base} has {layout['world_size']} shards, this job "
                    f"{sdb.world_size}; take a full checkpoint"
                )
            base_shard = shard_dir(base, rank)
    except EvdbError as e:
        error = e
    x.begin("checkpoint", failed=error is not None)
    if error is not None:
        raise error
    try:
        manifest = sdb.local.checkpoint(shard_dir(dest, rank), base_shard)
        result: Any = (file_digest(shard_dir(dest, rank) / MANIFEST), manifest["kind"])
    except EvdbError as e:
        result = e
    views = x.gather_objects(result, "checkpoint")
    failed = [(r, v) for r, v in enumerate(views) if isinstance(v, BaseException)]
    if failed:
        r, why = failed[0]
        raise CorruptDataError(f"checkpoint: rank {r} could not write its shard: {why}")
    layout = sdb.layout()
    layout["step"] = sdb.step
    layout["checkpoint"] = {
        "kind": views[0][1],
        "base": None if base is None else str(base.resolve()),
        "shards": {shard_dir(dest, r).name: v[0] for r, v in enumerate(views)},
    }
    if rank == 0:  # last: a checkpoint without it is incomplete
        write_json(dest / LAYOUT, layout)
    x.barrier("checkpoint")
    return layout


def _source(src: Path) -> tuple[dict[str, Any], list[Path]]:
    """A sharded checkpoint's (or closed sharded database's) layout and shard directories,
    every shard manifest checked against the layout."""
    layout = read_layout(src)
    if layout is None:
        raise CorruptDataError(
            f"{src}: no {LAYOUT}: not a sharded database, or a sharded checkpoint that did "
            "not complete (its manifest is written last)"
        )
    shards = [shard_dir(src, r) for r in range(layout["world_size"])]
    listed = (layout.get("checkpoint") or {}).get("shards")
    for path in shards:
        if not path.is_dir():
            raise CorruptDataError(f"{path}: missing (listed in {src / LAYOUT})")
        if listed is None:
            continue
        manifest = path / MANIFEST
        if not manifest.is_file():
            raise CorruptDataError(f"{path}: has no {MANIFEST} (listed in {src / LAYOUT})")
        if file_digest(manifest) != listed.get(path.name):
            raise CorruptDataError(f"{manifest}: not the shard manifest {src / LAYOUT} lists")
    return layout, shards


def _overlapping(placement: Placement, old: int, new: int, m: int) -> list[int]:
    """The old shards that can hold keys new shard m owns: bucket ranges that overlap under
    "hash"; every old shard under "mod" and "div"."""
    if placement.kind != "hash":
        return list(range(old))
    a, b = placement.bucket_starts(old), placement.bucket_starts(new)
    return [n for n in range(old) if a[n] < b[m + 1] and b[m] < a[n + 1]]


def _create_like(db: Database, name: str, c: TableConfig) -> Table:
    return db.create_table(
        name,
        c.dim,
        key_type=c.key_type,
        initializer=c.initializer,
        admission=c.admission,
        optimizer=c.optimizer,
        ttl_steps=c.ttl_steps,
        l2_threshold=c.l2_threshold,
        default_value=c.default_value,
        keep_strings=c.keep_strings,
        dram=c.dram,
        disk=False if c.disk is None else c.disk,
        hbm=c.hbm,
    )


def reshard(
    src: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    shards: int,
    *,
    chunk_rows: int = 65536,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Write a sharded checkpoint for ``shards`` ranks at dest from the sharded checkpoint
    (or closed sharded database) at src, offline.

    Every new shard gets exactly the rows (values, slots, ``freq``, ``last_step``,
    ``version``) and pending admission counts that the tables' placements now send to it,
    streamed ``chunk_rows`` at a time; counters keep their totals. N -> M -> N is the
    identity on rows. One old shard is open at a time, and one new shard is built at a time,
    so the process holds at most one of each (a table without a disk tier loads its shard's
    rows when opened; one with a disk tier only its DRAM cache). ``progress(rows_done,
    rows_total)`` after each chunk. Returns the new ``sharding.json``. Incremental shard
    checkpoints are refused: open and checkpoint them in full first.
    """
    src, dest = Path(src), Path(dest)
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
        raise InvalidArgumentError(f"shards must be an int >= 1, got {shards!r}")
    if dest.exists():
        raise InvalidArgumentError(f"dest: {dest} already exists")
    layout, olds = _source(src)
    if (layout.get("checkpoint") or {}).get("kind") == "incremental":
        raise InvalidArgumentError(
            f"src: {src} is an incremental sharded checkpoint; open it on "
            f"{layout['world_size']} ranks and take a full checkpoint to reshard"
        )
    placements = {n: Placement.from_dict(p) for n, p in layout["tables"].items()}
    for p in placements.values():
        p.check(shards)
    states: dict[str, list[TableSummary]] = {name: [] for name in placements}
    step = 0
    for path in olds:  # first pass: everything but the rows, one old shard at a time
        with _database.open(path, read_only=True) as db:
            step = db.step
            for name in placements:
                states[name].append(db.table(name).summary())
    total = sum(s.rows for table in states.values() for s in table)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp, owner = temp_dir_beside(dest)  # locked: a later checkpoint removes it if we die
    done = 0
    try:
        digests = {}
        for m in range(shards):
            work = tmp / f".work-{m:05d}"
            with _database.open(work) as new:
                new.advance(step)
                tables = {n: _create_like(new, n, states[n][0].config) for n in placements}
                reading = {n: _overlapping(p, len(olds), shards, m) for n, p in placements.items()}
                for i, path in enumerate(olds):
                    names = [n for n in placements if i in reading[n]]
                    if not names:
                        continue  # hash placement: this old shard holds none of m's buckets
                    with _database.open(path, read_only=True) as old:
                        for name in names:
                            placement, t = placements[name], tables[name]
                            for keys, records in old.table(name).records(chunk_rows):
                                mine = placement.owners(keys, shards) == m
                                t.restore_records(keys[mine], records.take(mine))
                                done += int(np.count_nonzero(mine))
                                if progress is not None:
                                    progress(min(done, total), total)
                for name, t in tables.items():
                    owns = _owned_by(placements[name], shards, m)
                    t.absorb(states[name], owns, first=m == 0)
                new.checkpoint(shard_dir(tmp, m))
            shutil.rmtree(work)
            digests[shard_dir(tmp, m).name] = file_digest(shard_dir(tmp, m) / MANIFEST)
        out = {
            "format": layout["format"],
            "world_size": shards,
            "tables": layout["tables"],
            "step": step,
            "checkpoint": {"kind": "full", "base": None, "shards": digests},
        }
        write_json(tmp / LAYOUT, out)
        os.replace(tmp, dest)
        fsync_path(dest.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        os.close(owner)
    return out


def export(
    src: str | os.PathLike[str], dest: str | os.PathLike[str], **options: Any
) -> dict[str, Any]:
    """``evdb.export`` of a sharded checkpoint (or closed sharded database): the shards
    merged into one export (a serving snapshot by default) that ``evdb serve`` serves as it
    serves any. ``options`` are ``evdb.export``'s. The shards are resharded into one beside
    dest first (streamed), then exported."""
    dest = Path(dest)
    if dest.exists() or dest.is_symlink():
        raise InvalidArgumentError(f"dest: {dest} already exists")
    dest.parent.mkdir(parents=True, exist_ok=True)
    work, owner = temp_dir_beside(dest)  # locked: a later checkpoint removes it if we die
    try:
        merged = work / "merged"
        reshard(src, merged, 1, progress=None)
        return _export_one(shard_dir(merged, 0), dest, **options)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        os.close(owner)


def info(src: str | os.PathLike[str]) -> dict[str, Any]:
    """A sharded checkpoint's or database's layout, and each table's rows per shard with the
    imbalance (the most rows on one shard over the mean)."""
    src = Path(src)
    layout, shards = _source(src)
    per_table: dict[str, list[int]] = {n: [] for n in layout["tables"]}
    step = None
    for path in shards:  # an incremental shard reports what its manifest records
        shard = offline_info(path)
        step = shard["step"]
        for name in per_table:
            if name not in shard["tables"]:
                raise CorruptDataError(f"{path}: has no table {name!r} ({src / LAYOUT} lists it)")
            per_table[name].append(int(shard["tables"][name]["rows"]))
    tables = {}
    for name, rows in per_table.items():
        mean = sum(rows) / len(rows)
        tables[name] = {
            "placement": layout["tables"][name],
            "rows": sum(rows),
            "shards": rows,
            "imbalance": max(rows) / mean if mean else 1.0,
        }
    return {
        "path": str(src),
        "world_size": layout["world_size"],
        "step": step,
        "checkpoint": layout.get("checkpoint"),
        "tables": tables,
    }


def _owned_by(placement: Placement, shards: int, m: int) -> Callable[[Int64Array], BoolArray]:
    """Whether each key belongs to new shard m of shards under placement."""

    def owns(keys: Int64Array) -> BoolArray:
        owned: BoolArray = placement.owners(keys, shards) == m
        return owned

    return owns
