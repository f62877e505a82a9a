"""`GET /openapi.json`: an OpenAPI 3.1 document generated from the application's route table.

Every route the app serves is listed (HEAD, which each GET also answers, is left out). A summary is the
first line of the handler's docstring, else a line from SUMMARIES; the rest of the docstring is the
description. A surface's routes (app/server/surfaces/registry.py SURFACES) take their tag, request and
answer schemas and error shape from their `Surface`; any other route's tag is the `TAG` its module
declares, and its bodies are described as JSON objects (docs/api.md has them in full).

The committed copy, docs/openapi.json, is regenerated with

    .venv/bin/python -m app.server.openapi_write          # writes docs/openapi.json
    .venv/bin/python -m app.server.openapi_write --check  # exits 1 if the committed copy is stale
"""

from __future__ import annotations

import inspect
import json
import re
import sys
from pathlib import Path
from typing import Any

from aiohttp import web

from app import __version__
from app.server.surfaces.base import Surface, handler_surface
from app.server.surfaces.registry import SURFACES

DOC_PATH = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"
_METHODS = ("get", "post", "put", "patch", "delete")
# for handlers without a docstring (wrapped ones, mostly)
SUMMARIES = {
    ("GET", "/v1/models"): "List the servable models",
    ("GET", "/v1/models/{model_id}"): "One model",
    ("POST", "/v1/chat/completions"): "Chat completion, passed through to the model's engine",
    ("POST", "/v1/completions"): "Text completion, passed through to the model's engine",
    ("POST", "/v1/embeddings"): "Embeddings, passed through to the model's engine",
    ("POST", "/v1/responses"): "OpenAI Responses API, translated onto chat",
    ("POST", "/v1/messages"): "Anthropic Messages, translated onto chat",
    ("POST", "/v1/messages/count_tokens"): "Anthropic token count",
    ("GET", "/api/tags"): "Ollama: the models",
    ("GET", "/api/ps"): "Ollama: the loaded models",
    ("POST", "/api/show"): "Ollama: one model's details",
    ("POST", "/api/chat"): "Ollama: chat",
    ("POST", "/api/generate"): "Ollama: generate from a prompt",
    ("POST", "/api/embed"): "Ollama: embeddings",
    ("POST", "/api/embeddings"): "Ollama: one embedding (the older endpoint)",
    ("GET", "/health"): "Liveness and lane counts",
    ("GET", "/api/version"): "Version",
    ("GET", "/api/downloads/{job_id}"): "One download",
    ("GET", "/api/models"): "Every model file found, broken ones included",
    ("POST", "/api/models/{model_id}/load"): "Start a model's lane and wait until it is ready",
    ("POST", "/api/models/{model_id}/unload"): "Stop a model's lane",
    ("GET", "/api/lanes"): "All lanes",
    ("GET", "/api/lanes/{lane_id}"): "One lane",
    ("GET", "/api/lanes/{lane_id}/logs"): "The last lines of a lane's engine output",
    ("GET", "/api/hardware"): "The hardware snapshot",
    ("GET", "/api/keys"): "List the API keys (names only)",
    ("POST", "/api/keys"): "Create an API key",
    ("DELETE", "/api/keys/{name}"): "Revoke an API key",
}
_NO_BODY = {
    ("POST", "/api/models/{model_id}/load"),
    ("POST", "/api/models/{model_id}/unload"),
    ("POST", "/api/remotes/{name}/check"),
    ("POST", "/api/engines/update"),
    ("POST", "/api/engines/{engine}/update"),
    ("POST", "/api/engines/{engine}/rollback"),
}
_QUERY = {
    ("GET", "/api/lanes/{lane_id}/logs"): [
        {
            "name": "lines",
            "in": "query",
            "required": False,
            "description": "How many lines (default 200).",
            "schema": {"type": "string", "pattern": "^[0-9]+$"},
        }
    ]
}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "description": "The envelope of every Switchyard error outside the Anthropic and Ollama routes.",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["message", "type", "param", "code"],
                "properties": {
                    "message": {"type": "string", "description": "What went wrong and what to do next."},
                    "type": {"type": "string", "description": "An OpenAI error type."},
                    "param": {"type": ["string", "null"], "description": "The offending request field."},
                    "code": {"type": ["string", "null"], "description": "Stable, for programs."},
                    "source": {"type": "string", "enum": ["gateway", "engine", "remote"]},
                },
            }
        },
    },
}
_SSE = {"text/event-stream": {"schema": {"type": "string"}}}
_TEXT_ANSWERS = {
    ("GET", "/metrics"): {"text/plain": {"schema": {"type": "string"}}},
    ("GET", "/api/events"): _SSE,
    ("GET", "/api/engines/events"): _SSE,
}


