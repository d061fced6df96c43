"""A table as a KServe v2 / Triton model: its metadata, its model configuration and its entry
in the repository index, described once for the HTTP routes (``routers.kserve``) and the gRPC
service (``grpc_service``), so both protocols describe a model the same way.

A model takes one input, ``keys`` (INT64, or BYTES for a str table, of any shape S), and gives
``embeddings`` (FP32, S + [dim]) and ``found`` (BOOL, S). Its one version is the snapshot's
(following a publish root, the publication's seq). The configuration is Triton's
``ModelConfig`` (``model_config.proto``) as Triton's ``/v2/models/{name}/config`` gives it:
``max_batch_size`` 0 (the dims are the whole shape, any leading size), ``TYPE_*`` data types.
"""

from __future__ import annotations

from typing import Any

from evdb.view import ReadableTable

from .snapshots import Snapshot

PLATFORM = "evdb"
# KServe v2 datatype -> Triton's model-config data type (BYTES is TYPE_STRING in a config)
CONFIG_TYPES = {"INT64": "TYPE_INT64", "BYTES": "TYPE_STRING", "FP32": "TYPE_FP32",
                "BOOL": "TYPE_BOOL"}  # fmt: skip


def key_datatype(table: ReadableTable) -> str:
    return "INT64" if table.config.key_type == "int64" else "BYTES"


def tensors(table: ReadableTable) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(inputs, outputs): each ``{"name", "datatype", "shape"}`` (-1: any size)."""
    inputs = [{"name": "keys", "datatype": key_datatype(table), "shape": [-1]}]
    outputs = [
        {"name": "embeddings", "datatype": "FP32", "shape": [-1, table.dim]},
        {"name": "found", "datatype": "BOOL", "shape": [-1]},
    ]
    return inputs, outputs


def metadata(snap: Snapshot, name: str, table: ReadableTable) -> dict[str, Any]:
    """The v2 model metadata (``GET /v2/models/{name}``, ``ModelMetadata``)."""
    inputs, outputs = tensors(table)
    return {
        "name": name,
        "versions": [snap.version],
        "platform": PLATFORM,
        "inputs": inputs,
        "outputs": outputs,
    }


def config(name: str, table: ReadableTable) -> dict[str, Any]:
    """Triton's model configuration (``GET /v2/models/{name}/config``, ``ModelConfig``)."""
    inputs, outputs = tensors(table)

    def field(t: dict[str, Any]) -> dict[str, Any]:
        return {"name": t["name"], "data_type": CONFIG_TYPES[t["datatype"]], "dims": t["shape"]}

    return {
        "name": name,
        "platform": PLATFORM,
        "backend": PLATFORM,
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": 0,
        "input": [field(t) for t in inputs],
        "output": [field(t) for t in outputs],
    }


def repository_index(snap: Snapshot | None) -> list[dict[str, str]]:
    """Triton's repository index: ``{name, version, state, reason}`` per model, sorted by
    name; every table of the snapshot served is ``READY`` (none before one is loaded)."""
    if snap is None:
        return []
    return [
        {"name": name, "version": snap.version, "state": "READY", "reason": ""}
        for name in sorted(snap.tables)
    ]
