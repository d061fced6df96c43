"""Every endpoint and every refusal, in process through fastapi's TestClient."""

from __future__ import annotations

import base64
import json
import re

import numpy as np
import pytest

import evdb
from evdb.api import Settings, create_app

from .conftest import TOKEN, WORDS

OCTET = "application/octet-stream"
PRESENT = [-1000, -993, 1093]  # keys 7i - 1000 exist in "item"
ABSENT = [5, 2**63 - 1, -(2**63)]


def post_json(client, url, raw: bytes, **headers):
    return client.post(url, content=raw, headers={"content-type": "application/json", **headers})


# -- v1 lookups ----------------------------------------------------------------------------


def test_lookup_equals_table_lookup_and_found_equals_contains(client, reference) -> None:
    keys = [PRESENT[0], ABSENT[0], PRESENT[1], PRESENT[0], *ABSENT[1:], PRESENT[2]]
    r = client.post("/v1/tables/item/lookup", json={"keys": keys})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["table"] == "item" and body["dim"] == 4
    table = reference.table("item")
    np.testing.assert_array_equal(np.array(body["embeddings"], np.float32), table.lookup(keys))
    want_found = [True, False, True, True, False, False, True]
    assert body["found"] == table.contains(keys).tolist() == want_found


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn", None])
def test_bag_lookup_equals_table_lookup(client, reference, combiner) -> None:
    keys = [PRESENT[0], PRESENT[1], ABSENT[0], PRESENT[2], PRESENT[1]]
    req = {"keys": keys, "offsets": [0, 2, 2], "weights": [1, 0.5, 2, -1, 3]}
    if combiner is not None:
        req["combiner"] = combiner
    r = client.post("/v1/tables/item/lookup", json=req)
    assert r.status_code == 200, r.text
    want = reference.table("item").lookup(keys, [0, 2, 2], req["weights"], combiner)
    np.testing.assert_array_equal(np.array(r.json()["embeddings"], np.float32), want)
    assert len(r.json()["found"]) == len(keys)  # per key, not per bag


def test_str_table_takes_strings(client, reference) -> None:
    keys = [WORDS[3], "never-seen", WORDS[0]]
    r = client.post("/v1/tables/tok/lookup", json={"keys": keys})
    assert r.status_code == 200, r.text
    want = reference.table("tok").lookup(keys)
    np.testing.assert_array_equal(np.array(r.json()["embeddings"], np.float32), want)
    assert r.json()["found"] == [True, False, True]


def test_binary_request_and_response(client, reference) -> None:
    keys = np.array([PRESENT[2], ABSENT[0], PRESENT[0]], dtype="<i8")
    r = client.post(
        "/v1/tables/item/lookup",
        content=keys.tobytes(),
        headers={"content-type": OCTET, "accept": OCTET},
    )
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == OCTET
    rows, dim = map(int, r.headers["x-evdb-shape"].split(","))
    got = np.frombuffer(r.content, dtype="<f4").reshape(rows, dim)
    np.testing.assert_array_equal(got, reference.table("item").lookup(keys))
    packed = np.frombuffer(base64.b64decode(r.headers["x-evdb-found"]), np.uint8)
    found = np.unpackbits(packed, count=rows, bitorder="little").astype(bool)
    assert found.tolist() == [True, False, True]
    # binary in, JSON out; JSON in, binary out
    r = client.post(
        "/v1/tables/item/lookup", content=keys.tobytes(), headers={"content-type": OCTET}
    )
    np.testing.assert_array_equal(np.array(r.json()["embeddings"], np.float32), got)
    r = client.post(
        "/v1/tables/item/lookup", json={"keys": keys.tolist()}, headers={"accept": OCTET}
    )
    assert r.content == got.tobytes()


def test_empty_lookup(client) -> None:
    r = client.post("/v1/tables/item/lookup", json={"keys": []})
    assert r.status_code == 200 and r.json()["embeddings"] == [] and r.json()["found"] == []


def test_lookups_never_create_rows_or_count(client) -> None:
    before = client.get("/v1/tables/item").json()
    for _ in range(3):
        client.post("/v1/tables/item/lookup", json={"keys": ABSENT})
    after = client.get("/v1/tables/item").json()
    assert after["rows"] == before["rows"] == 300
    assert after["admission"] == before["admission"]


