"""The KServe v2 gRPC protocol (``inference.GRPCInferenceService``) beside HTTP, so that
``tritonclient.grpc`` calls evdb unchanged: ServerLive, ServerReady, ModelReady,
ServerMetadata, ModelMetadata, ModelConfig, RepositoryIndex and ModelInfer.

It runs in each worker's event loop (``grpc.aio``), started and stopped by the app's lifespan
when ``Settings.grpc_port`` is set (``EVDB_GRPC_PORT``), and reads the same
:class:`~evdb.api.snapshots.SnapshotHolder` as the HTTP routes: one snapshot per answer, the
same rows, the same model descriptions (:mod:`evdb.api.models`), the same limits and the same
metrics. With several workers each binds the port (gRPC sets ``SO_REUSEPORT``) and the kernel
spreads connections over them. The messages are tritonclient's generated ones
(``tritonclient.grpc.service_pb2``), not a copy of the protos. The methods evdb has no use for
(shared memory, load/unload, statistics, tracing, streaming) answer UNIMPLEMENTED.

Inputs arrive as ``raw_input_contents`` (tritonclient's way) or typed ``contents``; outputs
leave as ``raw_output_contents`` (FP32 and BOOL little-endian, as tritonclient reads them;
FP16 embeddings when the request's or the output's ``datatype`` parameter says so).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

import evdb

from . import models
from .codec import ApiError, decode_keys, short
from .deps import table_of
from .lookup import V2_ANSWER_DATATYPES, cast_answer, check_count, lookup_rows, v2_datatype
from .routers.kserve import EXTENSIONS
from .snapshots import Snapshot

if TYPE_CHECKING:
    from fastapi import FastAPI

    from .settings import Settings

SERVICE = "/inference.GRPCInferenceService/"
# An ApiError's HTTP status as a gRPC code (the rest: INVALID_ARGUMENT).
CODES = {404: grpc.StatusCode.NOT_FOUND, 503: grpc.StatusCode.UNAVAILABLE,
         413: grpc.StatusCode.RESOURCE_EXHAUSTED}  # fmt: skip


class InferenceService(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """The v2 gRPC methods over the app's snapshot holder, settings and metrics."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.holder = app.state.holder
        self.settings: Settings = app.state.settings
        self.metrics = app.state.metrics

    @contextmanager
    def snapshot(self) -> Iterator[Snapshot]:
        snap = self.holder.acquire()
        if snap is None:
            raise ApiError(503, "no snapshot is loaded yet")
        try:
            yield snap
        finally:
            self.holder.release(snap)

    async def _answer(self, method: str, model: str, context: Any, work: Any) -> Any:
        """``work()``'s message; an ApiError or EvdbError aborts with its gRPC code and text.
        Counted in ``evdb_requests_total`` under the method's path, with the HTTP status the
        same refusal gets over HTTP."""
        start = time.perf_counter()
        status, code, detail = 500, grpc.StatusCode.INTERNAL, ""  # an unexpected error: 500
        try:
            message = work()
            status = 200
            return message
        except ApiError as e:
            status, detail = e.status, e.detail
            code = CODES.get(e.status, grpc.StatusCode.INVALID_ARGUMENT)
        except evdb.TableNotFoundError as e:
            status, code, detail = 404, grpc.StatusCode.NOT_FOUND, str(e)
        except evdb.EvdbError as e:
            status, code, detail = 422, grpc.StatusCode.INVALID_ARGUMENT, str(e)
        finally:
            snap = self.holder.current
            table = model if snap is not None and model in snap.tables else ""
            self.metrics.answered(SERVICE + method, table, status, time.perf_counter() - start)
        await context.abort(code, detail)

    # -- server and model health, metadata, configuration -------------------------------

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerReadyResponse(ready=self.holder.current is not None)

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerMetadataResponse(
            name="evdb", version=evdb.__version__, extensions=EXTENSIONS
        )

    def _model(self, snap: Snapshot, name: str, version: str) -> Any:
        table = table_of(snap, name)
        if version and version != snap.version:
            raise ApiError(
                404, f"version: {short(version)} is not served; the snapshot is {snap.version}"
            )
        return table

    async def ModelReady(self, request: Any, context: Any) -> Any:
        def work() -> Any:
            snap = self.holder.current
            ready = False
            if snap is not None and request.name in snap.tables:
                ready = not request.version or request.version == snap.version
            return service_pb2.ModelReadyResponse(ready=ready)

        return await self._answer("ModelReady", request.name, context, work)

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        def work() -> Any:
            with self.snapshot() as snap:
                table = self._model(snap, request.name, request.version)
                return json_format.ParseDict(
                    models.metadata(snap, request.name, table),
                    service_pb2.ModelMetadataResponse(),
                )

        return await self._answer("ModelMetadata", request.name, context, work)

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        def work() -> Any:
            with self.snapshot() as snap:
                table = self._model(snap, request.name, request.version)
                config = json_format.ParseDict(
                    models.config(request.name, table), model_config_pb2.ModelConfig()
                )
                return service_pb2.ModelConfigResponse(config=config)

        return await self._answer("ModelConfig", request.name, context, work)

    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        snap = self.holder.acquire()
        try:
            index = models.repository_index(snap)
        finally:
            if snap is not None:
                self.holder.release(snap)
        return service_pb2.RepositoryIndexResponse(
            models=[service_pb2.RepositoryIndexResponse.ModelIndex(**m) for m in index]
        )

    # -- inference ------------------------------------------------------------------------

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        return await self._answer(
            "ModelInfer", request.model_name, context, lambda: self._infer(request)
        )

    def _infer(self, request: Any) -> Any:
        name = request.model_name
        with self.snapshot() as snap:
            table = self._model(snap, name, request.model_version)
            inputs, binary = _inputs(request)  # decode_keys refuses all but one, "keys"
            keys, shape = decode_keys(inputs, binary, table.config.key_type)
            check_count(len(keys), self.settings.max_keys)
            wanted = [o.name for o in request.outputs] or ["embeddings", "found"]
            unknown = [n for n in wanted if n not in ("embeddings", "found")]
            if unknown:
                raise ApiError(
                    422, f"outputs: {short(unknown[0])} is not an output (embeddings, found)"
                )
            datatype = v2_datatype(_datatype_parameters(request))
            embeddings, found = lookup_rows(table, keys)
            missing = len(keys) - int(np.count_nonzero(found))
            self.metrics.served(name, len(keys), missing)
            tensors = {
                "embeddings": (
                    datatype,
                    [*shape, table.dim],
                    cast_answer(embeddings, V2_ANSWER_DATATYPES[datatype]),
                ),
                "found": ("BOOL", shape, found),
            }
            response = service_pb2.ModelInferResponse(
                model_name=name, model_version=snap.version, id=request.id
            )
        for out in wanted:
            datatype, out_shape, array = tensors[out]
            response.outputs.add(name=out, datatype=datatype, shape=out_shape)
            response.raw_output_contents.append(np.ascontiguousarray(array).tobytes())
        return response


