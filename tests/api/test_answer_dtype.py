"""Answers in float16 when asked: REST lookups (the body's ``dtype``, or the ``dtype`` query
for a raw-bytes body) and KServe v2 over HTTP and gRPC (the ``datatype`` parameter, on the
request as tritonclient sends it, or on the embeddings output) answer the float32 answer
cast to float16, for every kind of snapshot served; the default stays float32; a bad dtype is
a 422 (INVALID_ARGUMENT) naming the field and the choices."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import evdb

pytest.importorskip("fastapi")
pytest.importorskip("tritonclient.grpc")

import grpc
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from fastapi.testclient import TestClient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from evdb.api import Settings, create_app

from .conftest import build_snapshot

OCTET = "application/octet-stream"
KEYS = [-1000, 5, -993, -1000, 2**63 - 1, 1093]  # keys 7i - 1000 have rows: 3 of 6 absent
KINDS = ("database", "float32", "float16", "int8")


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One database served as itself and as float32, float16 and int8 serving exports
    (rows of N(0, 3): some past what int8 holds exactly, none past float16's range)."""
    root = tmp_path_factory.mktemp("answer-dtype")
    out = {"float32": build_snapshot(root, "f32", 3.0), "database": root / "f32-db"}
    for dtype in ("float16", "int8"):
        evdb.export(root / "f32-db", root / dtype, tables=["item"], dtype=dtype)
        out[dtype] = root / dtype
    return out


@pytest.fixture(scope="module", params=KINDS)
def served(request: pytest.FixtureRequest, paths: dict[str, Path]) -> Iterator[dict[str, Any]]:
    """A REST app on a snapshot kind, with gRPC on a free port beside it."""
    settings = Settings(path=paths[request.param], max_keys=1000, grpc_port=0, dashboard=False)
    app = create_app(settings)
    with TestClient(app) as client:
        target = f"127.0.0.1:{app.state.grpc_port}"
        triton = grpcclient.InferenceServerClient(url=target)
        try:
            yield {"client": client, "grpc": triton, "target": target, "kind": request.param}
        finally:
            triton.close()


def _lookup(client: TestClient, **body: Any) -> Any:
    r = client.post("/v1/tables/item/lookup", json={"keys": KEYS, **body})
    assert r.status_code == 200, r.text
    return r


def _half(rows: Any) -> np.ndarray:
    return np.asarray(rows, np.float32).astype(np.float16)


def test_rest_answers_the_float32_answer_cast_to_float16(served) -> None:
    client = served["client"]
    f32 = _lookup(client)
    assert f32.headers["x-evdb-dtype"] == "float32"
    h = _lookup(client, dtype="float16")
    assert h.headers["x-evdb-dtype"] == "float16"
    got = np.array(h.json()["embeddings"], np.float64).astype(np.float16)
    np.testing.assert_array_equal(got, _half(f32.json()["embeddings"]))
    assert h.json()["found"] == f32.json()["found"] == [True, False, True, True, False, True]
    bags = {"offsets": [0, 2, 2], "weights": [1, 0.5, 2, -1, 3, 1], "combiner": "sum"}
    want = _half(_lookup(client, **bags).json()["embeddings"])
    got = np.array(_lookup(client, dtype="float16", **bags).json()["embeddings"], np.float64)
    np.testing.assert_array_equal(got.astype(np.float16), want)
    # the default is float32, and asking for float32 says so
    assert _lookup(client, dtype="float32").json() == f32.json()


