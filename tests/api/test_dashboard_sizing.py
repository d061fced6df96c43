"""The dashboard's Sizing route (``POST /v1/dashboard/tables/{name}/sizing``) through the app:
it answers what ``evdb size --json`` prints for the trace, and refuses what ``read_trace``
refuses (truncated, another table, not a trace) without running anything."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import evdb

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient

from evdb.api import Settings, create_app
from evdb.api import dashboard_sizing as sizing_route
from evdb.api.codec import dumps
from evdb.sizing import size_table
from evdb.trace import KeyRecorder, read_trace

from .dashboard_data import build_database

OCTET = {"content-type": "application/octet-stream"}


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_database(tmp_path_factory.mktemp("dashboard-sizing") / "db")


@pytest.fixture(scope="module")
def client(database: Path) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(path=database, sample_interval_s=60))) as c:
        yield c


def served_config(database: Path, name: str) -> evdb.TableConfig:
    with evdb.open(database, read_only=True) as db:
        return db.table(name).config


def record(
    path: Path, table: str, config: evdb.TableConfig, *, close: bool = True, seed: int = 0
) -> Path:
    """60 batches of 512 Zipf(1.2) keys over 3,000 ids, recorded whole (rate 1)."""
    rng = np.random.default_rng(seed)
    rec = KeyRecorder(path, table=table, config=config, rate=1.0)
    for step in range(60):
        keys = (rng.zipf(1.2, 512) % 3000).astype(np.int64)
        rec.record("pull", keys, step, counted=int(np.unique(keys).shape[0]))
    if close:
        rec.close()
    else:
        rec.flush()
    return path


def post(client: TestClient, table: str, body: bytes, **params: Any) -> Any:
    return client.post(f"/v1/dashboard/tables/{table}/sizing", content=body, headers=OCTET,
                       params=params)  # fmt: skip


@pytest.mark.parametrize("dram_rows", [None, 200])
def test_the_answer_is_what_evdb_size_prints(
    client: TestClient, database: Path, tmp_path: Path, dram_rows: int | None
) -> None:
    config = served_config(database, "zipf")
    if dram_rows is not None:  # another size than the served table's: analysed as recorded
        config = dataclasses.replace(config, dram=evdb.DramConfig(capacity_rows=dram_rows))
    path = record(tmp_path / "zipf.trace", "zipf", config)
    r = post(client, "zipf", path.read_bytes())
    assert r.status_code == 200, r.text
    got = r.json()
    local = size_table(read_trace(path))
    assert got["report"] == json.loads(dumps(local.to_dict()))
    assert got["report"]["current_dram_rows"] == dram_rows
    assert got["config_matches"] is (dram_rows is None)
    assert got["trace"]["batches"] == 60 and got["trace"]["complete"] is True
    rows = np.asarray(got["lru_points"]["rows"])
    assert rows[0] == 1 and rows[-1] == local.lru.distinct_estimate
    assert np.allclose(got["lru_points"]["hit_rate"], local.lru.hit_rate(rows), atol=1e-6)
    again = post(client, "zipf", path.read_bytes())  # kept: not analysed again
    assert again.json()["seconds"] == 0.0 and again.json()["report"] == got["report"]


def test_a_trace_still_being_recorded_needs_allow_incomplete(
    client: TestClient, database: Path, tmp_path: Path
) -> None:
    path = record(tmp_path / "open.trace", "zipf", served_config(database, "zipf"), close=False)
    r = post(client, "zipf", path.read_bytes())
    assert r.status_code == 422 and "allow_incomplete" in r.json()["detail"], r.text
    r = post(client, "zipf", path.read_bytes(), allow_incomplete="true")
    assert r.status_code == 200, r.text
    assert r.json()["trace"]["complete"] is False and r.json()["trace"]["batches"] == 60


@pytest.mark.parametrize(
    ("case", "status", "match"),
    [
        ("truncated", 422, "is truncated"),
        ("another table", 422, "recorded from table 'ages', not 'zipf'"),
        ("not a trace", 422, "not an evdb key trace"),
        ("json", 415, "content-type: expected application/octet-stream"),
        ("no such table", 404, "no table named 'nope'"),
        ("too big", 413, "limit of 1000"),
    ],
)
def test_refusals_name_what_is_wrong(
    client: TestClient,
    database: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    case: str,
    status: int,
    match: str,
) -> None:
    table, headers = "zipf", OCTET
    body = record(tmp_path / "t.trace", "zipf", served_config(database, "zipf")).read_bytes()
    if case == "truncated":
        body = body[: len(body) // 2]
    elif case == "another table":
        body = record(tmp_path / "a.trace", "ages", served_config(database, "ages")).read_bytes()
    elif case == "not a trace":
        body = b"key\n1\n2\n"
    elif case == "json":
        headers = {"content-type": "application/json"}
    elif case == "no such table":
        table = "nope"
    elif case == "too big":
        monkeypatch.setattr(sizing_route, "MAX_TRACE_BYTES", 1000)
    r = client.post(f"/v1/dashboard/tables/{table}/sizing", content=body, headers=headers)
    assert r.status_code == status and match in r.json()["detail"], r.text


def test_one_analysis_at_a_time(client: TestClient, database: Path, tmp_path: Path) -> None:
    """While an analysis runs, another is refused with 429 (a kept answer is still given)."""

    class Busy:
        def locked(self) -> bool:
            return True

    path = record(tmp_path / "b.trace", "zipf", served_config(database, "zipf"), seed=3)
    jobs = sizing_route.jobs_of_app(client.app)
    lock = jobs.lock
    jobs.lock = Busy()  # type: ignore[assignment]
    try:
        r = post(client, "zipf", path.read_bytes())
        assert r.status_code == 429 and "another sizing analysis" in r.json()["detail"]
    finally:
        jobs.lock = lock
    assert post(client, "zipf", path.read_bytes()).status_code == 200


def test_without_the_dashboard_there_is_no_sizing_route(database: Path, tmp_path: Path) -> None:
    body = record(tmp_path / "z.trace", "zipf", served_config(database, "zipf")).read_bytes()
    with TestClient(create_app(Settings(path=database, dashboard=False))) as c:
        assert post(c, "zipf", body).status_code == 404
