"""``/docs`` and ``/redoc`` that work with no internet, and the favicon.

FastAPI's own pages load Swagger UI and ReDoc from a public CDN, so on an air-gapped cluster
they are blank. Here both pages load the assets that the PyPI package ``fastapi-offline``
ships (``fastapi_offline/static``: swagger-ui-bundle.js, swagger-ui.css, redoc.standalone.js,
all served from this server); our own small script starts Swagger UI, so neither page has an
inline script, and a Content-Security-Policy keeps everything on this origin. ReDoc injects
its styles at run time (styled-components), hence ``style-src 'unsafe-inline'`` here, and
only here: the dashboard's policy is ``default-src 'self'`` alone.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fastapi import APIRouter, Response

from .codec import ApiError

router = APIRouter(include_in_schema=False)

STATIC = Path(__file__).parent / "static"
DOCS_CSP = {
    "Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; worker-src 'self' blob:",
    "X-Content-Type-Options": "nosniff",
}
# ReDoc's footer shows a logo it loads from its vendor's CDN (hard-coded, no option turns it
# off): served with that one URL pointing at our favicon, so the page asks no other origin.
REDOC_LOGO = (b"https://cdn.redoc.ly/redoc/logo-mini.svg", b"/favicon.ico")
# The assets fastapi-offline ships: name -> media type.
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "redoc.standalone.js": "text/javascript; charset=utf-8",
}

SWAGGER = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>evdb - Swagger UI</title>
<link rel="icon" href="/favicon.ico"><link rel="stylesheet" href="/docs/static/swagger-ui.css">
</head><body><div id="swagger-ui"></div>
<script src="/docs/static/swagger-ui-bundle.js"></script>
<script src="/docs/static/swagger-init.js"></script>
</body></html>
"""

REDOC = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>evdb - ReDoc</title>
<link rel="icon" href="/favicon.ico"></head><body>
<redoc spec-url="/openapi.json"></redoc>
<script src="/docs/static/redoc.standalone.js"></script>
</body></html>
"""


def _asset_dir() -> Path:
    try:
        return Path(str(resources.files("fastapi_offline") / "static"))
    except ModuleNotFoundError:
        raise ApiError(
            404, "docs: the Swagger UI and ReDoc assets need fastapi-offline "
            "(pip install 'evdb[serve]')",
        ) from None  # fmt: skip


@router.get("/docs")
async def swagger() -> Response:
    return Response(SWAGGER, media_type="text/html; charset=utf-8", headers=DOCS_CSP)


@router.get("/redoc")
async def redoc() -> Response:
    return Response(REDOC, media_type="text/html; charset=utf-8", headers=DOCS_CSP)


@router.get("/docs/static/{file}")
async def docs_asset(file: str) -> Response:
    if file == "swagger-init.js":
        path = STATIC / file
    elif file in ASSETS:
        path = _asset_dir() / file
    else:
        raise ApiError(404, f"file: no docs file named {file[:64]!r}")
    media = ASSETS.get(file, "text/javascript; charset=utf-8")
    headers = {**DOCS_CSP, "Cache-Control": "public, max-age=86400"}
    body = path.read_bytes()
    if file == "redoc.standalone.js":
        body = body.replace(*REDOC_LOGO)
    return Response(body, media_type=media, headers=headers)


@router.get("/favicon.ico")
async def favicon() -> Response:
    return Response((STATIC / "favicon.png").read_bytes(), media_type="image/png")
