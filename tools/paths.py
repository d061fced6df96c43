"""What the ``evdb`` commands check of a PATH argument before they open it."""

from __future__ import annotations

from pathlib import Path

import click

__all__ = ["PATH_ARG", "is_sharded", "require_path"]

PATH_ARG = click.Path(path_type=Path)


def require_path(
    path: Path, name: str = "path", what: str = "evdb database", marker: str = "evdb.json"
) -> None:
    """Exit 4 rather than open (and so create) a database that is not there."""
    if not (path / marker).is_file():
        why = "does not exist" if not path.exists() else f"has no {marker}"
        raise FileNotFoundError(f"{name}: {path} {why}: not an {what}")


def is_sharded(path: Path) -> bool:
    return (path / "sharding.json").is_file()
