"""KServe v2 and Triton's conventions: the repository index and model config as Triton gives
them, and the v2 gRPC protocol beside HTTP, from one server (uvicorn in a thread on loopback
ports), with tritonclient's own HTTP and gRPC clients giving the same rows."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import evdb

pytest.importorskip("fastapi")
pytest.importorskip("tritonclient.grpc")
pytest.importorskip("tritonclient.http")

import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import uvicorn
from tritonclient.utils import InferenceServerException

from evdb.api import Settings, create_app

from .conftest import WORDS
from .serve_process import free_port
from .test_routes import ABSENT, PRESENT

KEYS = np.array([PRESENT[0], ABSENT[0], PRESENT[1], PRESENT[0], ABSENT[1], PRESENT[2]])


@pytest.fixture(scope="module")
def server(snapshots: tuple[Path, Path]) -> Iterator[dict[str, Any]]:
    """One app serving HTTP (uvicorn) and gRPC (grpc_port=0: a free port) from one snapshot."""
    app = create_app(Settings(path=snapshots[0], max_keys=1000, grpc_port=0, dashboard=False))
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not srv.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    http = httpclient.InferenceServerClient(url=f"127.0.0.1:{port}")
    grpc = grpcclient.InferenceServerClient(url=f"127.0.0.1:{app.state.grpc_port}")
    try:
        yield {"app": app, "http": http, "grpc": grpc}
    finally:
        http.close()
        grpc.close()
        srv.should_exit = True
        thread.join(timeout=30)
        assert not thread.is_alive(), "the server did not stop"


def version(server: dict[str, Any]) -> str:
    snap = server["app"].state.holder.current
    assert snap is not None
    return str(snap.version)


def test_the_repository_index_is_tritons_list(server) -> None:
    want = [
        {"name": name, "version": version(server), "state": "READY", "reason": ""}
        for name in ("item", "tok")
    ]
    assert server["http"].get_model_repository_index() == want
    index = server["grpc"].get_model_repository_index()
    got = [{f: getattr(m, f) for f in ("name", "version", "state", "reason")} for m in index.models]
    assert got == want


def test_the_model_config_is_tritons(server) -> None:
    want = {
        "name": "item",
        "platform": "evdb",
        "backend": "evdb",
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": 0,
        "input": [{"name": "keys", "data_type": "TYPE_INT64", "dims": [-1]}],
        "output": [
            {"name": "embeddings", "data_type": "TYPE_FP32", "dims": [-1, 4]},
            {"name": "found", "data_type": "TYPE_BOOL", "dims": [-1]},
        ],
    }
    assert server["http"].get_model_config("item") == want
    assert server["http"].get_model_config("item", version(server)) == want
    config = server["grpc"].get_model_config("item").config
    assert (config.name, config.platform, config.backend) == ("item", "evdb", "evdb")
    assert config.max_batch_size == 0 and config.version_policy.latest.num_versions == 1
    from tritonclient.grpc import model_config_pb2 as pb

    def tensors(fields: Any) -> list[tuple[str, str, list[int]]]:
        return [(t.name, pb.DataType.Name(t.data_type), list(t.dims)) for t in fields]

    assert tensors(config.input) == [("keys", "TYPE_INT64", [-1])]
    assert tensors(config.output) == [
        ("embeddings", "TYPE_FP32", [-1, 4]),
        ("found", "TYPE_BOOL", [-1]),
    ]
    tok = server["http"].get_model_config("tok")
    assert tok["input"][0]["data_type"] == "TYPE_STRING"
    assert tok["output"][0]["dims"] == [-1, 3]


def _infer(module: Any, client: Any, model: str, keys: np.ndarray, datatype: str) -> Any:
    tensor = module.InferInput("keys", list(keys.shape), datatype)
    tensor.set_data_from_numpy(keys)
    outputs = [module.InferRequestedOutput(n) for n in ("embeddings", "found")]
    return client.infer(model, [tensor], outputs=outputs)


@pytest.mark.parametrize("shape", [(6,), (2, 3)])
def test_http_and_grpc_give_the_same_rows(server, reference, shape) -> None:
    keys = KEYS.reshape(shape)
    table = reference.table("item")
    results = [
        _infer(module, server[kind], "item", keys, "INT64")
        for module, kind in ((httpclient, "http"), (grpcclient, "grpc"))
    ]
    want = table.lookup(KEYS).reshape(*shape, 4)
    for r in results:
        np.testing.assert_array_equal(r.as_numpy("embeddings"), want)
        assert r.as_numpy("found").tolist() == table.contains(KEYS).reshape(shape).tolist()
    assert results[0].get_response()["model_version"] == version(server)
    assert results[1].get_response().model_version == version(server)


def test_str_keys_over_grpc_and_http(server, reference) -> None:
    words = np.array([w.encode() for w in [WORDS[3], "absent", WORDS[0]]], dtype=np.object_)
    table = reference.table("tok")
    want = table.lookup([w.decode() for w in words])
    for module, kind in ((httpclient, "http"), (grpcclient, "grpc")):
        r = _infer(module, server[kind], "tok", words, "BYTES")
        np.testing.assert_array_equal(r.as_numpy("embeddings"), want)
        assert r.as_numpy("found").tolist() == [True, False, True]


def test_grpc_health_and_metadata(server) -> None:
    g = server["grpc"]
    assert g.is_server_live() and g.is_server_ready()
    assert g.is_model_ready("item") and not g.is_model_ready("nope")
    assert not g.is_model_ready("item", "not-the-version")
    meta = g.get_server_metadata()
    assert meta.name == "evdb" and meta.version == evdb.__version__
    model = g.get_model_metadata("item")
    http = server["http"].get_model_metadata("item")
    assert (model.name, model.platform, list(model.versions)) == ("item", "evdb", [version(server)])
    assert http["versions"] == [version(server)]
    for got, want in ((model.inputs, http["inputs"]), (model.outputs, http["outputs"])):
        assert [
            {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in got
        ] == want


@pytest.mark.parametrize(
    ("model", "keys", "datatype", "words"),
    [
        ("nope", np.array([1]), "INT64", "no table named 'nope'"),
        ("item", np.array([b"a"], dtype=np.object_), "BYTES", "this table's keys are INT64"),
        ("item", np.arange(1001), "INT64", "more than the limit of 1000"),
    ],
)
def test_grpc_refusals_say_what_is_wrong(server, model, keys, datatype, words) -> None:
    with pytest.raises(InferenceServerException) as e:
        _infer(grpcclient, server["grpc"], model, keys, datatype)
    assert words in str(e.value)


def test_grpc_counts_in_metrics(server) -> None:
    _infer(grpcclient, server["grpc"], "item", KEYS, "INT64")
    text = server["app"].state.metrics.exposition().decode()
    route = "/inference.GRPCInferenceService/ModelInfer"
    assert f'evdb_requests_total{{endpoint="{route}",status="200",table="item"}}' in text


# -- the HTTP routes' refusals (TestClient) ----------------------------------------------------


def test_http_config_and_index_refusals(client) -> None:
    assert client.get("/v2/models/nope/config").status_code == 404
    assert client.get("/v2/models/item/versions/zzz/config").status_code == 404
    r = client.post("/v2/repository/index", json={"ready": True})
    assert r.status_code == 200 and [m["name"] for m in r.json()] == ["item", "tok"]
    assert client.get("/v2/repository/index").json() == r.json()
    r = client.post("/v2/repository/index", json={"ready": "yes"})
    assert r.status_code == 422 and "ready" in r.json()["error"]


def test_grpc_takes_typed_contents_as_well_as_raw(server, reference) -> None:
    """Inputs as ``contents`` (int64_contents, bytes_contents), as clients other than
    tritonclient send them, give the rows raw inputs give."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    port = server["app"].state.grpc_port
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        req = service_pb2.ModelInferRequest(model_name="item", id="r1")
        keys = req.inputs.add(name="keys", datatype="INT64", shape=[len(KEYS)])
        keys.contents.int64_contents.extend(KEYS.tolist())
        out = stub.ModelInfer(req, timeout=30)
        assert out.id == "r1" and [o.name for o in out.outputs] == ["embeddings", "found"]
        rows = np.frombuffer(out.raw_output_contents[0], "<f4").reshape(len(KEYS), 4)
        np.testing.assert_array_equal(rows, reference.table("item").lookup(KEYS))
        found = np.frombuffer(out.raw_output_contents[1], np.bool_)
        assert found.tolist() == reference.table("item").contains(KEYS).tolist()

        req = service_pb2.ModelInferRequest(model_name="tok")
        words = req.inputs.add(name="keys", datatype="BYTES", shape=[2])
        words.contents.bytes_contents.extend([WORDS[3].encode(), b"absent"])
        req.outputs.add(name="found")  # only what is asked for
        out = stub.ModelInfer(req, timeout=30)
        assert [o.name for o in out.outputs] == ["found"]
        assert np.frombuffer(out.raw_output_contents[0], np.bool_).tolist() == [True, False]

        req.outputs.add(name="nope")
        with pytest.raises(grpc.RpcError) as e:
            stub.ModelInfer(req, timeout=30)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "nope" in e.value.details()
