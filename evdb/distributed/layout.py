"""The files of a sharded root: ``sharding.json`` (the layout) and the shard directories.

No torch here: the offline tools (reshard, export, info) read these without a process group.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from evdb.checkpoint import fsync_path, read_json
from evdb.distributed.placement import Placement
from evdb.errors import CorruptDataError

__all__ = ["FORMAT", "LAYOUT", "read_layout", "shard_dir", "write_json"]

LAYOUT = "sharding.json"
FORMAT = "evdb-sharded-1"


def shard_dir(root: Path, rank: int) -> Path:
    return root / f"shard-{rank:05d}"


def write_json(path: Path, obj: Any) -> None:
    """Replace path with obj as JSON atomically: write beside, fsync, rename, fsync the dir."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with tmp.open("w") as f:
        json.dump(obj, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent)


def read_layout(root: Path) -> dict[str, Any] | None:
    """root's layout; None if it has none; ``CorruptDataError`` if it cannot be read."""
    layout = read_json(root / LAYOUT, "sharding layout")
    if layout is None:
        return None
    if not isinstance(layout, dict) or layout.get("format") != FORMAT:
        raise CorruptDataError(f"{root / LAYOUT}: not an evdb sharding layout")
    _check_fields(root / LAYOUT, layout)
    return layout


def _check_fields(path: Path, layout: dict[str, Any]) -> None:
    """The fields of a sharding layout that opens, resharding, export and info read, checked:
    ``CorruptDataError`` naming the file and the field, never a ``KeyError`` later."""

    def bad(field: str, what: str) -> CorruptDataError:
        if field not in layout:
            return CorruptDataError(f"{path}: field {field} is missing")
        return CorruptDataError(f"{path}: field {field} must be {what}, got {layout[field]!r}")

    n = layout.get("world_size")
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 99999:
        raise bad("world_size", "an int in [1, 99999] (shard-<rank:05d>)")
    tables = layout.get("tables")
    if not isinstance(tables, dict):
        raise bad("tables", "an object of placements")
    for name, placement in tables.items():
        try:
            Placement.from_dict(placement)
        except (KeyError, TypeError, ValueError) as e:  # ConfigError is a ValueError
            raise CorruptDataError(
                f"{path}: field tables[{name!r}] is not a placement ({placement!r}: {e})"
            ) from e
    ckpt = layout.get("checkpoint")
    if ckpt is None:
        return
    if not isinstance(ckpt, dict):
        raise bad("checkpoint", "an object or null")
    shards = ckpt.get("shards")
    if not isinstance(shards, dict) or not all(isinstance(d, str) for d in shards.values()):
        raise CorruptDataError(
            f"{path}: field checkpoint.shards must be an object of shard manifest digests, "
            f"got {shards!r}"
        )
    if not isinstance(ckpt.get("kind"), str):
        raise CorruptDataError(f"{path}: field checkpoint.kind must be a string")
