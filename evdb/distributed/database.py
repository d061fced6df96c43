"""``ShardedDatabase``: one evdb database per rank of a ``torch.distributed`` job.

A sharded root holds::

    sharding.json          the layout: world size, each table's placement (replaced atomically
                           by rank 0; in a sharded checkpoint, also the step and every shard
                           manifest's checksum, written last)
    shard-00000/ ...       rank r's shard: an ordinary evdb database (or, in a sharded
                           checkpoint, an ordinary evdb checkpoint)

Each rank opens its own shard directory (its lock, its flush and crash contract, unchanged);
a directory every rank can reach (a shared file system across machines) holds them all.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from types import TracebackType
from typing import Any

import torch.distributed as dist

from evdb import database as _database
from evdb.database import Database
from evdb.distributed.exchange import Exchange
from evdb.distributed.layout import FORMAT, LAYOUT, read_layout, shard_dir, write_json
from evdb.distributed.placement import Placement, parse_placement
from evdb.distributed.table import ShardedTable
from evdb.errors import (
    ConfigError,
    CorruptDataError,
    DatabaseClosedError,
    EvdbError,
    InvalidArgumentError,
    ShardLayoutError,
    TableNotFoundError,
)

__all__ = ["ShardedDatabase", "open"]


def _check_world(root: Path, layout: dict[str, Any], world: int) -> None:
    if layout["world_size"] != world:
        raise ShardLayoutError(
            f"{root} holds {layout['world_size']} shards and this job has {world} ranks; "
            f"reshard it first: evdb reshard {root} DEST --shards {world}"
        )


def _plan_open(root: Path, world: int, restore: Path | None) -> dict[str, Any]:
    """Rank 0's look before anyone opens a shard: the layout to use, and what each rank must
    find (a new root or a sharded database; with ``restore``, a sharded checkpoint to start
    a new root from)."""
    layout = read_layout(root)
    if restore is not None:
        stray = sorted(p.name for p in root.iterdir()) if root.is_dir() else []
        if stray:
            raise InvalidArgumentError(
                f"root: {root} is not empty (it holds {', '.join(stray[:3])}); restore= starts "
                "a new sharded database from the checkpoint: pass a missing or empty directory"
            )
        return _plan_restore(restore, world)
    if layout is None:
        stray = sorted(p.name for p in root.glob("shard-*")) if root.is_dir() else []
        if stray:
            raise CorruptDataError(
                f"{root}: has {', '.join(stray[:3])} but no {LAYOUT}: an incomplete sharded "
                "checkpoint (its manifest is written last) or not a sharded database"
            )
        return {"format": FORMAT, "world_size": world, "tables": {}}
    if layout.get("checkpoint") is not None:  # opened for writing, it would be consumed
        raise InvalidArgumentError(
            f"root: {root} is a sharded checkpoint; opening it for writing would consume it. "
            f"Resume from it in a new root: evd.open(new_root, restore={str(root)!r})"
        )
    _check_world(root, layout, world)
    return layout


def _plan_restore(ckpt: Path, world: int) -> dict[str, Any]:
    layout = read_layout(ckpt)
    if layout is None or layout.get("checkpoint") is None:
        raise InvalidArgumentError(
            f"restore: {ckpt} is not a sharded checkpoint (no {LAYOUT} with its shards)"
        )
    _check_world(ckpt, layout, world)
    for name in layout["checkpoint"]["shards"]:
        if not (ckpt / name / "MANIFEST.json").is_file():
            raise CorruptDataError(
                f"{ckpt / name}: missing, or without its MANIFEST.json (listed in {ckpt / LAYOUT})"
            )
    return layout


class ShardedDatabase:
    """This rank's handle on a sharded database; open it with :func:`evdb.distributed.open`.

    It has ``Database``'s methods; ``create_table``, ``drop_table``, ``flush``, ``checkpoint``
    and ``close`` are collective (every rank calls them, in the same order), and ``advance``
    must be called alike on every rank.
    """

    def __init__(
        self, root: Path, group: Any, exchange: Exchange, restore: Path | None = None
    ) -> None:
        self.root = root
        self.group = group
        self._x = exchange
        self.rank, self.world_size = exchange.rank, exchange.size
        self._closed = False
        self._tables: dict[str, ShardedTable] = {}
        plan: Any = None
        if self.rank == 0:
            try:
                plan = _plan_open(root, self.world_size, restore)
            except EvdbError as e:
                plan = e
        plan = self._x.gather_objects(plan, "open")[0]
        if isinstance(plan, BaseException):
            raise type(plan)(*plan.args)
        self._layout: dict[str, Any] = plan
        checkpoint = plan.pop("checkpoint", None)
        path = shard_dir(root, self.rank)
        error: Any = None
        try:
            source = None
            if restore is not None:  # each rank checks its own shard's manifest first
                source = shard_dir(restore, self.rank)
                _verify_shard(restore, source, checkpoint["shards"].get(source.name))
            self.local: Database = _database.Database(path, restore=source)
        except EvdbError as e:
            error = e
        views = self._x.gather_objects(
            error if error is not None else (self.local.step, self.local.tables()), "open"
        )
        failed = [(r, v) for r, v in enumerate(views) if isinstance(v, BaseException)]
        if failed:
            if error is None:
                self.local.close()
            rank, why = failed[0]
            raise CorruptDataError(f"rank {rank} could not open its shard: {why}") from error
        steps = {v[0] for v in views}
        tables = {tuple(v[1]) for v in views} | {tuple(sorted(plan["tables"]))}
        if len(steps) > 1 or len(tables) > 1:
            self.local.close()
            raise CorruptDataError(
                f"{root}: the shards disagree (steps {sorted(steps)}, tables {sorted(tables)}): "
                "they come from different checkpoints"
            )
        self._x.step = self.local.step
        for name, placement in plan["tables"].items():
            p = Placement.from_dict(placement)
            self._tables[name] = ShardedTable(self, self.local.table(name), p, self._x)
        if self.rank == 0 and not (root / LAYOUT).exists():
            write_json(root / LAYOUT, self._layout)  # a new (or restored) sharded database
        self._x.barrier("open")

    @property
    def exchange(self) -> Exchange:
        """This rank's end of the collectives every rank takes part in."""
        return self._x

    def layout(self) -> dict[str, Any]:
        """A copy of the sharded database's layout (what ``sharding.json`` holds: the world
        size and each table's placement)."""
        return copy.deepcopy(self._layout)

    # -- lifecycle ------------------------------------------------------------------------
    def check_open(self) -> None:
        if self._closed:
            raise DatabaseClosedError(f"sharded database {self.root} is closed")

    def check_writable(self) -> None:
        self.check_open()

    def close(self) -> None:
        """Collective. Flush and close this rank's shard. Closing twice is a no-op."""
        if self._closed:
            return
        self._x.begin("close")
        self._closed = True
        self.local.close()
        self._x.barrier("close")

    def __enter__(self) -> ShardedDatabase:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
        elif not self._closed:  # a failed collective: the others may be gone; don't wait
            self._closed = True
            self.local.close()

    def flush(self) -> None:
        """Collective. Every rank flushes its shard (see ``Database.flush``)."""
        self.check_writable()
        self._x.begin("flush")
        self.local.flush()
        self._x.barrier("flush")

    def checkpoint(
        self, dest: str | os.PathLike[str], base: str | os.PathLike[str] | None = None
    ) -> dict[str, Any]:
        """Collective. Every rank writes its shard into ``dest/shard-<rank>`` as an ordinary
        evdb checkpoint (incremental per shard with ``base``, an earlier sharded checkpoint);
        then rank 0 writes ``dest/sharding.json`` last, atomically: the world size, each
        table's placement, the step and every shard manifest's checksum. Returns it."""
        from evdb.distributed.checkpoint import checkpoint

        self.check_writable()
        return checkpoint(self, Path(dest), None if base is None else Path(base))

    def restore_in_place(self, source: str | os.PathLike[str]) -> None:
        """Collective. Replace every rank's shard by its shard of the sharded checkpoint at
        source, in place (``Database.restore_in_place``): written for this many ranks, with
        the same tables and placements (else ``ShardLayoutError``, changing nothing). The
        ``ShardedTable`` objects stay the same ones (``evdb.torch_checkpoint``'s DCP load).
        If a rank fails, every rank raises; the shards may then be of different states:
        restore again."""
        self.check_writable()
        src, error = Path(source), None
        try:
            layout = _plan_restore(src, self.world_size)
            if layout["tables"] != self._layout["tables"]:
                raise ShardLayoutError(
                    f"source: {src} holds tables {layout['tables']}, this database "
                    f"{self._layout['tables']}: restore in place needs the same tables and "
                    "placements (open a new root with restore= instead)"
                )
            shard = shard_dir(src, self.rank)
            _verify_shard(src, shard, layout["checkpoint"]["shards"].get(shard.name))
        except EvdbError as e:
            error = e
        self._x.begin("restore", failed=error is not None)
        if error is not None:
            raise error
        result: Any = None
        try:
            self.local.restore_in_place(shard)
        except EvdbError as e:
            result = e
        failed = [(r, v) for r, v in enumerate(self._x.gather_objects(result, "restore")) if v]
        self._x.step = self.local.step
        for table in self._tables.values():
            table.config = table.local.config
        if failed:
            rank, why = failed[0]
            raise CorruptDataError(f"restore_in_place: rank {rank} could not restore: {why}")

    def publish(
        self, root: str | os.PathLike[str], *, full: bool | None = None, keep: int = 2
    ) -> dict[str, Any]:
        """Collective. ``Database.publish`` for the whole sharded database: one publication
        of every table, the shards merged, into the ordinary publish root ``root`` that
        ``evdb serve ROOT --follow`` serves (see ``evdb.distributed.publish``). Returns the
        same dict on every rank: ``seq``, ``kind``, ``rows``, ``deleted``, ``bytes``,
        ``seconds`` (and ``reason`` for a full one)."""
        from evdb.distributed.publish import publish

        self.check_writable()
        return publish(self, Path(root), full, keep)

    # -- the global step ------------------------------------------------------------------
    @property
    def step(self) -> int:
        """The global step (the same on every rank)."""
        return self.local.step

    def advance(self, n: int = 1) -> int:
        """Move the global step forward by n on this rank; returns it. Every rank must advance
        alike: it costs no collective, and every later collective compares the ranks' steps
        (a rank that did not advance makes the next one raise ``CollectiveError``)."""
        self.check_writable()
        step = self.local.advance(n)  # validates n
        self._x.step = step
        return step

    # -- tables ---------------------------------------------------------------------------
    def create_table(
        self,
        name: str,
        dim: int,
        *,
        placement: str | Placement = "hash",
        buckets: int | None = None,
        num_ids: int | None = None,
        **options: Any,
    ) -> ShardedTable:
        """Collective. Create a table on every rank, with the same configuration everywhere.

        ``placement`` ("hash", "mod", "div" or a ``Placement``), ``buckets`` (hash) and
        ``num_ids`` (div) say which rank owns a key (see ``evdb.distributed.placement``);
        ``options`` are ``Database.create_table``'s. ``keep_strings`` is refused: original
        strings do not travel between ranks (hash the strings, ``key_type="str"``, and keep a
        vocabulary beside the model). Raises ``ShardLayoutError`` if the ranks disagree.
        """
        self.check_writable()
        try:
            where = parse_placement(placement, buckets, num_ids)
            where.check(self.world_size)
            if options.get("keep_strings"):
                raise ConfigError("keep_strings: not supported on sharded tables")
        except EvdbError:
            self._x.begin("create_table", str(name), failed=True)
            raise
        self._x.begin("create_table", str(name))
        mine = repr((name, dim, where.to_dict(), sorted(options.items())))
        views = self._x.gather_objects(mine, "create_table", str(name))
        other = next((r for r, v in enumerate(views) if v != mine), None)
        if other is not None:
            raise ShardLayoutError(
                f"create_table: rank {other} asked for {views[other]} and rank {self.rank} for "
                f"{mine}: every rank must create a table with the same configuration"
            )
        local = self.local.create_table(name, dim, **options)  # the same error on every rank
        table = ShardedTable(self, local, where, self._x)
        self._tables[name] = table
        self._layout["tables"][name] = where.to_dict()
        if self.rank == 0:
            write_json(self.root / LAYOUT, self._layout)
        return table

    def table(self, name: str) -> ShardedTable:
        """The sharded table called name; ``TableNotFoundError`` if there is none."""
        self.check_open()
        try:
            return self._tables[name]
        except KeyError:
            raise TableNotFoundError(
                f"name: no table {name!r} in {self.root}; tables: {sorted(self._tables)}"
            ) from None

    def tables(self) -> list[str]:
        self.check_open()
        return sorted(self._tables)

    def drop_table(self, name: str) -> None:
        """Collective. Drop the table on every rank."""
        self.check_writable()
        self.table(name)
        self._x.begin("drop_table", name)
        self.local.drop_table(name)
        del self._tables[name]
        del self._layout["tables"][name]
        if self.rank == 0:
            write_json(self.root / LAYOUT, self._layout)

    def __repr__(self) -> str:
        return (
            f"ShardedDatabase({str(self.root)!r}, rank {self.rank} of {self.world_size}, "
            f"step={self.step}, tables={sorted(self._tables)})"
        )


