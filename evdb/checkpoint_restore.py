"""Resuming from a checkpoint: ``evdb.open(workdir, restore=ckpt)``.

A full checkpoint (``evdb.checkpoint``) is a database directory: its RocksDB checkpoint is
restored into the work directory's working copy. An incremental one is a step in a chain
that ends at a full one: the full one is restored first, then each incremental's changes are
applied in order, oldest first: the column families it no longer has are dropped, and per
table the keys missing from its ``keys.npy`` are removed and its changed rows written; its
``metadata.npz`` then replaces the metadata. The checkpoints are only read, never written:
table files are hard-linked, the rest copied, so each stays verifiable and can be resumed
from again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from evdb.checkpoint import DELTA, METADATA
from evdb.config import TableConfig
from evdb.errors import CorruptDataError, InvalidArgumentError
from evdb.manifest import MANIFEST, read_manifest, verify
from evdb.records import RecordBatch
from evdb.storage import (
    CHECKPOINTS,
    POINTER,
    read_pointer,
    rocks_strings,
    rocks_tier,
)
from evdb.tiers.rocks import RocksStrings, RocksTier
from evdb.tiers.store import RocksStore

__all__ = ["chain_of", "check_source", "materialize"]


def check_source(restore: str | os.PathLike[str], verify_files: bool) -> Path:
    """The checkpoint ``restore=`` names, checked (and verified, unless told not to):
    ``InvalidArgumentError`` if it is not a checkpoint a database can start from."""
    if not isinstance(restore, (str, os.PathLike)):
        raise InvalidArgumentError(f"restore must be a path, got {restore!r}")
    root = Path(restore)
    manifest = read_manifest(root)
    if manifest is None:
        raise InvalidArgumentError(f"restore: {root} is not an evdb checkpoint (no {MANIFEST})")
    if manifest.get("kind") != "incremental" and not (root / POINTER).is_file():
        raise InvalidArgumentError(
            f"restore: {root} is a {manifest.get('kind')!r} export, not a checkpoint a "
            "database can start from"
        )
    if verify_files:
        verify(root)
    return root


def chain_of(root: Path) -> list[Path]:
    """The checkpoints to apply to rebuild root, oldest (the full one) first."""
    chain = [root]
    manifest = read_manifest(root)
    while manifest is not None and manifest["kind"] == "incremental":
        base = Path(manifest["base"])
        if base.resolve() in {p.resolve() for p in chain}:  # verify=False skips the digests
            raise CorruptDataError(f"{root}: its chain of base checkpoints loops at {base}")
        chain.append(base)
        manifest = read_manifest(base)
        if manifest is None:
            raise CorruptDataError(f"{base}: the base checkpoint is gone or no longer one")
    return chain[::-1]


def materialize(root: Path, working: Path, *, mmap_reads: bool) -> RocksStore:
    """A working copy at ``working`` of the state of the checkpoint at root: its RocksDB
    checkpoint (for an incremental one, the full checkpoint at the root of its chain, then
    each incremental's deletions and changed rows, in order), opened. Reads root, never
    writes there."""
    chain = chain_of(root)
    full = chain[0]
    pointer = read_pointer(full)
    if pointer is None:
        raise CorruptDataError(f"{full}: no {POINTER}: not a full checkpoint")
    RocksStore.restore(full / CHECKPOINTS / str(pointer["checkpoint"]), working)
    store = RocksStore(working, pointer["column_families"], mmap_reads=mmap_reads)
    for step in chain[1:]:
        with np.load(step / METADATA, allow_pickle=False) as z:
            meta = {k: z[k].tobytes() for k in z.files}
        families = json.loads(meta.pop("column_families"))
        tables = json.loads(meta["manifest"])["tables"]
        for cf in set(store.column_families) - set(families):
            store.drop_column_family(cf)
        for name, cfg in tables.items():
            config = TableConfig.from_dict(cfg)
            _apply_delta(
                rocks_tier(store, name, config),
                rocks_strings(store, name, config),
                step / DELTA / name,
            )
        old = [bytes(k).decode() for k in store.db.keys()]  # type: ignore[arg-type]
        store.delete_meta([k for k in old if k not in meta])
        store.put_meta(meta)
    return store


def _apply_delta(tier: RocksTier, strings: RocksStrings | None, delta: Path) -> None:
    """Make a table's column family hold the keys of ``keys.npy``, with the changed rows."""
    keep = np.load(delta / "keys.npy")
    gone: list[np.ndarray] = []
    for keys in tier.scan_keys(65536):  # keys only: the values stay on disk
        at = np.searchsorted(keep, keys).clip(max=max(keep.shape[0] - 1, 0))
        missing = keys if keep.shape[0] == 0 else keys[keep[at] != keys]
        if missing.shape[0]:
            gone.append(missing)
    if gone:
        removed = np.concatenate(gone)
        tier.remove(removed, present=np.ones(removed.shape[0], dtype=bool))
        if strings is not None:
            strings.remove(removed)
    for part in sorted(delta.glob("rows-*.npz")):
        with np.load(part, allow_pickle=False) as z:
            records = RecordBatch.unpack(z["records"].tobytes(), tier.dim, tier.n_slots)
            keys = z["keys"]
            if strings is not None and "strings" in z.files:
                blob, ends = z["strings"].tobytes(), z["string_ends"].tolist()
                starts = [0, *ends[:-1]]
                strings.put(keys, [blob[a:b].decode() for a, b in zip(starts, ends, strict=True)])
        tier.put(keys, records, existed=np.zeros(keys.shape[0], dtype=bool))
