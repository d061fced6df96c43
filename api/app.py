"""``create_app``: the FastAPI service that serves a read-only snapshot over REST.

Routes (``/docs`` has them all, generated from ``schemas``):

- ``/v1/tables``, ``/v1/tables/{name}``, ``POST /v1/tables/{name}/lookup`` (JSON or bytes)
- ``/v2/...``: the KServe v2 / Open Inference Protocol, a table being a model, with Triton's
  ``/v2/repository/index`` and ``/v2/models/{name}/config``; the same protocol over gRPC on
  ``Settings.grpc_port`` (``grpc_service``; ``app.state.grpc_port`` is the port bound)
- ``POST /v1/tables/{name}/neighbors``: exact nearest neighbours (``Table.neighbors``)
- ``/healthz``, ``/readyz``, ``/metrics`` (Prometheus, ``evdb_*``)
- ``/dashboard`` and its JSON under ``/v1/dashboard`` (unless ``Settings.dashboard`` is off)
- ``/docs`` and ``/redoc``, whose assets are served from the package (no CDN)
- ``POST /v1/admin/reload`` (bearer token): serve another snapshot without a failed request

Handlers are ``async`` and do their table work without awaiting: a lookup of 1,000 keys from
DRAM takes tens of microseconds, less than a hop to the thread pool, and a table is not
shared between threads. Several worker processes (``evdb serve --workers N``) give
parallelism; each opens the snapshot read-only.

Errors: every refusal is a 4xx whose JSON names the field and first bad element
(``{"detail": ...}``, or ``{"error": ...}`` under ``/v2`` as the protocol says). FastAPI's
own validation handler is replaced: it echoes the input back, and can fail on what it echoes.
A route that reads a body takes ``application/json`` (or no Content-Type), and raw bytes
where it says so; any other type is a 415 (``codec.body_type``). Every response carries
``X-Content-Type-Options: nosniff`` (:class:`NoSniff`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import evdb

from . import dashboard, docs, openapi
from .codec import ApiError, dumps, validation_message
from .metrics import Metrics, MetricsMiddleware
from .routers import admin, health, kserve, neighbors, tables
from .sampler import Sampler
from .settings import Settings, get_settings
from .snapshots import SnapshotHolder

log = logging.getLogger("evdb.api")

# evdb's errors, as the status a request that caused them gets.
STATUS = {
    evdb.TableNotFoundError: 404,
    evdb.DatabaseNotFoundError: 404,
    evdb.ReadOnlyError: 409,
    evdb.KeyCollisionError: 409,
}


def _error(
    request: Request, status: int, detail: str, headers: Mapping[str, str] | None = None
) -> Response:
    key = "error" if request.url.path.startswith("/v2") else "detail"
    return Response(
        dumps({key: detail}), status_code=status, media_type="application/json", headers=headers
    )


def create_app(settings: Settings | None = None) -> FastAPI:
    """The service for ``settings`` (default: from ``EVDB_*`` environment variables)."""
    settings = settings or get_settings()
    holder = SnapshotHolder(
        state_file=settings.state_file,
        cache_rows=settings.cache_rows,
        mmap_reads=settings.mmap_reads,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        published = holder.published_path()  # a reload taken before this worker started wins
        start = published or settings.path
        if start is not None and holder.current is None:
            # Checksums are read once per snapshot, not once per worker: evdb serve checked
            # the start path before its workers started, and a worker checked a reload before
            # it published it.
            checked = published is not None or settings.path_verified
            holder.swap(await run_in_threadpool(holder.load, start, verify=not checked))
            holder.reloads = 0
        async with AsyncExitStack() as stack:
            if settings.grpc_port is not None:  # the v2 gRPC protocol beside HTTP
                from .grpc_service import start as start_grpc  # grpc: imported when used

                server, app.state.grpc_port = await start_grpc(app, settings)
                stack.push_async_callback(server.stop, 1.0)
            if settings.dashboard:
                await stack.enter_async_context(app.state.sampler.running())
            yield
        holder.close()

    app = FastAPI(
        title="evdb",
        version=evdb.__version__,
        description="Embedding lookups from a read-only evdb snapshot.",
        lifespan=lifespan,
        docs_url=None,  # served offline by docs.router instead of from FastAPI's CDN pages
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.holder = holder
    app.state.metrics = Metrics(holder, settings.metrics_dir)
    app.state.views = dashboard.Views(holder)
    app.state.sampler = Sampler(
        app.state.metrics, holder, settings.sample_interval_s, after_tick=app.state.views.warm
    )
    # The routers' routes go onto the app flat: FastAPI 0.16x keeps an included router as a
    # nested one, which cost 25-30 us a request here (a trivial route: 60-69 us nested,
    # 41-45 us flat, 31-33 us alone), a tenth of a whole 1,000-key binary lookup.
    routers = [tables.router, neighbors.router, kserve.router, health.router, admin.router]
    routers.append(docs.router)
    if settings.dashboard:
        routers.append(dashboard.router)
    for router in routers:
        app.router.routes.extend(router.routes)
    openapi.install(app)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> Response:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return _error(request, exc.status, exc.detail, headers)

    @app.exception_handler(evdb.EvdbError)
    async def evdb_error(request: Request, exc: evdb.EvdbError) -> Response:
        status = next((s for t, s in STATUS.items() if isinstance(exc, t)), 422)
        return _error(request, status, str(exc))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        return _error(request, 422, validation_message(exc.errors()))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        return _error(request, exc.status_code, str(exc.detail), exc.headers)

    if settings.follow_root is not None:  # a publish root: follow it
        from .follow import install  # imports the app's modules: imported where it is used

        install(app, settings, holder)
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics, holder=holder)
    if settings.state_file is not None:
        app.add_middleware(FollowReloads, holder=holder)
    app.add_middleware(NoSniff)
    return app


NOSNIFF = (b"x-content-type-options", b"nosniff")


class NoSniff:
    """``X-Content-Type-Options: nosniff`` on every response: a browser takes each body for
    the type it is sent as (a JSON error quoting a client's string is never run as a script
    or rendered as HTML), whichever route, handler or refusal wrote it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_nosniff(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                if not any(name.lower() == NOSNIFF[0] for name, _ in headers):
                    message = {**message, "headers": [*headers, NOSNIFF]}
            await send(message)

        await self.app(scope, receive, send_nosniff)


class FollowReloads:
    """With several workers: before a request, serve what another worker's reload published."""

    def __init__(self, app: ASGIApp, holder: SnapshotHolder) -> None:
        self.app = app
        self.holder = holder

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = self.holder.published_path()
            if path is not None:
                try:
                    # the worker that took the reload checked its checksums before publishing
                    snap = await run_in_threadpool(self.holder.load, path, verify=False)
                    self.holder.swap(snap)
                except evdb.EvdbError:
                    log.exception("cannot follow the reload to %s; serving the old snapshot", path)
        await self.app(scope, receive, send)