def _verify_shard(root: Path, path: Path, want: str | None) -> None:
    from evdb.checkpoint import MANIFEST, file_digest

    if want is None:
        raise CorruptDataError(f"{root / LAYOUT}: lists no {path.name} for this rank")
    manifest = path / MANIFEST
    if not manifest.is_file():
        raise CorruptDataError(f"{path}: missing, or without its {MANIFEST}")
    if file_digest(manifest) != want:
        raise CorruptDataError(
            f"{manifest}: not the shard manifest {root / LAYOUT} lists (replaced or damaged)"
        )


def open(
    root: str | os.PathLike[str],
    process_group: Any = None,
    *,
    restore: str | os.PathLike[str] | None = None,
) -> ShardedDatabase:
    """Collective. Open this rank's shard of the sharded database at root (creating it if
    missing); with ``restore=ckpt``, start root (missing or empty) from a sharded checkpoint
    written for this many ranks, as ``evdb.open(workdir, restore=ckpt)`` does for one
    database: each rank restores its own shard, and nothing under ckpt is written. A sharded
    checkpoint opened as root is refused (it would be consumed), naming ``restore=``.

    Parameters
    ----------
    root : path
        A directory every rank can reach.
    process_group : torch.distributed.ProcessGroup, optional
        The ranks that share the database. By default a new gloo group over every rank of
        the default group (``torch.distributed.init_process_group`` first): evdb's collectives
        then never interleave with those of ``DistributedDataParallel`` on the default group,
        and they run on CPU tensors whatever the default backend is.

    Raises
    ------
    ShardLayoutError
        root was written by another number of ranks (the message gives the reshard command).
    CorruptDataError
        A sharded checkpoint missing a shard or its manifest, or shards that disagree.
    InvalidArgumentError
        root is a sharded checkpoint (resume with ``restore=``), or ``restore=`` is not a
        sharded checkpoint or root is not empty.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise ConfigError(
            "process_group: torch.distributed is not initialised; call "
            "torch.distributed.init_process_group('gloo') first (torchrun sets the rank and "
            "world size)"
        )
    group = dist.new_group(backend="gloo") if process_group is None else process_group
    exchange = Exchange(group)
    exchange.begin("open")
    source = None if restore is None else Path(restore)
    return ShardedDatabase(Path(root), group, exchange, source)
