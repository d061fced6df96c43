"""What the routers get from the app: settings, the snapshot in use, a table, admin rights.

Settings live on ``app.state`` (``create_app(settings)``; tests pass their own). The snapshot
is taken per request with :func:`use_snapshot` rather than a FastAPI dependency, because a
dependency with ``yield`` costs a task switch on the hot path of every lookup.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from contextlib import contextmanager

from fastapi import Request

from evdb.view import ReadableTable

from .codec import ApiError, short
from .settings import Settings
from .snapshots import Snapshot, SnapshotHolder


def settings_of(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def holder_of(request: Request) -> SnapshotHolder:
    holder: SnapshotHolder = request.app.state.holder
    return holder


@contextmanager
def use_snapshot(request: Request) -> Iterator[Snapshot]:
    """The current snapshot, held until the answer is built (a reload waits for it)."""
    holder = holder_of(request)
    snap = holder.acquire()
    if snap is None:
        raise ApiError(503, "no snapshot is loaded yet")
    try:
        yield snap
    finally:
        holder.release(snap)


def table_of(snap: Snapshot, name: str) -> ReadableTable:
    table = snap.tables.get(name)
    if table is None:
        raise ApiError(404, f"table: no table named {short(name)} (tables: {sorted(snap.tables)})")
    return table


def require_admin(request: Request) -> None:
    """A bearer token equal to the one in ``--token-file``: 401 without one, 403 if wrong
    (compared in constant time), 403 when the server was started without a token."""
    token = settings_of(request).token
    if token is None:
        raise ApiError(403, "admin endpoints are disabled: start evdb serve with --token-file")
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not given:
        raise ApiError(401, "authorization: a bearer token is required")
    if not hmac.compare_digest(given.strip().encode(), token.encode()):
        raise ApiError(403, "authorization: the bearer token is not valid")