def test_a_raw_bytes_body_asks_with_the_query(served) -> None:
    client = served["client"]
    want = _half(_lookup(client).json()["embeddings"])
    raw = np.array(KEYS, "<i8").tobytes()
    headers = {"content-type": OCTET, "accept": OCTET}
    r = client.post("/v1/tables/item/lookup?dtype=float16", content=raw, headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["x-evdb-dtype"] == "float16" and r.headers["x-evdb-shape"] == "6,4"
    np.testing.assert_array_equal(np.frombuffer(r.content, "<f2").reshape(6, 4), want)
    packed = np.frombuffer(base64.b64decode(r.headers["x-evdb-found"]), np.uint8)
    assert np.unpackbits(packed, count=6, bitorder="little").tolist() == [1, 0, 1, 1, 0, 1]
    # a JSON body may ask by the query too
    r = client.post("/v1/tables/item/lookup?dtype=float16", json={"keys": KEYS})
    assert np.array(r.json()["embeddings"], np.float64).astype(np.float16).tolist() == want.tolist()


def _infer_json(
    client: TestClient, parameters: dict[str, Any] | None, output: dict[str, Any] | None = None
) -> Any:
    """A v2 infer of KEYS as (2, 3): the request's parameters, and the embeddings output's."""
    req: dict[str, Any] = {
        "inputs": [{"name": "keys", "shape": [2, 3], "datatype": "INT64", "data": KEYS}],
        "outputs": [{"name": "embeddings", **({} if output is None else {"parameters": output})},
                    {"name": "found"}],
    }  # fmt: skip
    if parameters is not None:
        req["parameters"] = parameters
    return client.post("/v2/models/item/infer", json=req)


def test_kserve_http_and_grpc_answer_fp16_alike(served) -> None:
    client = served["client"]
    r = _infer_json(client, None)
    assert r.status_code == 200, r.text
    f32 = {o["name"]: o for o in r.json()["outputs"]}["embeddings"]
    assert f32["datatype"] == "FP32"
    want = _half(f32["data"]).reshape(2, 3, 4)
    for parameters, output in (
        ({"datatype": "FP16"}, None),
        (None, {"datatype": "FP16"}),
        ({"datatype": "FP32"}, {"datatype": "FP16"}),  # the output's wins
    ):
        r = _infer_json(client, parameters, output)
        assert r.status_code == 200, r.text
        out = {o["name"]: o for o in r.json()["outputs"]}["embeddings"]
        assert out["datatype"] == "FP16" and out["shape"] == [2, 3, 4]
        got = np.array(out["data"], np.float64).astype(np.float16).reshape(2, 3, 4)
        np.testing.assert_array_equal(got, want)
    # binary outputs: 2 bytes a value, read by tritonclient's own HTTP client code
    r = _infer_json(client, {"datatype": "FP16", "binary_data_output": True})
    assert r.status_code == 200, r.text
    decoded = httpclient.InferResult.from_response_body(
        r.content, header_length=int(r.headers["inference-header-content-length"])
    )
    np.testing.assert_array_equal(decoded.as_numpy("embeddings"), want)
    # gRPC, as a Triton user sends it: tritonclient's request parameters
    keys = np.array(KEYS, np.int64).reshape(2, 3)
    tensor = grpcclient.InferInput("keys", [2, 3], "INT64")
    tensor.set_data_from_numpy(keys)
    result = served["grpc"].infer("item", [tensor], parameters={"datatype": "FP16"})
    assert result.as_numpy("embeddings").dtype == np.float16
    np.testing.assert_array_equal(result.as_numpy("embeddings"), want)
    assert result.as_numpy("found").reshape(-1).tolist() == [1, 0, 1, 1, 0, 1]
    default = served["grpc"].infer("item", [tensor]).as_numpy("embeddings")
    assert default.dtype == np.float32
    np.testing.assert_array_equal(
        default.reshape(2, 3, 4), np.array(f32["data"], np.float32).reshape(2, 3, 4)
    )


def test_grpc_takes_the_output_parameter_too(served) -> None:
    want = _half(_lookup(served["client"]).json()["embeddings"])
    request = service_pb2.ModelInferRequest(model_name="item")
    tensor = request.inputs.add(name="keys", datatype="INT64", shape=[6])
    tensor.contents.int64_contents.extend(KEYS)
    out = request.outputs.add(name="embeddings")
    out.parameters["datatype"].string_param = "FP16"
    with grpc.insecure_channel(served["target"]) as channel:
        reply = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    assert [o.datatype for o in reply.outputs] == ["FP16"]
    got = np.frombuffer(reply.raw_output_contents[0], "<f2").reshape(6, 4)
    np.testing.assert_array_equal(got, want)


def test_a_bad_dtype_names_the_field_and_the_choices(served) -> None:
    client = served["client"]
    r = client.post("/v1/tables/item/lookup", json={"keys": KEYS, "dtype": "float64"})
    assert r.status_code == 422
    assert r.json()["detail"].startswith("dtype:") and "'float16'" in r.json()["detail"]
    r = client.post("/v1/tables/item/lookup?dtype=int8", json={"keys": KEYS})
    assert r.status_code == 422
    assert r.json()["detail"] == "dtype: expected one of float32, float16, got 'int8'"
    r = client.post("/v1/tables/item/lookup?dtype=float32", json={"keys": KEYS, "dtype": "float16"})
    assert r.status_code == 422 and "dtype" in r.json()["detail"]
    r = _infer_json(client, {"datatype": "FP64"})
    assert r.status_code == 422
    assert r.json()["error"] == "parameters.datatype: expected one of FP32, FP16, got 'FP64'"
    r = _infer_json(client, None, {"datatype": 16})
    assert r.status_code == 422
    assert (
        r.json()["error"] == "outputs[0].parameters.datatype: expected one of FP32, FP16, got int"
    )
    tensor = grpcclient.InferInput("keys", [6], "INT64")
    tensor.set_data_from_numpy(np.array(KEYS, np.int64))
    with pytest.raises(InferenceServerException) as e:
        served["grpc"].infer("item", [tensor], parameters={"datatype": "float16"})
    assert "parameters.datatype: expected one of FP32, FP16, got 'float16'" in str(e.value)
    assert "INVALID_ARGUMENT" in str(e.value.status())