BAD_LOOKUPS = [
    (b'{"keys": [1, NaN]}', 422, r"^body: not valid JSON"),
    (b'{"keys": [1], "weights": [Infinity]}', 422, r"^body: not valid JSON"),
    (b'{"keys": [1, "2"]}', 422, r"^keys\[1\]: "),
    (b'{"keys": [1, 2, true]}', 422, r"^keys\[2\]: "),
    (b'{"keys": [1.5]}', 422, r"^keys\[0\]: "),
    (b'{"keys": [9223372036854775808]}', 422, r"^keys\[0\]: .*outside int64"),
    (b'{"keys": [0, -9223372036854775809]}', 422, r"^keys\[1\]: .*outside int64"),
    (b'{"keys": [0, 0, 1' + b"0" * 30 + b"]}", 422, r"^keys\[2\]: integer outside int64"),
    (b'{"keys": [1, 2], "offsets": [1]}', 422, r"offsets\[0\]"),
    (b'{"keys": [1, 2], "offsets": [0, 3]}', 422, r"offsets"),
    (b'{"keys": [1, 2], "offsets": [0, -1]}', 422, r"^offsets\[1\]: "),
    (b'{"keys": [1, 2], "offsets": [0], "weights": [1]}', 422, r"weights"),
    (b'{"keys": [1, 2], "offsets": [0], "weights": [1, "a"]}', 422, r"^weights\[1\]: "),
    (b'{"keys": [1], "offsets": [0], "combiner": "max"}', 422, r"^combiner: "),
    (b'{"keys": [1], "what": 1}', 422, r"^what: Extra inputs"),
    (b'{"key": [1]}', 422, r"^keys: Field required"),
    (b'{"keys": "1"}', 422, r"^keys: "),
    (b"[1, 2]", 422, r"^body: expected a JSON object"),
    (b"", 422, r"^body: not valid JSON"),
    (b'{"keys": [1,', 422, r"^body: not valid JSON"),
    (b"\xff\xfe", 422, r"^body: not valid JSON"),
]


@pytest.mark.parametrize("raw,status,message", BAD_LOOKUPS)
def test_bad_lookups_name_the_field_and_change_nothing(client, raw, status, message) -> None:
    r = post_json(client, "/v1/tables/item/lookup", raw)
    assert r.status_code == status, r.text
    assert re.search(message, r.json()["detail"]), r.json()
    assert set(r.json()) == {"detail"}  # the message only: the input is never echoed


def test_str_keys_to_an_int_table_and_back(client) -> None:
    r = client.post("/v1/tables/item/lookup", json={"keys": ["a"]})
    assert r.status_code == 422 and r.json()["detail"].startswith("keys[0]: ")
    r = client.post("/v1/tables/tok/lookup", json={"keys": ["a", 3]})
    assert r.status_code == 422 and r.json()["detail"].startswith("keys[1]: ")
    r = client.post("/v1/tables/tok/lookup", content=b"\0" * 8, headers={"content-type": OCTET})
    assert r.status_code == 415


def test_unknown_table_is_404(client) -> None:
    r = client.post("/v1/tables/nope/lookup", json={"keys": [1]})
    assert r.status_code == 404 and "nope" in r.json()["detail"]
    assert client.get("/v1/tables/nope").status_code == 404


def test_too_many_keys_is_413(client, settings) -> None:
    n = settings.max_keys + 1
    assert client.post("/v1/tables/item/lookup", json={"keys": [1] * n}).status_code == 413
    raw = np.zeros(n, "<i8").tobytes()
    r = client.post("/v1/tables/item/lookup", content=raw, headers={"content-type": OCTET})
    assert r.status_code == 413 and "1001 keys" in r.json()["detail"]
    huge = b'{"keys": [' + b"1," * settings.max_body_bytes + b"1]}"
    assert post_json(client, "/v1/tables/item/lookup", huge).status_code == 413