def _summary(method: str, path: str, handler: Any) -> tuple[str, str | None]:
    doc = inspect.getdoc(handler)
    if doc:
        first, _, rest = doc.partition("\n")
        return first.strip().rstrip("."), " ".join(rest.split()) or None
    return SUMMARIES.get((method, path), f"{method} {path}"), None


def _tag(method: str, path: str, handler: Any) -> str:
    """Its surface's tag (or its route table's), else the `TAG` its module declares beside its routes."""
    found = handler_surface(handler)
    if found is not None:
        surface, routes = found
        return routes.tag or surface.tag
    tag = getattr(sys.modules.get(str(getattr(handler, "__module__", ""))), "TAG", None)
    if not isinstance(tag, str):
        raise TypeError(
            f"{method} {path}: its module {handler.__module__} declares no TAG (its routes' OpenAPI tag); "
            'add one beside its routes, e.g. TAG = "Admin"'
        )
    return tag


def _operation(method: str, path: str, handler: Any) -> dict[str, Any]:
    found = handler_surface(handler)
    summary, description = _summary(method, path, handler)
    op: dict[str, Any] = {
        "operationId": re.sub(r"[^A-Za-z0-9]+", "_", f"{method.lower()}{path}").strip("_"),
        "summary": summary,
        "tags": [_tag(method, path, handler)],
    }
    if description:
        op["description"] = description
    params = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in re.findall(r"{([^}]+)}", path)
    ]
    params += _QUERY.get((method, path), [])
    if params:
        op["parameters"] = params
    known = found[0].operations.get((method, path)) if found is not None else None
    request_schema, ok = known if known is not None else (None, None)
    if request_schema is not None:
        op["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": _ref(request_schema)}},
        }
    elif method == "POST" and (method, path) not in _NO_BODY:
        op["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": {"type": "object"}}},
        }
    if ok is None:
        text = _TEXT_ANSWERS.get((method, path))
        ok = {"description": "OK", "content": text} if text else _json({"type": "object"})
    error = found[0].encoding.error_schema if found is not None else "Error"
    op["responses"] = {"200": ok, "default": _json(_ref(error), "An error")}
    return op


def document(app: web.Application) -> dict[str, Any]:
    """The OpenAPI document of every route in `app`'s router."""
    paths: dict[str, dict[str, Any]] = {}
    for route in app.router.routes():
        method = route.method.upper()
        if method.lower() not in _METHODS or route.resource is None:
            continue  # HEAD mirrors GET; '*' routes have no single operation
        path = route.resource.canonical
        paths.setdefault(path, {})[method.lower()] = _operation(method, path, route.handler)
    ordered = {
        p: {m: ops[m] for m in _METHODS if m in ops} for p, ops in sorted(paths.items(), key=lambda kv: kv[0])
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Switchyard",
            "version": __version__,
            "description": (
                "Local models behind OpenAI-, Anthropic- and Ollama-compatible APIs. Every GET route also "
                "answers HEAD. Path parameters named model_id or lane_id may contain '/'. See docs/api.md."
            ),
        },
        "servers": [{"url": "http://127.0.0.1:8686"}],
        "security": [{}, {"bearer": []}, {"apiKey": []}],
        "paths": ordered,
        "components": {
            "schemas": components(SURFACES),
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An API key as a bearer token.",
                },
                "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
            },
        },
    }


def components(surfaces: tuple[Surface, ...]) -> dict[str, Any]:
    """The shell's schemas, then each surface's; a name two of them define is refused (one would hide the
    other)."""
    out = dict(SCHEMAS)
    for surface in surfaces:
        if clash := sorted(set(out) & set(surface.schemas)):
            raise ValueError(f"the {surface.name} surface defines OpenAPI schemas defined already: {clash}")
        out.update(surface.schemas)
    return out


def render(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2) + "\n"


TAG = "Observability"  # the OpenAPI tag of its routes
routes = web.RouteTableDef()


@routes.get("/openapi.json")
async def openapi_json(request: web.Request) -> web.Response:
    """This document: OpenAPI 3.1, generated from the server's route table"""
    return web.Response(text=render(document(request.app)), content_type="application/json")
