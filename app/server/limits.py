"""Request limits: body size and read time, concurrent requests per client, prompt length.

The middleware runs innermost (after the auth middleware has named the client): it refuses a body over
`max_body_mib` (413), a compressed body or one of a media type the route does not read (415, see
app/server/gateway/request_input.py), a client already running `max_concurrent_per_client` requests (429 with
Retry-After), and a body that has not fully arrived within `body_timeout_s` (408). Idle connections and
request heads that never complete are closed by aiohttp itself after `idle_timeout_s` (see `serve`).

Refusals are in the shape of the route's API surface (app/server/surfaces/base.py). The prompt-length check
is the gateway's (app/server/gateway/core.py: `Gateway.check`); for MLX lanes, which size their cache as
requests come, it calls `check_window` (app/server/gateway/prompt_window.py): the prompt counted with the
model's own tokenizer.json against the trained window.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from app.core.errors import (
    RequestTimeoutError,
    RequestTooLargeError,
    SwitchyardError,
    TooManyRequestsError,
)
from app.core.settings import Settings
from app.server.auth import is_admin
from app.server.gateway.request_input import check_body_headers
from app.server.request_keys import CLIENT
from app.server.surfaces.base import encoding_of

log = logging.getLogger("switchyard.limits")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MIB = 1024 * 1024
RETRY_AFTER_S = 1
# aiohttp would inflate gzip/deflate bodies inside its parser, where junk (or a truncated stream) drops
# the connection without an answer; bodies arrive as sent and a coded one is refused (request_input.py)
HANDLER_ARGS = {"auto_decompress": False}


# the media types a browser's cross-site "simple" request may declare (no preflight): the CORS safelist
_SIMPLE_TYPES = frozenset({"text/plain", "application/x-www-form-urlencoded", "multipart/form-data"})


def _simple_media(request: web.Request) -> bool:
    return request.headers.get("Content-Type", "").split(";", 1)[0].strip().lower() in _SIMPLE_TYPES


def error_response(
    request: web.Request, exc: SwitchyardError, *, headers: dict[str, str] | None = None
) -> web.Response:
    """`exc` in the error shape of the surface the route belongs to (OpenAI, Anthropic or Ollama)."""
    return encoding_of(request).error_response(exc, headers=headers)


def middleware(settings: Settings) -> Middleware:
    max_body = settings.limits.max_body_mib * MIB
    per_client = settings.limits.max_concurrent_per_client
    body_timeout = settings.limits.body_timeout_s
    active: dict[str, int] = {}

    def too_large() -> RequestTooLargeError:
        return RequestTooLargeError(
            f"the request body is over the {settings.limits.max_body_mib} MiB limit; send a smaller body "
            "(or raise max_body_mib in settings.json)"
        )

    @web.middleware
    async def limits(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.content_length is not None and request.content_length > max_body:
            return error_response(request, too_large())  # aiohttp reads the rest away, then closes
        # a coded body, or one the route would not read as JSON: refused before it is read. An admin route
        # that changes state takes JSON only, an empty body declared as one a browser sends without asking
        # first included (an empty form or text/plain POST would still load, unload or notify)
        admin = is_admin(request)
        changes = admin and request.method in ("POST", "PUT", "PATCH", "DELETE")
        if request.body_exists or (changes and _simple_media(request)):
            try:
                check_body_headers(request, strict=admin)
            except SwitchyardError as exc_h:
                return error_response(request, exc_h)
        client = str(request.get(CLIENT, "-"))
        counted = per_client > 0 and request.method == "POST"
        if counted:
            running = active.get(client, 0)
            if running >= per_client:
                exc = TooManyRequestsError(
                    f"client {client!r} already has {running} request(s) running, the most allowed "
                    f"(max_concurrent_per_client); retry after one finishes"
                )
                return error_response(request, exc, headers={"Retry-After": str(RETRY_AFTER_S)})
            active[client] = running + 1
        try:
            if request.body_exists:
                try:
                    async with asyncio.timeout(body_timeout):
                        await request.read()  # kept by aiohttp: the handler's read() returns it
                except TimeoutError:
                    exc_t = RequestTimeoutError(
                        f"the request body did not arrive within {body_timeout:g} s (body_timeout_s); "
                        "send the whole body at once"
                    )
                    return await _answer_and_close(request, error_response(request, exc_t))
                except web.HTTPRequestEntityTooLarge:
                    return error_response(request, too_large())
            return await handler(request)
        finally:
            if counted:
                left = active[client] - 1
                if left:
                    active[client] = left
                else:
                    del active[client]

    return limits


async def _answer_and_close(request: web.Request, resp: web.Response) -> web.Response:
    """Send `resp`, then drop the connection: the rest of a trickling body is not waited for (aiohttp
    would otherwise keep reading it for up to 10 s before closing)."""
    resp.force_close()
    await resp.prepare(request)
    await resp.write_eof()
    if request.transport is not None:
        request.transport.close()  # after the answer: a transport flushes what it holds before closing
    return resp
