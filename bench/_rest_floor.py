"""The framework floor of bench_rest.py: a minimal FastAPI app that answers a lookup with
rows gathered from a numpy array (keys are row numbers), so it pays for HTTP, FastAPI and
(de)serialisation, and nothing of a store. Run by uvicorn with ``FLOOR_VALUES`` naming an
``.npy`` file of the (n, dim) float32 rows."""

from __future__ import annotations

import os

import numpy as np
import orjson
from fastapi import FastAPI, Request, Response

values = np.load(os.environ["FLOOR_VALUES"])
app = FastAPI()


@app.post("/lookup")
async def lookup(request: Request) -> Response:
    body = await request.body()
    if request.headers.get("content-type") == "application/octet-stream":
        rows = values[np.frombuffer(body, dtype="<i8")]
        return Response(rows.tobytes(), media_type="application/octet-stream")
    rows = values[np.array(orjson.loads(body)["keys"], dtype=np.int64)]
    found = np.ones(rows.shape[0], dtype=bool)
    out = orjson.dumps(
        {"table": "item", "dim": rows.shape[1], "embeddings": rows, "found": found},
        option=orjson.OPT_SERIALIZE_NUMPY,
    )
    return Response(out, media_type="application/json")
