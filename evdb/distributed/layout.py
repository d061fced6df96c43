"""The files of a sharded root: ``sharding.json`` (the layout) and the shard directories.

No torch here: the offline tools (reshard, export, info) read these without a process group.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from evdb.checkpoint import fsync_path, read_json
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
    return layout
