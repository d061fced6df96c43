"""The Open Inference Protocol (KServe v2), a table being a model, so that existing clients
(tritonclient's HTTP client, KServe) call evdb unchanged.

A model takes one input, ``keys`` (INT64, or BYTES for a str table, of any shape S), and
gives ``embeddings`` (FP32, S + [dim]) and ``found`` (BOOL, S). ``embeddings`` come as FP16
when the request asks, with the parameter ``"datatype": "FP16"`` on the request (what
tritonclient's ``infer(..., parameters=...)`` sends) or on the requested output. The
binary tensor data extension is supported both ways: an input may arrive as raw bytes
after the JSON header (``Inference-Header-Content-Length``), and outputs asked for with
``binary_data`` (or the request's ``binary_data_output``) leave the same way. A
model's version is the snapshot's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from fastapi import APIRouter, Request, Response

import evdb

from .. import models
from ..codec import (
    INFER_HEADER,
    JSON,
    OCTET,
    ApiError,
    body_type,
    decode_keys,
    dumps,
    encode_outputs,
    parse_json,
    read_body,
    short,
    split_infer_body,
    validate,
    wanted_outputs,
)
from ..deps import holder_of, settings_of, table_of, use_snapshot
from ..lookup import V2_ANSWER_DATATYPES, cast_answer, check_count, lookup_rows, v2_datatype
from ..openapi import body_doc, error_responses
from ..schemas import (
    InferError,
    InferRequest,
    InferResponse,
    Live,
    ModelConfig,
    ModelMetadata,
    ModelReady,
    Ready,
    RepositoryIndexRequest,
    RepositoryModel,
    ServerMetadata,
)
from ..snapshots import VERSION_HEADER, Snapshot

router = APIRouter(prefix="/v2", tags=["kserve v2"])
ERRORS = error_responses(InferError, 404, 413, 415, 422, 503)
EXTENSIONS = ["binary_tensor_data"]


def _json(obj: Any, status: int = 200) -> Response:
    return Response(dumps(obj), status_code=status, media_type=JSON)


def _check_version(snap: Snapshot, version: str | None) -> None:
    if version is not None and version != snap.version:
        raise ApiError(
            404, f"version: {short(version)} is not served; the snapshot is {snap.version}"
        )


@router.get("", response_model=ServerMetadata)
async def server_metadata() -> Response:
    return _json({"name": "evdb", "version": evdb.__version__, "extensions": EXTENSIONS})


@router.get("/health/live", response_model=Live)
async def live() -> Response:
    return _json({"live": True})


@router.get("/health/ready", response_model=Ready, responses={503: {"model": Ready}})
async def ready(request: Request) -> Response:
    loaded = holder_of(request).current is not None
    return _json({"ready": loaded}, 200 if loaded else 503)


@router.get("/models/{model}", response_model=ModelMetadata, responses=ERRORS)
@router.get("/models/{model}/versions/{version}", response_model=ModelMetadata, responses=ERRORS)
async def model_metadata(model: str, request: Request, version: str | None = None) -> Response:
    with use_snapshot(request) as snap:
        table = table_of(snap, model)
        _check_version(snap, version)
        return _json(models.metadata(snap, model, table))


@router.get("/models/{model}/config", response_model=ModelConfig, responses=ERRORS)
@router.get(
    "/models/{model}/versions/{version}/config", response_model=ModelConfig, responses=ERRORS
)
async def model_config(model: str, request: Request, version: str | None = None) -> Response:
    """The model's configuration as Triton gives it (``model_config.proto`` as JSON)."""
    with use_snapshot(request) as snap:
        table = table_of(snap, model)
        _check_version(snap, version)
        return _json(models.config(model, table))


