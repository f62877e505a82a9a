"""What a front door is made of: a `Surface` (one per API: OpenAI, Responses, Anthropic, Ollama) and the
`Encoding` its errors, streams and loading ticks take on the wire.

A surface is registered once, in SURFACES (app/server/surfaces/registry.py). `Surface.install` adds its
routes to the app and marks each handler with it, so the error middleware, the limits, authentication
and the request runner ask `surface_of(request)` / `encoding_of(request)` and never guess from a module
name or a path; the OpenAPI document and the safety policy's groups read the registry.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from app.core.errors import SwitchyardError
from app.server.surfaces.anthropic.errors import error_body as anthropic_error_body
from app.server.surfaces.schemas import Operation
from app.server.surfaces.wire import loading_comment, ndjson, sse_events

# the headers every surface reads a key from: `Authorization: Bearer KEY` or `x-api-key: KEY`
KEY_HEADERS = ("Authorization", "x-api-key")


@dataclass(frozen=True)
class Encoding:
    """How one wire format says an error, a stream, a loading tick and a translated stream's pieces."""

    media_type: str  # of its streams
    error_body: Callable[[SwitchyardError], dict[str, Any]]
    stream_error: Callable[[SwitchyardError], bytes]  # an error once a stream has begun
    loading: Callable[[str, str, float], bytes]  # (model, phase, seconds): what a waiting stream hears
    frame: Callable[[Sequence[Any]], bytes]  # a translated stream's pieces (named events, NDJSON objects)
    error_schema: str  # the OpenAPI component its error bodies follow

    def error_response(self, exc: SwitchyardError, *, headers: dict[str, str] | None = None) -> web.Response:
        return web.json_response(self.error_body(exc), status=exc.status, headers=headers)

    def stream_response(self, *, headers: dict[str, str] | None = None) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers=headers)
        resp.headers["Content-Type"] = self.media_type
        if self.media_type == "text/event-stream":
            resp.headers["Cache-Control"] = "no-cache"
            resp.headers["X-Accel-Buffering"] = "no"
        return resp


def _openai_error_event(exc: SwitchyardError) -> bytes:
    return f"data: {json.dumps(exc.envelope())}\n\n".encode()


def _anthropic_error_event(exc: SwitchyardError) -> bytes:
    return f"event: error\ndata: {json.dumps(anthropic_error_body(exc))}\n\n".encode()


def _ollama_error_line(exc: SwitchyardError) -> bytes:
    return json.dumps({"error": exc.message}).encode() + b"\n"


def _ollama_waiting(model: str, phase: str, seconds: float) -> bytes:
    # NDJSON has no comments: an empty piece is what Ollama clients read as nothing to add
    return (
        json.dumps({"model": model, "message": {"role": "assistant", "content": ""}, "done": False}).encode()
        + b"\n"
    )


OPENAI = Encoding(
    media_type="text/event-stream",
    error_body=lambda exc: exc.envelope(),
    stream_error=_openai_error_event,
    loading=loading_comment,
    frame=sse_events,
    error_schema="Error",
)
ANTHROPIC = Encoding(
    media_type="text/event-stream",
    error_body=anthropic_error_body,
    stream_error=_anthropic_error_event,
    loading=loading_comment,
    frame=sse_events,
    error_schema="AnthropicError",
)
OLLAMA = Encoding(
    media_type="application/x-ndjson",
    error_body=lambda exc: {"error": exc.message},
    stream_error=_ollama_error_line,
    loading=_ollama_waiting,
    frame=ndjson,
    error_schema="OllamaError",
)


@dataclass(frozen=True)
class Routes:
    """One route table of a surface, and how its routes differ from the surface's own, where they do."""

    table: web.RouteTableDef
    tag: str | None = None  # its OpenAPI tag, where not the surface's
    manages: bool = False  # they change this machine (pull, delete): the admin gate applies, as on /api/


@dataclass(frozen=True)
class Surface:
    """One API's front door. `name` is also its safety policy group (app/core/policy.GROUPS)."""

    name: str
    tag: str  # its operations' OpenAPI tag
    encoding: Encoding
    routes: tuple[Routes, ...]
    schemas: Mapping[str, Any]  # OpenAPI components
    operations: Mapping[tuple[str, str], Operation]  # (METHOD, path) -> (request schema, the 200 answer)
    key_headers: tuple[str, ...] = KEY_HEADERS  # where its clients send an API key
    cors_headers: tuple[str, ...] = ()  # request headers its browser clients send, beyond the key's
    setup: Callable[[web.Application], None] | None = field(default=None, compare=False)

    @property
    def group(self) -> str:
        return self.name

    def install(self, app: web.Application) -> None:
        """Add its routes to `app`, each handler marked as this surface's, then run its setup hook."""
        for routes in self.routes:
            for route in routes.table:
                if isinstance(route, web.RouteDef):
                    _mark(route.handler, _Mark(self, routes))
            app.add_routes(routes.table)
        if self.setup is not None:
            self.setup(app)


@dataclass(frozen=True)
class _Mark:
    surface: Surface
    routes: Routes


def _mark(handler: Any, mark: _Mark) -> None:
    found = getattr(handler, "front_door", None)
    if isinstance(found, _Mark) and found.surface.name != mark.surface.name:
        raise ValueError(
            f"{handler.__qualname__} is a route of both {found.surface.name} and {mark.surface.name}"
        )
    handler.front_door = mark


def _mark_of(handler: Any) -> _Mark | None:
    found = getattr(handler, "front_door", None)
    return found if isinstance(found, _Mark) else None


def surface_of(request: web.Request) -> Surface | None:
    """The surface of the route `request` matched; None for routes of none (admin, metrics, unmatched)."""
    mark = _mark_of(getattr(request.match_info, "handler", None))
    return mark.surface if mark is not None else None


def handler_surface(handler: Any) -> tuple[Surface, Routes] | None:
    """The surface a route handler was installed by, and its route table's entry (for the OpenAPI doc)."""
    mark = _mark_of(handler)
    return (mark.surface, mark.routes) if mark is not None else None


def encoding_of(request: web.Request) -> Encoding:
    """How the matched route's surface says errors and streams (OpenAI's for routes of no surface)."""
    surface = surface_of(request)
    return surface.encoding if surface is not None else OPENAI


def manages(request: web.Request) -> bool:
    """Whether the matched route is one of a surface's routes that change this machine (admin-gated)."""
    mark = _mark_of(getattr(request.match_info, "handler", None))
    return mark is not None and mark.routes.manages
