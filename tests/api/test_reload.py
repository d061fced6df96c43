"""Reloads under load: every answer comes whole from one snapshot, and none fails."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

import evdb
from evdb.api.snapshots import Snapshot, SnapshotHolder

from .conftest import TOKEN

KEYS = [-1000, -993, 5, 1093, 77]


def test_old_snapshot_closes_after_its_last_request(snapshots) -> None:
    holder = SnapshotHolder(Snapshot.open(snapshots[0]))
    old = holder.acquire()
    assert old is not None
    holder.swap(Snapshot.open(snapshots[1]))
    assert holder.current is not old
    old.tables["item"].lookup(KEYS)  # still open: a request holds it
    holder.release(old)
    with pytest.raises(evdb.DatabaseClosedError):
        old.tables["item"].lookup(KEYS)
    new = holder.current
    holder.close()
    with pytest.raises(evdb.DatabaseClosedError):
        new.tables["item"].lookup(KEYS)


def test_lookups_during_reloads_each_match_one_snapshot(client, snapshots) -> None:
    expected = []
    for path in snapshots:
        with evdb.open(path, read_only=True) as db:
            expected.append(db.table("item").lookup(KEYS))
    assert not np.array_equal(expected[0], expected[1])
    seen = [0, 0]
    failures: list[str] = []
    stop = threading.Event()

    def hammer() -> None:
        while not stop.is_set():
            r = client.post("/v1/tables/item/lookup", json={"keys": KEYS})
            if r.status_code != 200:
                failures.append(f"{r.status_code} {r.text}")
                continue
            got = np.array(r.json()["embeddings"], np.float32)
            match = [np.array_equal(got, e) for e in expected]
            if not any(match):
                failures.append("an answer matching neither snapshot")
            seen[match.index(True) if any(match) else 0] += 1

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        auth = {"authorization": f"Bearer {TOKEN}"}
        for i in range(12):
            path = snapshots[(i + 1) % 2]
            r = client.post("/v1/admin/reload", json={"path": str(path)}, headers=auth)
            assert r.status_code == 200, r.text
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not failures, failures[:3]
    assert seen[0] > 0 and seen[1] > 0  # both snapshots were served


def test_a_reload_reaches_the_other_workers(settings, snapshots, tmp_path) -> None:
    """Two apps sharing a state file stand for two worker processes: a reload taken by one
    is served by the other from its next request on."""
    from dataclasses import replace

    from fastapi.testclient import TestClient

    from evdb.api import create_app

    shared = replace(settings, state_file=tmp_path / "snapshot")
    with TestClient(create_app(shared)) as a, TestClient(create_app(shared)) as b:
        version = [c.get("/v1/tables").json()["snapshot"]["version"] for c in (a, b)]
        assert version[0] == version[1]
        auth = {"authorization": f"Bearer {TOKEN}"}
        r = a.post("/v1/admin/reload", json={"path": str(snapshots[1])}, headers=auth)
        assert r.status_code == 200
        new = r.json()["snapshot"]["version"]
        assert new != version[0]
        assert b.get("/v1/tables").json()["snapshot"]["version"] == new
        assert a.get("/v1/tables").json()["snapshot"]["version"] == new
        with TestClient(create_app(shared)) as restarted:  # a worker started after the reload
            assert restarted.get("/v1/tables").json()["snapshot"]["version"] == new
        r = a.post("/v1/admin/reload", json={"path": str(snapshots[0])}, headers=auth)
        assert b.get("/v1/tables").json()["snapshot"]["version"] == version[0]


def test_checksums_are_read_once_per_snapshot(settings, snapshots, tmp_path, monkeypatch) -> None:
    """A start path evdb serve checked, and a reload another worker checked and published,
    open without a second checksum pass; a reload taken here is checked."""
    from dataclasses import replace

    from fastapi.testclient import TestClient

    from evdb.api import create_app

    real_open = evdb.open
    verified: list[tuple[str, bool]] = []

    def spy(path, **kwargs):  # type: ignore[no-untyped-def]
        verified.append((Path(path).name, kwargs["verify"]))
        return real_open(path, **kwargs)

    monkeypatch.setattr("evdb.api.snapshots.evdb.open", spy)
    shared = replace(settings, state_file=tmp_path / "snapshot", path_verified=True)
    auth = {"authorization": f"Bearer {TOKEN}"}
    with TestClient(create_app(shared)) as a, TestClient(create_app(shared)) as b:
        assert verified == [("v1", False), ("v1", False)]
        a.post("/v1/admin/reload", json={"path": str(snapshots[1])}, headers=auth)
        b.get("/v1/tables")  # b follows
        assert verified[2:] == [("v2", True), ("v2", False)]
    with TestClient(create_app(replace(settings, path_verified=False))):
        assert verified[-1] == ("v1", True)
