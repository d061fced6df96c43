"""``evdb serve`` as a real process on a loopback port: two workers, a real KServe client,
and a reload that reaches both workers."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

import evdb

from . import serve_process
from .conftest import TOKEN

KEYS = np.array([-1000, 5, 1093], dtype=np.int64)


@pytest.fixture
def server(snapshots, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    grpc_port = serve_process.free_port()  # every worker binds it (SO_REUSEPORT)
    proc, url, port = serve_process.start(
        str(snapshots[0]),
        "--workers",
        "2",
        "--token-file",
        str(token_file),
        "--grpc-port",
        str(grpc_port),
    )
    yield url, port, grpc_port
    code, out = serve_process.stop(proc)
    if code is None:
        pytest.fail(f"evdb serve did not stop on SIGINT: {out[-2000:]}")
    assert code == 0, out[-2000:]


def _expected(path) -> np.ndarray:
    with evdb.open(path, read_only=True) as db:
        return db.table("item").lookup(KEYS)


def test_serve_answers_then_reloads_every_worker(server, snapshots) -> None:
    url, port, grpc_port = server
    want = [_expected(p) for p in snapshots]
    r = httpx.post(f"{url}/v1/tables/item/lookup", json={"keys": KEYS.tolist()})
    np.testing.assert_array_equal(np.array(r.json()["embeddings"], np.float32), want[0])

    tritonclient = pytest.importorskip("tritonclient.http")
    client = tritonclient.InferenceServerClient(url=f"127.0.0.1:{port}")
    assert client.is_server_live() and client.is_model_ready("item")
    assert client.get_model_metadata("item")["outputs"][0]["shape"] == [-1, 4]
    keys = tritonclient.InferInput("keys", [len(KEYS)], "INT64")
    keys.set_data_from_numpy(KEYS)  # binary tensor data
    outputs = [tritonclient.InferRequestedOutput(n) for n in ("embeddings", "found")]
    result = client.infer("item", [keys], outputs=outputs)
    np.testing.assert_array_equal(result.as_numpy("embeddings"), want[0])
    assert result.as_numpy("found").tolist() == [True, False, True]
    zipped = client.infer("item", [keys], outputs=outputs, request_compression_algorithm="gzip")
    np.testing.assert_array_equal(zipped.as_numpy("embeddings"), want[0])
    client.close()
    grpcclient = pytest.importorskip("tritonclient.grpc")
    for _ in range(4):  # a new channel each time: either worker may answer
        g = grpcclient.InferenceServerClient(url=f"127.0.0.1:{grpc_port}")
        keys = grpcclient.InferInput("keys", [len(KEYS)], "INT64")
        keys.set_data_from_numpy(KEYS)
        result = g.infer("item", [keys])
        np.testing.assert_array_equal(result.as_numpy("embeddings"), want[0])
        assert result.as_numpy("found").tolist() == [True, False, True]
        g.close()

    auth = {"authorization": f"Bearer {TOKEN}"}
    r = httpx.post(f"{url}/v1/admin/reload", json={"path": str(snapshots[1])}, headers=auth)
    assert r.status_code == 200, r.text
    for _ in range(12):  # a new connection each time: either worker may answer
        r = httpx.post(
            f"{url}/v1/tables/item/lookup",
            json={"keys": KEYS.tolist()},
            headers={"connection": "close"},
        )
        np.testing.assert_array_equal(np.array(r.json()["embeddings"], np.float32), want[1])

    # /metrics sums the two workers, whichever answers: 13 v1 lookups of 3 keys in all
    text = httpx.get(f"{url}/metrics", headers={"connection": "close"}).text
    route = 'evdb_requests_total{endpoint="/v1/tables/{name}/lookup",status="200",table="item"}'
    counted = [line for line in text.splitlines() if line.startswith(route)]
    assert counted and float(counted[0].split()[-1]) == 13.0, counted
    # and 2 x 3 by the v2 HTTP infers, 4 x 3 by the gRPC ones
    assert 'evdb_rows_served_total{table="item"} 57.0' in text
