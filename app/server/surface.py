"""One small object per API surface (OpenAI, Anthropic, Ollama): how its errors, streams and loading ticks
look on the wire.

A route says which surface it serves with `@serves(SURFACE)`; the error middleware, the limits and the
request runner ask `surface_of(request)` and never guess from a module name or a path. Adding a surface is
one translator plus one `Surface`.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from aiohttp import web

from app.core.errors import SwitchyardError
from app.server.translate_anthropic import error_body as anthropic_error_body
from app.server.translation import loading_comment

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
H = TypeVar("H", bound=Handler)


@dataclass(frozen=True)
class Surface:
    name: str
    media_type: str  # of its streams
    error_body: Callable[[SwitchyardError], dict[str, Any]]
    stream_error: Callable[[SwitchyardError], bytes]  # an error once a stream has begun
    loading: Callable[[str, str, float], bytes]  # (model, phase, seconds): what a waiting stream hears

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


OPENAI = Surface(
    name="openai",
    media_type="text/event-stream",
    error_body=lambda exc: exc.envelope(),
    stream_error=_openai_error_event,
    loading=loading_comment,
)
ANTHROPIC = Surface(
    name="anthropic",
    media_type="text/event-stream",
    error_body=anthropic_error_body,
    stream_error=_anthropic_error_event,
    loading=loading_comment,
)
OLLAMA = Surface(
    name="ollama",
    media_type="application/x-ndjson",
    error_body=lambda exc: {"error": exc.message},
    stream_error=_ollama_error_line,
    loading=_ollama_waiting,
)


def serves(surface: Surface) -> Callable[[H], H]:
    """Mark a route handler as one of `surface`'s (put it under the `@routes.post(...)` line)."""

    def mark(handler: H) -> H:
        handler.surface = surface  # type: ignore[attr-defined]
        return handler

    return mark


def surface_of(request: web.Request) -> Surface:
    """The surface of the route `request` matched (OpenAI's for routes that name none)."""
    handler = getattr(request.match_info, "handler", None)
    found = getattr(handler, "surface", None)
    return found if isinstance(found, Surface) else OPENAI
