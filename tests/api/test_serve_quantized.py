"""An int8 / int4 serving export served by the REST app: lookups, bags, raw bytes and KServe
v2 answer float32 exactly as the quantised table itself does; stats say the dtype and bytes a
row; metrics and the dashboard read it; a reload swaps between a float32 and a quantised
snapshot; the CLI's serve accepts it."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import numpy as np
import pytest

import evdb

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient

from evdb.api import Settings, create_app
from evdb.quantized import open_quantized

from .conftest import TOKEN, build_snapshot

OCTET = "application/octet-stream"
PRESENT = [-1000, -993, 1093]  # keys 7i - 1000 exist in "item"
ABSENT = [5, 2**63 - 1]


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The conftest's snapshot database exported float32 (its own), int8 and int4 (its int64
    table: the str table keeps its strings, which a quantised export refuses)."""
    root = tmp_path_factory.mktemp("quantized")
    out = {"float32": build_snapshot(root, "f32", 2.0)}
    for dtype in ("int8", "int4"):
        evdb.export(root / "f32-db", root / dtype, tables=["item"], dtype=dtype)
        out[dtype] = root / dtype
    return out


@pytest.fixture(params=["int8", "int4"])
def served(request: pytest.FixtureRequest, exports: dict[str, Path]):
    path = exports[request.param]
    settings = Settings(path=path, token=TOKEN, allow_roots=(path.parent,), max_keys=1000)
    with TestClient(create_app(settings)) as client, open_quantized(path) as snap:
        yield client, snap.table("item"), request.param


def test_lookups_answer_the_quantised_table(served) -> None:
    client, table, _ = served
    keys = [PRESENT[0], ABSENT[0], PRESENT[1], PRESENT[0], ABSENT[1], PRESENT[2]]
    r = client.post("/v1/tables/item/lookup", json={"keys": keys})
    assert r.status_code == 200, r.text
    np.testing.assert_array_equal(np.array(r.json()["embeddings"], np.float32), table.lookup(keys))
    assert r.json()["found"] == [True, False, True, True, False, True]
    req = {"keys": keys, "offsets": [0, 2, 2], "weights": [1, 0.5, 2, -1, 3, 1], "combiner": "sum"}
    r = client.post("/v1/tables/item/lookup", json=req)
    assert r.status_code == 200, r.text
    want = table.lookup(keys, [0, 2, 2], req["weights"], "sum")
    np.testing.assert_array_equal(np.array(r.json()["embeddings"], np.float32), want)
    raw = np.array(keys, "<i8")
    r = client.post(
        "/v1/tables/item/lookup",
        content=raw.tobytes(),
        headers={"content-type": OCTET, "accept": OCTET},
    )
    assert r.status_code == 200 and r.headers["x-evdb-shape"] == "6,4"
    np.testing.assert_array_equal(np.frombuffer(r.content, "<f4").reshape(6, 4), table.lookup(raw))
    packed = np.frombuffer(base64.b64decode(r.headers["x-evdb-found"]), np.uint8)
    assert np.unpackbits(packed, count=6, bitorder="little").tolist() == [1, 0, 1, 1, 0, 1]


def test_answers_are_near_the_float32_snapshot(served, exports) -> None:
    client, _, dtype = served
    with evdb.open(exports["float32"], read_only=True) as db:
        want = db.table("item").lookup(PRESENT + ABSENT)
    body = client.post("/v1/tables/item/lookup", json={"keys": PRESENT + ABSENT}).json()
    got = np.array(body["embeddings"], np.float32)
    # rows of N(0, 2) at dim 4: a step of at most ~ range / 15 (int4) or / 255 (int8)
    np.testing.assert_allclose(got, want, atol=0.6 if dtype == "int4" else 0.04)
    np.testing.assert_array_equal(got[len(PRESENT) :], want[len(PRESENT) :])  # defaults


def test_kserve_infer_answers_float32(served) -> None:
    client, table, _ = served
    keys = [[PRESENT[0], ABSENT[0]], [PRESENT[1], PRESENT[2]]]
    req = {"inputs": [{"name": "keys", "shape": [2, 2], "datatype": "INT64", "data": keys}]}
    r = client.post("/v2/models/item/infer", json=req)
    assert r.status_code == 200, r.text
    out = {o["name"]: o for o in r.json()["outputs"]}
    assert out["embeddings"]["datatype"] == "FP32" and out["embeddings"]["shape"] == [2, 2, 4]
    want = table.lookup(np.array(keys).reshape(-1)).reshape(-1)
    np.testing.assert_array_equal(np.array(out["embeddings"]["data"], np.float32), want)