def test_ragged_binary_body_and_unknown_media_type(client) -> None:
    r = client.post("/v1/tables/item/lookup", content=b"\0" * 12, headers={"content-type": OCTET})
    assert r.status_code == 422 and "12 bytes" in r.json()["detail"]
    r = client.post(
        "/v1/tables/item/lookup", content=b"keys=1", headers={"content-type": "text/plain"}
    )
    assert r.status_code == 415


def test_tables_and_stats(client, snapshots) -> None:
    r = client.get("/v1/tables")
    assert r.status_code == 200
    body = r.json()
    by_name = {t["name"]: t for t in body["tables"]}
    assert by_name["item"] == {
        "name": "item",
        "dim": 4,
        "rows": 300,
        "key_type": "int64",
        "snapshot": body["snapshot"]["version"],
    }
    assert by_name["tok"]["key_type"] == "str" and by_name["tok"]["rows"] == len(WORDS)
    assert body["snapshot"]["path"] == str(snapshots[0])
    stats = client.get("/v1/tables/item").json()
    assert stats["rows"] == 300 and "dram" in stats["tiers"]


def test_health_and_readiness(client, settings) -> None:
    from fastapi.testclient import TestClient

    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").status_code == 200
    assert client.get("/v2/health/live").json() == {"live": True}
    assert client.get("/v2/health/ready").json() == {"ready": True}
    empty = Settings(path=None, max_keys=10)
    with TestClient(create_app(empty)) as idle:
        assert idle.get("/healthz").status_code == 200
        assert idle.get("/readyz").status_code == 503
        assert idle.get("/v2/health/ready").status_code == 503
        assert idle.post("/v1/tables/item/lookup", json={"keys": [1]}).status_code == 503


def test_docs_and_openapi(client) -> None:
    assert client.get("/docs").status_code == 200
    spec = client.get("/openapi.json").json()
    lookup = spec["paths"]["/v1/tables/{name}/lookup"]["post"]
    assert set(lookup["requestBody"]["content"]) == {"application/json", OCTET}
    schemas = spec["components"]["schemas"]
    assert {"LookupRequest", "LookupResponse", "InferRequest", "InferInput"} <= set(schemas)


# -- v2 (KServe / Open Inference Protocol) -------------------------------------------------


def test_v2_metadata(client) -> None:
    server = client.get("/v2").json()
    assert server["name"] == "evdb" and "binary_tensor_data" in server["extensions"]
    meta = client.get("/v2/models/item").json()
    version = meta["versions"][0]
    assert meta["inputs"] == [{"name": "keys", "datatype": "INT64", "shape": [-1]}]
    assert meta["outputs"][0] == {"name": "embeddings", "datatype": "FP32", "shape": [-1, 4]}
    assert client.get("/v2/models/tok").json()["inputs"][0]["datatype"] == "BYTES"
    assert client.get(f"/v2/models/item/versions/{version}").status_code == 200
    assert client.get("/v2/models/item/ready").json() == {"name": "item", "ready": True}
    assert client.get(f"/v2/models/item/versions/{version}/ready").status_code == 200
    r = client.get("/v2/models/item/versions/0/ready")
    assert r.status_code == 404 and r.json()["error"].startswith("version: ")
    r = client.get("/v2/models/nope")
    assert r.status_code == 404 and "error" in r.json()


def test_v2_infer_json(client, reference) -> None:
    keys = [[PRESENT[0], ABSENT[0]], [PRESENT[1], PRESENT[2]]]  # shape [2, 2]
    req = {
        "id": "r1",
        "inputs": [{"name": "keys", "shape": [2, 2], "datatype": "INT64", "data": keys}],
    }
    r = client.post("/v2/models/item/infer", json=req)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["id"] == "r1" and body["model_name"] == "item"
    out = {o["name"]: o for o in body["outputs"]}
    flat = np.array(keys).reshape(-1)
    assert out["embeddings"]["shape"] == [2, 2, 4] and out["found"]["shape"] == [2, 2]
    want = reference.table("item").lookup(flat)
    np.testing.assert_array_equal(np.array(out["embeddings"]["data"], np.float32), want.reshape(-1))
    assert out["found"]["data"] == [True, False, True, True]
    only = {**req, "outputs": [{"name": "found"}]}
    assert [
        o["name"] for o in client.post("/v2/models/item/infer", json=only).json()["outputs"]
    ] == ["found"]


