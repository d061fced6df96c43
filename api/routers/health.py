"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

from ..codec import dumps
from ..deps import holder_of, settings_of
from ..schemas import Status

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Status)
async def healthz() -> Response:
    """The process is alive (it answers)."""
    return Response(dumps({"status": "ok"}), media_type="application/json")


@router.get("/readyz", response_model=Status, responses={503: {"model": Status}})
async def readyz(request: Request) -> Response:
    """A snapshot is loaded: 200, else 503. Following a publish root with a
    ``max_staleness_s``, also 503 while the publication served is older than that."""
    ready = holder_of(request).current is not None
    status = "ok" if ready else "loading"
    follower = getattr(request.app.state, "follower", None)
    limit = settings_of(request).max_staleness_s
    if ready and follower is not None and limit is not None:
        staleness = follower.state.staleness()
        if staleness is None or staleness > limit:
            ready, status = False, "stale"
    body = dumps({"status": status})
    return Response(body, status_code=200 if ready else 503, media_type="application/json")


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}},
)
async def metrics(request: Request) -> Response:
    """Prometheus metrics (``evdb_*``), summed over the workers."""
    return Response(request.app.state.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