@router.post("/repository/index", response_model=list[RepositoryModel], responses=ERRORS)
@router.get("/repository/index", response_model=list[RepositoryModel], responses=ERRORS)
async def repository_index(request: Request) -> Response:
    """Triton's repository index: every table as a model, ``{name, version, state, reason}``.
    A POST may carry ``{"ready": true}`` (Triton's filter; every model served is ready)."""
    if request.method == "POST":
        body = await read_body(request, 1 << 16)
        if body.strip():
            body_type(request, JSON)
            validate(RepositoryIndexRequest, parse_json(body))
    holder = holder_of(request)
    snap = holder.acquire()
    try:
        return _json(models.repository_index(snap))
    finally:
        if snap is not None:
            holder.release(snap)


@router.get("/models/{model}/ready", response_model=ModelReady, responses=ERRORS)
@router.get("/models/{model}/versions/{version}/ready", response_model=ModelReady, responses=ERRORS)
async def model_ready(model: str, request: Request, version: str | None = None) -> Response:
    with use_snapshot(request) as snap:
        table_of(snap, model)
        _check_version(snap, version)
    return _json({"name": model, "ready": True})


def _datatype_parameters(req: InferRequest) -> list[tuple[str, Any]]:
    """The request's ``datatype`` parameters for the embeddings output, the output's own
    first (see ``lookup.v2_datatype``)."""
    asked = [
        (f"outputs[{i}].parameters.datatype", (o.parameters or {}).get("datatype"))
        for i, o in enumerate(req.outputs or [])
        if o.name == "embeddings"
    ]
    return [*asked, ("parameters.datatype", (req.parameters or {}).get("datatype"))]


def _infer_doc(*path: str) -> dict[str, Any]:
    return {
        "response_model": InferResponse,
        "responses": {
            **ERRORS,
            200: {
                "content": {OCTET: {}},
                "description": f"JSON, or (binary outputs) the JSON header of {INFER_HEADER} "
                "bytes followed by the outputs' raw data.",
            },
        },
        "openapi_extra": body_doc(
            InferRequest,
            octet=f"A JSON header of {INFER_HEADER} bytes, then the inputs' raw data.",
            path=path,
        ),
    }


@router.post("/models/{model}/infer", **_infer_doc("model"))
@router.post("/models/{model}/versions/{version}/infer", **_infer_doc("model", "version"))
async def infer(request: Request) -> Response:
    """Embeddings and found for the ``keys`` input, exactly ``Table.lookup``'s rows."""
    model: str = request.path_params["model"]
    version: str | None = request.path_params.get("version")
    settings = settings_of(request)
    body_type(request, JSON, OCTET)  # OCTET: the binary extension (aiohttp's default type)
    body = await read_body(request, settings.max_body_bytes)
    data, binary = split_infer_body(body, request.headers.get(INFER_HEADER))
    req = validate(InferRequest, data)
    with use_snapshot(request) as snap:
        table = table_of(snap, model)
        _check_version(snap, version)
        keys, shape = decode_keys(req.inputs, binary, table.config.key_type)
        check_count(len(keys), settings.max_keys)
        binary_out = wanted_outputs(req)
        datatype = v2_datatype(_datatype_parameters(req))
        embeddings, found = lookup_rows(table, keys)
        request.app.state.metrics.served(model, len(keys), len(keys) - int(np.count_nonzero(found)))
        tensors = {
            "embeddings": (
                cast_answer(embeddings, V2_ANSWER_DATATYPES[datatype]),
                [*shape, table.dim],
                datatype,
            ),
            "found": (found, shape, "BOOL"),
        }
        head: dict[str, Any] = {"model_name": model, "model_version": snap.version}
    if req.id is not None:
        head["id"] = req.id
    head["outputs"], blob = encode_outputs(tensors, binary_out)
    header = dumps(head)
    served = {VERSION_HEADER: str(head["model_version"])}
    if not any(binary_out.values()):
        return Response(header, media_type=JSON, headers=served)
    headers = {INFER_HEADER: str(len(header)), **served}
    return Response(header + blob, media_type=OCTET, headers=headers)