def test_v2_infer_binary_both_ways(client, reference) -> None:
    keys = np.array([PRESENT[2], ABSENT[1], PRESENT[0]], dtype="<i8")
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "keys",
                    "shape": [3],
                    "datatype": "INT64",
                    "parameters": {"binary_data_size": keys.nbytes},
                }
            ],
            "outputs": [
                {"name": "embeddings", "parameters": {"binary_data": True}},
                {"name": "found", "parameters": {"binary_data": False}},
            ],
        }
    ).encode()
    r = client.post(
        "/v2/models/item/infer",
        content=header + keys.tobytes(),
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert r.status_code == 200, r.text
    n = int(r.headers["inference-header-content-length"])
    head = json.loads(r.content[:n])
    emb, found = head["outputs"]
    assert emb["parameters"]["binary_data_size"] == 3 * 4 * 4 and "data" not in emb
    got = np.frombuffer(r.content[n:], "<f4").reshape(3, 4)
    np.testing.assert_array_equal(got, reference.table("item").lookup(keys))
    assert found["data"] == [True, False, True]


def test_v2_infer_bytes_keys_for_a_str_table(client, reference) -> None:
    req = {"inputs": [{"name": "keys", "shape": [2], "datatype": "BYTES", "data": ["of", "zzz"]}]}
    r = client.post("/v2/models/tok/infer", json=req)
    assert r.status_code == 200, r.text
    emb = r.json()["outputs"][0]
    want = reference.table("tok").lookup(["of", "zzz"]).reshape(-1)
    np.testing.assert_array_equal(np.array(emb["data"], np.float32), want)
    raw = b"".join(len(w.encode()).to_bytes(4, "little") + w.encode() for w in ["of", "évdb"])
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "keys",
                    "shape": [2],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(raw)},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    r = client.post(
        "/v2/models/tok/infer",
        content=header + raw,
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    n = int(r.headers["inference-header-content-length"])
    got = np.frombuffer(r.content[n : n + 2 * 3 * 4], "<f4").reshape(2, 3)
    np.testing.assert_array_equal(got, reference.table("tok").lookup(["of", "évdb"]))


BAD_INFERS = [
    ({"inputs": []}, r"^inputs: expected exactly one input named 'keys'"),
    ({"inputs": [{"name": "ids", "shape": [1], "datatype": "INT64", "data": [1]}]}, r"'keys'"),
    ({"inputs": [{"name": "keys", "shape": [1], "datatype": "FP32", "data": [1]}]}, r"datatype"),
    ({"inputs": [{"name": "keys", "shape": [3], "datatype": "INT64", "data": [1, 2]}]}, r"shape"),
    (
        {"inputs": [{"name": "keys", "shape": [2], "datatype": "INT64", "data": [1, "x"]}]},
        r"^inputs\[0\]\.data\[1\]: ",
    ),
    (
        {"inputs": [{"name": "keys", "shape": [1], "datatype": "INT64", "data": [2**63]}]},
        r"^inputs\[0\]\.data\[0\]: .*outside int64",
    ),
    (
        {"inputs": [{"name": "keys", "shape": [-1], "datatype": "INT64", "data": [1]}]},
        r"^inputs\[0\]\.shape\[0\]: ",
    ),
    ({"inputs": [{"name": "keys", "shape": [1], "datatype": "INT64"}]}, r"^inputs\[0\]\.data"),
    (
        {
            "inputs": [{"name": "keys", "shape": [1], "datatype": "INT64", "data": [1]}],
            "outputs": [{"name": "logits"}],
        },
        r"^outputs\[0\]\.name: ",
    ),
    ({"inputs": "keys"}, r"^inputs: "),
]


@pytest.mark.parametrize("req,message", BAD_INFERS)
def test_bad_infer_requests_are_422_with_an_error(client, req, message) -> None:
    r = client.post("/v2/models/item/infer", json=req)
    assert r.status_code == 422, r.text
    assert re.search(message, r.json()["error"]), r.json()


def test_bad_binary_infer_requests(client) -> None:
    tensor = {"name": "keys", "shape": [2], "datatype": "INT64"}
    tensor["parameters"] = {"binary_data_size": 16}
    header = json.dumps({"inputs": [tensor]}).encode()
    url = "/v2/models/item/infer"
    for length, body, status in [
        ("9999", header + b"\0" * 16, 422),  # header longer than the body
        ("abc", header + b"\0" * 16, 422),
        (str(len(header)), header + b"\0" * 8, 422),  # fewer bytes than claimed
        (str(len(header) - 1), header + b"\0" * 16, 422),  # cuts the JSON
    ]:
        r = client.post(url, content=body, headers={"Inference-Header-Content-Length": length})
        assert r.status_code == status, (length, r.text)
        assert r.json()["error"]


# -- metrics -------------------------------------------------------------------------------


def test_metrics_count_by_route_and_table_never_by_key(client) -> None:
    secret_key = 8_765_432_123
    client.post("/v1/tables/item/lookup", json={"keys": [secret_key, PRESENT[0]]})
    client.post("/v1/tables/secret-table-name/lookup", json={"keys": [1]})
    text = client.get("/metrics").text
    assert (
        'evdb_requests_total{endpoint="/v1/tables/{name}/lookup",status="200",table="item"} 1.0'
        in text
    )
    assert (
        'evdb_requests_total{endpoint="/v1/tables/{name}/lookup",status="404",table=""} 1.0' in text
    )
    assert 'evdb_rows_served_total{table="item"} 2.0' in text
    assert 'evdb_keys_missing_total{table="item"} 1.0' in text
    assert "evdb_request_duration_seconds_bucket" in text
    assert 'evdb_cache_misses_total{table="item"}' in text and "evdb_table_rows" in text
    assert str(secret_key) not in text and "secret-table-name" not in text


# -- admin ---------------------------------------------------------------------------------


def test_reload_needs_the_token(client, snapshots) -> None:
    url, body = "/v1/admin/reload", {"path": str(snapshots[1])}
    r = client.post(url, json=body)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    r = client.post(url, json=body, headers={"authorization": "Bearer wrong"})
    assert r.status_code == 403
    r = client.post(url, json=body, headers={"authorization": f"Basic {TOKEN}"})
    assert r.status_code == 401


def test_reload_only_under_allowed_roots(client, snapshots, tmp_path) -> None:
    auth = {"authorization": f"Bearer {TOKEN}"}
    escape = str(snapshots[0].parent / ".." / snapshots[0].parent.name / ".." / "x")
    for path in ["/etc", escape, str(tmp_path)]:
        r = client.post("/v1/admin/reload", json={"path": path}, headers=auth)
        assert r.status_code == 403 and r.json()["detail"].startswith("path: "), path
    missing = snapshots[0].parent / "not-there"
    r = client.post("/v1/admin/reload", json={"path": str(missing)}, headers=auth)
    assert r.status_code == 404
    r = client.post("/v1/admin/reload", json={"path": 5}, headers=auth)
    assert r.status_code == 422 and r.json()["detail"].startswith("path: ")


def test_reload_swaps_the_snapshot(client, snapshots) -> None:
    auth = {"authorization": f"Bearer {TOKEN}"}
    before = client.post("/v1/tables/item/lookup", json={"keys": PRESENT}).json()
    old_version = client.get("/v1/tables").json()["snapshot"]["version"]
    r = client.post("/v1/admin/reload", json={"path": str(snapshots[1])}, headers=auth)
    assert r.status_code == 200, r.text
    assert r.json()["previous"]["version"] == old_version
    after = client.post("/v1/tables/item/lookup", json={"keys": PRESENT}).json()
    np.testing.assert_allclose(
        np.array(after["embeddings"]), -3.0 * np.array(before["embeddings"]), rtol=1e-6
    )
    assert client.get("/v1/tables").json()["snapshot"]["version"] == r.json()["snapshot"]["version"]
    assert "evdb_snapshot_reloads_total 1.0" in client.get("/metrics").text


def test_admin_is_off_without_a_token_file(settings, snapshots) -> None:
    from fastapi.testclient import TestClient

    closed = Settings(path=settings.path, token=None, allow_roots=settings.allow_roots)
    with TestClient(create_app(closed)) as c:
        r = c.post(
            "/v1/admin/reload",
            json={"path": str(snapshots[1])},
            headers={"authorization": f"Bearer {TOKEN}"},
        )
        assert r.status_code == 403 and "--token-file" in r.json()["detail"]


def test_cache_rows_sizes_the_serving_cache(settings, reference) -> None:
    """Settings.cache_rows (evdb serve --cache-rows): each table's DRAM cache holds that many
    rows (one request's rows stay until the next), and every answer stays Table.lookup's."""
    from dataclasses import replace

    from fastapi.testclient import TestClient

    keys = (np.arange(300) * 7 - 1000).tolist()
    with TestClient(create_app(replace(settings, cache_rows=16))) as c:
        assert c.get("/v1/tables/item").json()["tiers"]["dram"]["capacity"] == 16
        for start in range(0, 300, 50):
            r = c.post("/v1/tables/item/lookup", json={"keys": keys[start : start + 50]})
            want = reference.table("item").lookup(keys[start : start + 50])
            np.testing.assert_array_equal(np.array(r.json()["embeddings"], np.float32), want)
        assert c.get("/v1/tables/item").json()["tiers"]["dram"]["rows"] <= 50


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_compressed_request_bodies(client, reference, encoding) -> None:
    """Content-Encoding gzip/deflate (tritonclient's request compression) is inflated, but no
    further than the body limit; a bad stream is a 422, an unknown encoding a 415."""
    import gzip
    import zlib

    pack = gzip.compress if encoding == "gzip" else zlib.compress
    keys = [PRESENT[0], ABSENT[0]]
    raw = pack(json.dumps({"keys": keys}).encode())
    headers = {"content-type": "application/json", "content-encoding": encoding}
    r = client.post("/v1/tables/item/lookup", content=raw, headers=headers)
    assert r.status_code == 200, r.text
    want = reference.table("item").lookup(keys)
    np.testing.assert_array_equal(np.array(r.json()["embeddings"], np.float32), want)
    bomb = pack(b'{"keys": [' + b" " * 200_000_000 + b"1]}")  # 200 MB of spaces, ~200 KB
    r = client.post("/v1/tables/item/lookup", content=bomb, headers=headers)
    assert r.status_code == 413 and "inflates to more than" in r.json()["detail"]
    r = client.post("/v1/tables/item/lookup", content=raw[:-6], headers=headers)
    assert r.status_code == 422 and r.json()["detail"].startswith("body: ")
    r = client.post("/v1/tables/item/lookup", content=b"not compressed", headers=headers)
    assert r.status_code == 422 and f"not valid {encoding}" in r.json()["detail"]
    r = client.post(
        "/v1/tables/item/lookup", content=raw, headers={**headers, "content-encoding": "br"}
    )
    assert r.status_code == 415


def test_mmap_reads_reach_every_snapshot_the_server_opens(settings, reference, monkeypatch) -> None:
    """Settings.mmap_reads (evdb serve --mmap-reads, EVDB_MMAP_READS=1): the snapshots are
    opened with evdb.open(mmap_reads=True), and every answer stays Table.lookup's."""
    from dataclasses import replace

    from fastapi.testclient import TestClient

    from evdb.api import settings as settings_module

    monkeypatch.setenv("EVDB_MMAP_READS", "1")
    settings_module.get_settings.cache_clear()
    try:
        assert settings_module.get_settings().mmap_reads is True
    finally:
        settings_module.get_settings.cache_clear()
    opened = []
    real_open = evdb.open

    def spy(*args, **kwargs):
        opened.append(kwargs.get("mmap_reads"))
        return real_open(*args, **kwargs)

    monkeypatch.setattr(evdb, "open", spy)
    keys = (np.arange(100) * 7 - 300).tolist()
    with TestClient(create_app(replace(settings, mmap_reads=True))) as c:
        r = c.post("/v1/tables/item/lookup", json={"keys": keys})
        want = reference.table("item").lookup(keys)
        np.testing.assert_array_equal(np.array(r.json()["embeddings"], np.float32), want)
    assert opened and all(m is True for m in opened)
