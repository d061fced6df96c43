"""Request bodies documented from the models that validate them.

Lookup and infer read their bodies themselves (strict JSON, raw bytes, KServe's binary
extension), so FastAPI cannot see their models; ``body_doc`` puts each model's JSON schema in
the route's OpenAPI entry, and ``install`` adds the nested models to ``components``.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

REF = "#/components/schemas/{model}"
_components: dict[str, Any] = {}


def body_doc(
    model: type[BaseModel], *, octet: str | None = None, path: tuple[str, ...] = ()
) -> dict[str, Any]:
    """``openapi_extra`` for a route whose JSON body is ``model`` (and, with ``octet``, which
    also takes a raw ``application/octet-stream`` body described by that text). ``path``:
    path parameters the handler reads from ``request.path_params`` itself (a declared
    parameter costs FastAPI's dependency solver some 30 us a request on the hot routes)."""
    schema = model.model_json_schema(ref_template=REF)
    _components.update(schema.pop("$defs", {}))
    _components[model.__name__] = schema
    content: dict[str, Any] = {
        "application/json": {"schema": {"$ref": REF.format(model=model.__name__)}}
    }
    if octet is not None:
        content["application/octet-stream"] = {
            "schema": {"type": "string", "format": "binary", "description": octet}
        }
    params = [
        {"name": p, "in": "path", "required": True, "schema": {"type": "string", "title": p}}
        for p in path
    ]
    return {"requestBody": {"required": True, "content": content}, "parameters": params}


def error_responses(model: type[BaseModel], *codes: int) -> dict[int | str, dict[str, Any]]:
    """A route's documented refusals: each status code answered with ``model``'s body."""
    return {code: {"model": model} for code in codes}


def install(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            spec = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            spec.setdefault("components", {}).setdefault("schemas", {}).update(_components)
            app.openapi_schema = spec
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
