"""Interim on-disk format: one ``.npz`` per table, written atomically on flush and close.

The RocksDB tier replaces this (DESIGN.md, "Tiers"); until then a database directory holds::

    evdb.json            {"format": "evdb-npz-1", "step": int, "tables": {name: config}}
    tables/<name>.npz    keys, canonical records (records.record_dtype, as raw bytes),
                         admission state and table counters
    LOCK                 held (flock) by the process that has the database open

Each file is written to a temporary name, fsynced and renamed, and ``evdb.json`` is renamed
last, so a crash leaves either the previous state of a file or the new one. (Table files and the
manifest are not replaced as one atomic unit; the RocksDB tier's write batch will be.)
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from evdb.errors import CorruptDataError

FORMAT = "evdb-npz-1"
MANIFEST = "evdb.json"


def _fsync_replace(tmp: Path, dest: Path) -> None:
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, dest)


def write_manifest(root: Path, step: int, tables: dict[str, dict[str, Any]]) -> None:
    tmp = root / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps({"format": FORMAT, "step": step, "tables": tables}, indent=1))
    _fsync_replace(tmp, root / MANIFEST)


def read_manifest(root: Path) -> dict[str, Any] | None:
    path = root / MANIFEST
    if not path.exists():
        return None
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CorruptDataError(f"{path}: cannot read the manifest ({e})") from e
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CorruptDataError(
            f"{path}: unknown format {meta.get('format') if isinstance(meta, dict) else meta!r}"
        )
    return meta


def table_path(root: Path, name: str) -> Path:
    return root / "tables" / f"{name}.npz"


def write_table(root: Path, name: str, arrays: dict[str, np.ndarray]) -> None:
    dest = table_path(root, name)
    dest.parent.mkdir(exist_ok=True)
    tmp = dest.with_suffix(".npz.tmp")
    with open(tmp, "wb") as f:
        np.savez(f, allow_pickle=False, **arrays)
    _fsync_replace(tmp, dest)


def read_table(root: Path, name: str) -> dict[str, np.ndarray]:
    path = table_path(root, name)
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError, zipfile.BadZipFile) as e:  # a truncated npz is a bad zip
        raise CorruptDataError(f"{path}: cannot read table {name!r} ({e})") from e
