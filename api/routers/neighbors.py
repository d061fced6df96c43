"""``POST /v1/tables/{name}/neighbors``: ``Table.neighbors`` over REST.

An exact scan of every live row: refused (422, saying why) for ``k`` above ``MAX_K`` and for
tables above ``--max-scan-rows`` (2,000,000 by default), which bounds how long one request
holds its worker. The rows counted and scanned are the served table's (``ReadableTable``):
following a publish root, the publication's, the rows of its deltas included.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import numpy as np
from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, Field

from ..codec import JSON, ApiError, body_type, dumps, parse_json, read_body, validate
from ..deps import settings_of, table_of, use_snapshot
from ..openapi import body_doc, error_responses
from ..schemas import Error, Float32, Int64, _Strict

router = APIRouter(prefix="/v1/tables", tags=["tables"])

MAX_K = 1000


class NeighborsRequest(_Strict):
    """Exactly one of ``key`` and ``vector``."""

    key: Int64 | str | None = Field(
        default=None,
        description="Query by a key (int64, or a string for a str table): its row, or its "
        "default value. The key itself is left out of the answer.",
    )
    # Float32: a larger value became inf, and every score null (JSON has no inf) in a 200
    vector: list[Float32] | None = Field(default=None, description="Or query by a vector (dim).")
    k: Annotated[int, Field(strict=True, ge=1, le=MAX_K)] = Field(
        default=10, description=f"How many neighbours (at most {MAX_K})."
    )
    metric: Literal["cosine", "dot", "l2"] = "cosine"


class NeighborsResponse(BaseModel):
    table: str
    metric: str
    keys: list[int] = Field(description="Nearest first; ties by key.")
    scores: list[float] = Field(description="Similarity (cosine, dot) or distance (l2).")
    strings: list[str | None] | None = Field(
        default=None, description="The keys' strings, for a table that keeps them."
    )


@router.post(
    "/{name}/neighbors",
    response_model=NeighborsResponse,
    responses=error_responses(Error, 404, 413, 415, 422, 503),
    openapi_extra=body_doc(NeighborsRequest, path=("name",)),
)
async def neighbors(request: Request) -> Response:
    """Exact top-k nearest neighbours of a key or a vector among the table's live rows
    (``Table.neighbors``)."""
    name: str = request.path_params["name"]
    settings = settings_of(request)
    body_type(request, JSON)
    body = await read_body(request, 64 * 65536)
    data = parse_json(body)
    if isinstance(data, dict) and isinstance(data.get("k"), int) and data["k"] > MAX_K:
        raise ApiError(422, f"k: at most {MAX_K} neighbours, got {data['k']}")
    req = validate(NeighborsRequest, data)
    if (req.key is None) == (req.vector is None):
        raise ApiError(422, "body: give exactly one of key and vector")
    with use_snapshot(request) as snap:
        table = table_of(snap, name)
        rows = len(table)
        if rows > settings.max_scan_rows:
            raise ApiError(
                422,
                f"table: {name!r} has {rows:,} rows, more than --max-scan-rows "
                f"{settings.max_scan_rows:,}; a neighbours query scans every row",
            )
        query: Any = req.key if req.key is not None else np.array(req.vector, np.float64)
        keys, scores = table.neighbors(query, req.k, req.metric)  # bad input: EvdbError
        if not np.isfinite(scores).all():  # float32 products of huge values overflow
            what = "vector" if req.vector is not None else "key"
            raise ApiError(
                422, f"{what}: its {req.metric} scores overflow float32 (values too large)"
            )
        strings = table.strings(keys) if table.keeps_strings else None
    out = {"table": name, "metric": req.metric, "keys": keys, "scores": scores}
    if strings is not None:
        out["strings"] = strings
    return Response(dumps(out), media_type=JSON)
