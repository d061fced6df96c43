"""``/v1/admin``: swap the served snapshot (bearer token; paths under ``--allow-root``)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool

import evdb

from ..codec import JSON, ApiError, body_type, dumps, parse_json, read_body, validate
from ..deps import holder_of, require_admin, settings_of
from ..openapi import body_doc, error_responses
from ..schemas import Error, ReloadRequest, ReloadResponse

router = APIRouter(prefix="/v1/admin", tags=["admin"])


def allowed(path: str, roots: tuple[Path, ...]) -> Path:
    """``path`` resolved (symlinks and ``..`` too), if it lies under one of ``roots``. A path
    no file can have is the client's mistake, a 422 (the OS refuses a NUL byte or an overlong
    name with ValueError or OSError, which would otherwise be a 500)."""
    if not path:
        raise ApiError(422, "path: empty")
    nul = path.find("\0")
    if nul >= 0:
        raise ApiError(422, f"path: a NUL byte at character {nul}")
    try:
        real = Path(path).resolve()
    except (OSError, RuntimeError) as e:  # RuntimeError: a symlink loop (Python < 3.13)
        raise ApiError(422, f"path: cannot be resolved ({e})") from None
    if not any(real.is_relative_to(root) for root in roots):
        raise ApiError(403, "path: not under any --allow-root directory")
    return real


@router.post(
    "/reload",
    response_model=ReloadResponse,
    responses=error_responses(Error, 401, 403, 404, 413, 415, 422),
    openapi_extra=body_doc(ReloadRequest),
)
async def reload(request: Request) -> Response:
    """Open the snapshot at ``path`` and serve it: requests in flight finish on the old one,
    new ones see the new one; the old one closes after its last request."""
    require_admin(request)
    body_type(request, JSON)
    body = await read_body(request, 1 << 16)
    req = validate(ReloadRequest, parse_json(body))
    path = allowed(req.path, settings_of(request).allow_roots)
    holder = holder_of(request)
    try:
        snap = await run_in_threadpool(holder.load, path)
    except evdb.DatabaseNotFoundError:
        raise ApiError(404, "path: holds no evdb database or serving export") from None
    except (evdb.EvdbError, OSError) as e:  # OSError: a file the server cannot read
        raise ApiError(422, f"path: cannot be served ({type(e).__name__}: {e})") from None
    previous = holder.current
    old = None if previous is None else previous.info()
    holder.swap(snap)
    holder.publish(path)
    follower = getattr(request.app.state, "follower", None)
    if follower is not None:  # the served version leaves the publication seqs: say so
        follower.admin_reload(path)
    return Response(dumps({"snapshot": snap.info(), "previous": old}), media_type=JSON)
