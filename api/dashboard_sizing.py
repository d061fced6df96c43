"""The dashboard's Sizing view: ``evdb size`` of a key trace the page sends.

``POST /v1/dashboard/tables/{name}/sizing`` takes a trace file a ``KeyRecorder`` wrote (the
raw bytes, ``application/octet-stream``: the page reads the file the operator picks) and
answers what ``evdb size TRACE --json`` prints (``evdb.sizing.size_table``: the policy curve
by miniature simulation of the trace's own table configuration, the exact LRU curve, the rows
for the hit-rate targets, the hit rate at the current size), plus the LRU curve as points to
draw. Nothing is written where the server reads: the trace is read from a temporary file,
the miniatures live in a temporary directory, both removed after.

The analysis costs seconds of CPU (about what replaying the sampled keys through ~15 small
tables costs), so a server runs one at a time (another is refused with 429 while it runs),
keeps the last few answers by the trace's sha256 (the page asking again costs nothing), and
refuses traces over ``MAX_TRACE_BYTES``. A trace of another table is refused with 422, as
``read_trace(table=...)`` refuses it; one of a table of the same name whose configuration
differs from the served one's (a serving export, ``--cache-rows``) is analysed for the
configuration it was recorded with, and the answer says so (``config_matches``).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import tempfile
import time
from collections import OrderedDict
from typing import Any

import numpy as np
from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from evdb.sizing import size_table
from evdb.sizing_report import SizingReport
from evdb.trace import config_digest, read_trace

from .codec import JSON, OCTET, ApiError, body_type, dumps, read_body
from .deps import table_of, use_snapshot
from .openapi import error_responses
from .schemas import Error

MAX_TRACE_BYTES = 64 << 20  # 8M sampled keys: a 1% trace of some 800M accesses
KEPT_ANSWERS = 4
LRU_POINTS = 120  # points of the exact LRU curve drawn (log-spaced sizes)

router = APIRouter(tags=["dashboard"])


class Sizing(BaseModel):
    model_config = ConfigDict(extra="allow")

    table: str
    trace: dict[str, Any] = Field(
        description="What the trace says of itself: bytes, sha256, rate (the keys' sampling "
        "rate), floor_rate (the recorder's), min_keys, seed, batches, complete, "
        "config_digest"
    )
    config_matches: bool = Field(
        description="Whether the trace's table configuration is the served table's (the "
        "curves are always of the trace's own)."
    )
    lru_points: dict[str, list[float | None]] = Field(
        description="rows and hit_rate: the exact LRU curve at log-spaced sizes."
    )
    report: dict[str, Any] = Field(description="What `evdb size TRACE --json` prints.")
    seconds: float = Field(description="The analysis' wall time (0 for a kept answer).")


class SizingJobs:
    """One analysis at a time, and the last ``KEPT_ANSWERS`` answers by (table, sha256)."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.answers: OrderedDict[tuple[str, str, bool], dict[str, Any]] = OrderedDict()

    def kept(self, key: tuple[str, str, bool]) -> dict[str, Any] | None:
        answer = self.answers.get(key)
        if answer is not None:
            self.answers.move_to_end(key)
        return answer

    def keep(self, key: tuple[str, str, bool], answer: dict[str, Any]) -> None:
        self.answers[key] = answer
        while len(self.answers) > KEPT_ANSWERS:
            self.answers.popitem(last=False)


def jobs_of_app(app: Any) -> SizingJobs:
    """The app's ``SizingJobs``, made on first use."""
    jobs = getattr(app.state, "sizing", None)
    if jobs is None:
        jobs = app.state.sizing = SizingJobs()
    return jobs


def lru_points(report: SizingReport) -> dict[str, list[float | None]]:
    """The exact LRU curve at up to LRU_POINTS log-spaced sizes, from 1 row to every
    distinct key (its hit rates are exact at each, not interpolated)."""
    top = max(report.lru.distinct_estimate, 2)
    rows = np.unique(np.geomspace(1, top, LRU_POINTS).round())
    rates = report.lru.hit_rate(rows)
    return {
        "rows": rows.tolist(),
        "hit_rate": [None if np.isnan(x) else round(float(x), 6) for x in rates],
    }


def analyse(data: bytes, table: str, served_digest: str, allow_incomplete: bool) -> dict[str, Any]:
    """The answer for one trace file's bytes (see the module's note)."""
    fd, name = tempfile.mkstemp(prefix="evdb-sizing-", suffix=".trace")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        trace = read_trace(name, table=table, allow_incomplete=allow_incomplete)
    finally:
        os.unlink(name)
    t0 = time.perf_counter()
    report = size_table(trace)
    header = trace.header
    return {
        "table": table,
        "trace": {
            "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "rate": header.rate,
            "floor_rate": header.floor_rate or header.rate,
            "min_keys": header.min_keys,
            "seed": header.seed,
            "batches": trace.n_batches,
            "complete": trace.complete,
            "config_digest": header.config_digest,
        },
        "config_matches": header.config_digest == served_digest,
        "lru_points": lru_points(report),
        "report": report.to_dict(),
        "seconds": round(time.perf_counter() - t0, 3),
    }


@router.post(
    "/v1/dashboard/tables/{name}/sizing",
    response_model=Sizing,
    responses=error_responses(Error, 404, 413, 415, 422, 429, 503),
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                OCTET: {
                    "schema": {
                        "type": "string",
                        "format": "binary",
                        "description": "A key trace file (evdb.trace.KeyRecorder) of the table",
                    }
                }
            },
        }
    },
)
async def post_sizing(name: str, request: Request, allow_incomplete: bool = False) -> Response:
    """`evdb size` of the key trace in the body (a file a `KeyRecorder` wrote of this table):
    the policy and LRU curves, the rows for 90, 95 and 99% hit rates and the hit rate at the
    current size. One analysis at a time per server (429 meanwhile); the last few answers are
    kept by the trace's sha256. `allow_incomplete`: read a trace whose recorder was not
    closed (its complete chunks)."""
    body_type(request, OCTET)
    data = await read_body(request, MAX_TRACE_BYTES)
    with use_snapshot(request) as snap:
        served = table_of(snap, name)
        digest = config_digest(served.config.to_dict())
    jobs = jobs_of_app(request.app)
    key = (name, hashlib.sha256(data).hexdigest(), allow_incomplete)
    answer = jobs.kept(key)
    if answer is not None:
        return Response(dumps({**answer, "seconds": 0.0}), media_type=JSON)
    if jobs.lock.locked():
        raise ApiError(429, "another sizing analysis is running on this server: try when it ends")
    async with jobs.lock:
        answer = await run_in_threadpool(analyse, data, name, digest, allow_incomplete)
    jobs.keep(key, answer)
    return Response(dumps(answer), media_type=JSON)
