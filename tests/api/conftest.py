"""A serving snapshot with an int64 table and a str table, and an app serving it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import evdb

pytest.importorskip("fastapi")

from evdb.api import Settings, create_app
from evdb.api.snapshots import Snapshot

TOKEN = "s3cret-token"
WORDS = ["the", "of", "and", "évdb", "to", "in"]


def build_snapshot(root: Path, name: str, scale: float, n: int = 300) -> Path:
    """A database with ``item`` (int64 keys, dim 4, rows times ``scale``) and ``tok`` (str keys,
    dim 3), exported for serving to ``root/name``."""
    rng = np.random.default_rng(7)
    with evdb.open(root / f"{name}-db") as db:
        item = db.create_table(
            "item", dim=4, initializer=evdb.init.Normal(std=0.1, seed=3), dram_rows=64
        )
        keys = np.arange(n, dtype=np.int64) * 7 - 1000
        item.upsert(keys, (rng.normal(size=(n, 4)) * scale).astype(np.float32))
        tok = db.create_table("tok", dim=3, key_type="str", keep_strings=True)
        tok.upsert(WORDS, (rng.normal(size=(len(WORDS), 3)) * scale).astype(np.float32))
        evdb.export(db, root / name)
    return root / name


@pytest.fixture(scope="session")
def snapshots(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("serving")
    return build_snapshot(root, "v1", 1.0), build_snapshot(root, "v2", -3.0)


@pytest.fixture
def settings(snapshots: tuple[Path, Path]) -> Settings:
    return Settings(
        path=snapshots[0], token=TOKEN, allow_roots=(snapshots[0].parent,), max_keys=1000
    )


@pytest.fixture
def client(settings: Settings):
    from fastapi.testclient import TestClient

    with TestClient(create_app(settings)) as c:
        yield c


@pytest.fixture
def reference(snapshots: tuple[Path, Path]):
    """The first snapshot opened directly: what every answer must equal."""
    db = evdb.open(snapshots[0], read_only=True)
    yield db
    db.close()


def loaded_app(settings: Settings):
    """An app with its snapshot loaded without the lifespan (for schemathesis' ASGI calls)."""
    app = create_app(settings)
    assert settings.path is not None
    app.state.holder.swap(Snapshot.open(settings.path))
    return app