def _parameter(parameters: Any, name: str) -> Any:
    """The value of an ``InferParameter`` map's entry (None if absent)."""
    if name not in parameters:
        return None
    p = parameters[name]
    choice = p.WhichOneof("parameter_choice")
    return None if choice is None else getattr(p, choice)


def _datatype_parameters(request: Any) -> list[tuple[str, Any]]:
    """As ``routers.kserve``'s: the embeddings output's ``datatype``, then the request's."""
    asked = [
        (f"outputs[{i}].parameters.datatype", _parameter(o.parameters, "datatype"))
        for i, o in enumerate(request.outputs)
        if o.name == "embeddings"
    ]
    return [*asked, ("parameters.datatype", _parameter(request.parameters, "datatype"))]


def _inputs(request: Any) -> tuple[list[Any], bytes]:
    """The request's inputs as ``codec.decode_keys`` takes them (the HTTP schema's fields),
    and the raw bytes of the first input, if it came raw."""
    tensors = []
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise ApiError(
            422, f"raw_input_contents: {len(raw)} given for {len(request.inputs)} inputs"
        )
    for i, t in enumerate(request.inputs):
        data: list[Any] | None = None
        parameters = None
        if raw:
            parameters = {"binary_data_size": len(raw[i])}
        elif t.datatype == "BYTES":
            try:
                data = [b.decode() for b in t.contents.bytes_contents]
            except UnicodeDecodeError:
                raise ApiError(422, f"inputs[{i}].contents: not UTF-8") from None
        else:
            data = list(t.contents.int64_contents)
        tensors.append(
            SimpleNamespace(
                name=t.name,
                datatype=t.datatype,
                shape=list(t.shape),
                data=data,
                parameters=parameters,
            )
        )
    return tensors, raw[0] if len(raw) == 1 else b""


async def start(app: FastAPI, settings: Settings) -> tuple[grpc.aio.Server, int]:
    """Serve the v2 gRPC protocol on ``settings.grpc_host:grpc_port`` in this event loop;
    returns the server and the port bound (port 0: a free one)."""
    limit = settings.max_body_bytes
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", -1),  # max_keys rows of any dim
        ]
    )
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceService(app), server)
    port = server.add_insecure_port(f"{settings.grpc_host}:{settings.grpc_port}")
    if port == 0:
        raise OSError(f"grpc_port: cannot bind {settings.grpc_host}:{settings.grpc_port}")
    await server.start()
    return server, port
