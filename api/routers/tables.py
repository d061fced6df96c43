"""``/v1/tables``: list tables, a table's stats, and lookups (JSON or raw bytes)."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
from fastapi import APIRouter, Request, Response

from ..codec import (
    FOUND_HEADER,
    JSON,
    OCTET,
    SHAPE_HEADER,
    ApiError,
    body_type,
    dumps,
    int64_keys,
    parse_json,
    read_body,
    validate,
    wants_octet,
)
from ..deps import settings_of, table_of, use_snapshot
from ..lookup import answer_dtype, cast_answer, check_count, lookup_rows
from ..openapi import body_doc, error_responses
from ..schemas import (
    Error,
    IntLookupRequest,
    LookupRequest,
    LookupResponse,
    StrLookupRequest,
    TablesResponse,
    TableStats,
)
from ..snapshots import VERSION_HEADER

router = APIRouter(prefix="/v1/tables", tags=["tables"])
ERRORS = error_responses(Error, 404, 413, 415, 422, 503)

OCTET_KEYS = "Little-endian int64 keys, 8 bytes each (int64 tables; no bags)."
DTYPE_HEADER = "X-Evdb-Dtype"
DTYPE_QUERY = {
    "name": "dtype",
    "in": "query",
    "required": False,
    "description": "The answer's rows: float32 (default) or float16 (as the body's dtype; "
    "the one way to ask with a raw-bytes body).",
    "schema": {"type": "string", "enum": ["float32", "float16"]},
}


def _lookup_doc() -> dict[str, Any]:
    doc = body_doc(LookupRequest, octet=OCTET_KEYS, path=("name",))
    doc["parameters"].append(DTYPE_QUERY)
    return doc


@router.get("", response_model=TablesResponse, responses={503: {"model": Error}})
async def list_tables(request: Request) -> Response:
    """Every table of the snapshot: name, dim, live rows, key type, snapshot version."""
    with use_snapshot(request) as snap:
        tables = [
            {
                "name": name,
                "dim": t.dim,
                "rows": len(t),
                "key_type": t.config.key_type,
                "snapshot": snap.version,
            }
            for name, t in snap.tables.items()
        ]
        return Response(dumps({"tables": tables, "snapshot": snap.info()}), media_type=JSON)


@router.get("/{name}", response_model=TableStats, responses=ERRORS)
async def table_stats(name: str, request: Request) -> Response:
    """``Table.stats()``: rows, tiers (DRAM cache hits and misses), admission, counters."""
    with use_snapshot(request) as snap:
        stats = table_of(snap, name).stats()
        stats["snapshot"] = snap.version
        return Response(dumps(stats), media_type=JSON)


@router.post(
    "/{name}/lookup",
    response_model=LookupResponse,
    responses={
        **ERRORS,
        200: {
            "content": {OCTET: {}},
            "description": f"JSON, or with `Accept: {OCTET}` the raw little-endian float32 "
            f"(or float16, asked with dtype) matrix; its shape is in `{SHAPE_HEADER}` "
            f"(rows,dim), its dtype in `{DTYPE_HEADER}`, and `{FOUND_HEADER}` holds found as "
            "base64 of numpy.packbits(found, bitorder='little').",
        },
    },
    openapi_extra=_lookup_doc(),
)
async def lookup(request: Request) -> Response:
    """Rows of keys, or combined bags: exactly ``Table.lookup`` on the snapshot, plus found
    per key. Never creates a row or counts toward admission."""
    name: str = request.path_params["name"]
    settings = settings_of(request)
    kind = body_type(request, JSON, OCTET)
    dtype = answer_dtype("dtype", request.query_params.get("dtype"))
    body = await read_body(request, settings.max_body_bytes)
    with use_snapshot(request) as snap:
        table = table_of(snap, name)
        str_keys = table.config.key_type == "str"
        offsets = weights = combiner = None
        if kind == OCTET:
            if str_keys:
                raise ApiError(415, f"body: table {name!r} has str keys; send them as JSON")
            keys: Any = int64_keys(body)
        else:
            data = parse_json(body)
            if isinstance(data, dict) and isinstance(data.get("keys"), list):
                check_count(len(data["keys"]), settings.max_keys)
            req = validate(StrLookupRequest if str_keys else IntLookupRequest, data)
            keys = req.keys if str_keys else np.array(req.keys, dtype=np.int64)
            offsets, weights, combiner = req.offsets, req.weights, req.combiner
            if dtype is not None and req.dtype is not None and dtype != req.dtype:
                raise ApiError(422, f"dtype: the query asks {dtype}, the body's dtype {req.dtype}")
            dtype = dtype or req.dtype
        check_count(len(keys), settings.max_keys)
        embeddings, found = lookup_rows(table, keys, offsets, weights, combiner)
        version = snap.version
        request.app.state.metrics.served(name, len(keys), len(keys) - int(np.count_nonzero(found)))
        dim = table.dim
    embeddings = cast_answer(embeddings, dtype)
    dtype_name = embeddings.dtype.name
    if wants_octet(request):
        packed = np.packbits(found, bitorder="little").tobytes()
        headers = {
            SHAPE_HEADER: f"{embeddings.shape[0]},{dim}",
            FOUND_HEADER: base64.b64encode(packed).decode(),
            VERSION_HEADER: version,
            DTYPE_HEADER: dtype_name,
        }
        return Response(embeddings.tobytes(), media_type=OCTET, headers=headers)
    body = dumps({"table": name, "dim": dim, "embeddings": embeddings, "found": found})
    return Response(
        body, media_type=JSON, headers={VERSION_HEADER: version, DTYPE_HEADER: dtype_name}
    )