def test_stats_metrics_and_dashboard_read_it(served) -> None:
    client, _, dtype = served
    client.post("/v1/tables/item/lookup", json={"keys": PRESENT + ABSENT})
    listed = client.get("/v1/tables").json()["tables"]
    assert [(t["name"], t["dim"], t["rows"]) for t in listed] == [("item", 4, 300)]
    stats = client.get("/v1/tables/item").json()
    assert stats["dtype"] == dtype and stats["rows"] == 300
    per_row = stats["tiers"]["dram"]["bytes_per_row"]
    assert 8 + 4 + (4 if dtype == "int8" else 2) <= per_row < 40  # the key, the row, the rest
    text = client.get("/metrics").text
    assert 'evdb_table_rows{table="item"} 300.0' in text
    assert 'evdb_reads_total{op="lookup",table="item",tier="not_found"}' in text
    summary = client.get("/v1/dashboard/summary")
    assert summary.status_code == 200, summary.text
    assert summary.json()["tables"][0]["stats"]["dtype"] == dtype
    for view in ("distributions", "projection"):  # from a sample of the dequantised rows
        r = client.get(f"/v1/dashboard/tables/item/{view}")
        assert r.status_code == 200, r.text


def test_neighbours_search_the_dequantised_rows(served) -> None:
    client, table, _ = served
    r = client.post("/v1/tables/item/neighbors", json={"key": PRESENT[0], "k": 5})
    assert r.status_code == 200, r.text
    keys, scores = table.neighbors(PRESENT[0], 5)
    assert r.json()["keys"] == keys.tolist() and PRESENT[0] not in keys.tolist()
    np.testing.assert_allclose(r.json()["scores"], scores, rtol=1e-6)


def test_a_reload_swaps_float32_and_quantised_snapshots(exports) -> None:
    root = exports["float32"].parent
    settings = Settings(path=exports["float32"], token=TOKEN, allow_roots=(root,), max_keys=1000)
    auth = {"authorization": f"Bearer {TOKEN}"}
    with TestClient(create_app(settings)) as client, open_quantized(exports["int8"]) as q:
        r = client.post("/v1/admin/reload", json={"path": str(exports["int8"])}, headers=auth)
        assert r.status_code == 200, r.text
        got = client.post("/v1/tables/item/lookup", json={"keys": PRESENT}).json()["embeddings"]
        np.testing.assert_array_equal(np.array(got, np.float32), q.table("item").lookup(PRESENT))
        r = client.post("/v1/admin/reload", json={"path": str(exports["float32"])}, headers=auth)
        assert r.status_code == 200, r.text
        assert [t["name"] for t in client.get("/v1/tables").json()["tables"]] == ["item", "tok"]


def test_the_cli_checks_a_quantised_export_before_serving(exports, tmp_path) -> None:
    """``evdb serve`` opens PATH once before starting its workers: a quantised export passes
    that check (uvicorn.run is replaced so no server starts), a damaged one is refused."""
    from click.testing import CliRunner

    from evdb.tools import commands_serve

    started: list[str] = []
    runner = CliRunner()
    mp = pytest.MonkeyPatch()
    environ = dict(os.environ)  # the command sets EVDB_ variables for its workers
    try:
        import uvicorn

        mp.setattr(uvicorn, "run", lambda *a, **k: started.append(a[0]))
        result = runner.invoke(commands_serve.cmd_serve, [str(exports["int8"])])
        assert result.exit_code == 0, result.output
        assert started == ["evdb.api:create_app"]
        broken = tmp_path / "broken"
        broken.mkdir()
        for f in exports["int4"].iterdir():
            (broken / f.name).write_bytes(f.read_bytes())
        (broken / "item.evq").write_bytes((broken / "item.evq").read_bytes()[:-8])
        result = runner.invoke(commands_serve.cmd_serve, [str(broken)])
        assert result.exit_code != 0 and "item.evq" in str(result.exception or result.output)
        assert len(started) == 1
    finally:
        mp.undo()
        os.environ.clear()
        os.environ.update(environ)
