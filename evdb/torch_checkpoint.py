"""evdb tables in ``torch.distributed.checkpoint`` (DCP): one save and one load of the model,
its optimizer and the tables, sharded jobs included.

The tables are not copied into tensors: their state dict names an evdb checkpoint written
beside the DCP files, inside the DCP directory (``<checkpoint_id>/evdb``: an ordinary evdb
checkpoint, or a sharded one with a ``shard-<rank>`` per rank)::

    ckpt/
      .metadata  __0_0.distcp ...     DCP: the model, the optimizer, {"tables": {"evdb": "evdb"}}
      evdb/                           the tables: evdb.open(ckpt/evdb, read_only=True) serves it

::

    from evdb import torch_checkpoint as etc
    etc.save({"model": model, "optim": optim, "tables": db}, "ckpt/step-100")
    ...
    etc.load({"model": model, "optim": optim, "tables": db}, "ckpt/step-100")

``save`` and ``load`` call ``dcp.save`` and ``dcp.load`` with the evdb entries (a
``Database``, a sharded database, an evdb module or a model holding them, a
``ShardedCollection``) wrapped in ``DcpTables``. DCP calls a ``Stateful``'s ``state_dict()``
without telling it the checkpoint's directory, and calls it on load too, before
``load_state_dict``; so the wrapper is given the directory, and whether it saves or loads.
Calling ``dcp.save`` / ``dcp.load`` directly works the same with the wrappers::

    dcp.save({"model": model, "tables": DcpTables(db, ckpt)}, checkpoint_id=ckpt)
    dcp.load({"model": model, "tables": DcpTables(db, ckpt, loading=True)}, checkpoint_id=ckpt)

Loading replaces the live tables' state in place (``Database.restore_in_place``): the modules
and ``Table`` objects the model holds go on with the restored rows, step, optimizer state and
admission counts, so training resumes bit for bit. Sharded: every rank calls save and load
(they are collective), on a directory every rank reaches.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import nn
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.checkpoint.stateful import Stateful

from evdb.database import Database
from evdb.distributed.database import ShardedDatabase
from evdb.distributed.group import ShardedCollection
from evdb.distributed.layout import read_layout
from evdb.distributed.table import ShardedTable
from evdb.errors import InvalidArgumentError
from evdb.manifest import read_manifest
from evdb.table import Table
from evdb.torch import EmbeddingBag, EmbeddingBagCollection

__all__ = ["TABLES_DIR", "DcpTables", "database_of", "load", "save"]

TABLES_DIR = "evdb"  # the tables' checkpoint, inside the DCP directory
AnyDatabase = Database | ShardedDatabase


def _table_database(table: Table | ShardedTable) -> AnyDatabase:
    db = getattr(table, "database", None)  # Table.database, ShardedTable.database
    if not isinstance(db, Database | ShardedDatabase):
        raise InvalidArgumentError(
            f"tables: the module's table {table.name!r} does not say its database; pass the "
            "database itself"
        )
    return db


def database_of(obj: Any) -> AnyDatabase:
    """The one database whose tables obj holds: obj itself (a ``Database`` or a sharded
    one), or the database of an evdb module's tables, of every evdb module in a model, or of
    a ``ShardedCollection``. ``InvalidArgumentError`` if there is none or more than one."""
    if isinstance(obj, Database | ShardedDatabase):
        return obj
    tables: list[Table | ShardedTable] = []
    if isinstance(obj, ShardedCollection):
        tables = list(obj.tables.values())
    elif isinstance(obj, nn.Module):
        for m in obj.modules():
            if isinstance(m, EmbeddingBag):
                tables.append(m.table)
            elif isinstance(m, EmbeddingBagCollection):
                tables.extend(m.tables.values())
    else:
        raise InvalidArgumentError(
            "tables must be an evdb Database, a sharded database, an evdb module (or a model "
            f"holding them) or a ShardedCollection, got {type(obj).__name__}"
        )
    found = {id(db): db for db in map(_table_database, tables)}
    if len(found) != 1:
        raise InvalidArgumentError(
            f"tables: {type(obj).__name__} holds tables of {len(found)} databases; pass the "
            "database itself (one entry per database)"
        )
    return next(iter(found.values()))


class DcpTables(Stateful):
    """A database's tables as one DCP ``Stateful`` entry, by reference.

    Parameters
    ----------
    tables : Database, sharded database, evdb module or model, or ShardedCollection
        What to save or load (``database_of``).
    checkpoint_id : path
        The DCP checkpoint's directory (``dcp.save``'s ``checkpoint_id``).
    loading : bool
        False: ``state_dict()`` writes the evdb checkpoint into ``checkpoint_id/evdb`` (a
        sharded database: collectively) and returns ``{"evdb": "evdb", "step": step}``.
        True: ``state_dict()`` writes nothing (DCP asks it only for the keys to load), and
        ``load_state_dict`` restores the tables from the checkpoint it names, in place.
    """

    def __init__(
        self, tables: Any, checkpoint_id: str | os.PathLike[str], *, loading: bool = False
    ) -> None:
        if not isinstance(checkpoint_id, str | os.PathLike):
            raise InvalidArgumentError(f"checkpoint_id must be a path, got {checkpoint_id!r}")
        self.db = database_of(tables)
        self.root = Path(checkpoint_id)
        self.loading = loading

    def state_dict(self) -> dict[str, Any]:
        if self.loading:
            return {"evdb": "", "step": -1}  # the keys DCP reads; their values are replaced
        dest = self.root / TABLES_DIR
        if isinstance(self.db, ShardedDatabase):
            dest.mkdir(parents=True, exist_ok=True)  # every rank: a shared directory
        else:
            self.root.mkdir(parents=True, exist_ok=True)
        self.db.checkpoint(dest)  # refuses a dest that already holds one
        return {"evdb": TABLES_DIR, "step": self.db.step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        name, step = state_dict.get("evdb"), state_dict.get("step")
        if not isinstance(name, str) or not name or Path(name).name != name:
            raise InvalidArgumentError(
                f"state_dict['evdb'] must name the tables' checkpoint in {self.root}, got {name!r}"
            )
        source = self.root / name
        saved = read_layout(source) if isinstance(self.db, ShardedDatabase) else None
        saved = read_manifest(source) if saved is None else saved
        if saved is not None and saved.get("step") != step:  # checked before anything changes
            raise InvalidArgumentError(
                f"state_dict: the tables' checkpoint {source} is at step {saved.get('step')}, "
                f"the DCP state at {step}: they are of different saves"
            )
        self.db.restore_in_place(source)  # refuses a source that is no checkpoint

    def __repr__(self) -> str:
        return f"DcpTables({self.db!r}, {str(self.root)!r}, loading={self.loading})"


def _is_evdb(obj: Any) -> bool:
    if isinstance(obj, Database | ShardedDatabase | ShardedCollection):
        return True
    return isinstance(obj, EmbeddingBag | EmbeddingBagCollection)


def _wrapped(
    state: Mapping[str, Any], root: str | os.PathLike[str], loading: bool
) -> dict[str, Any]:
    if not isinstance(state, Mapping):
        raise InvalidArgumentError(f"state must be a dict, got {type(state).__name__}")
    if not any(_is_evdb(v) or isinstance(v, DcpTables) for v in state.values()):
        raise InvalidArgumentError(
            f"state: no evdb entry (a Database, a sharded database, an evdb module or a "
            f"ShardedCollection) among {sorted(state)}"
        )
    return {k: DcpTables(v, root, loading=loading) if _is_evdb(v) else v for k, v in state.items()}


def save(state: Mapping[str, Any], checkpoint_id: str | os.PathLike[str], **kwargs: Any) -> Any:
    """``dcp.save(state, checkpoint_id=checkpoint_id, **kwargs)``, each evdb entry saved as
    ``DcpTables`` (its tables' evdb checkpoint in ``checkpoint_id/evdb``). Collective in a
    sharded job. Returns what ``dcp.save`` returns."""
    wrapped = _wrapped(state, checkpoint_id, loading=False)
    return dcp_save(wrapped, checkpoint_id=checkpoint_id, **kwargs)


def load(state: Mapping[str, Any], checkpoint_id: str | os.PathLike[str], **kwargs: Any) -> None:
    """``dcp.load(state, checkpoint_id=checkpoint_id, **kwargs)``, each evdb entry loaded as
    ``DcpTables``: its tables restored in place from ``checkpoint_id/evdb``. Collective in a
    sharded job."""
    wrapped = _wrapped(state, checkpoint_id, loading=True)
    dcp_load(wrapped, checkpoint_id=checkpoint_id, **kwargs)
