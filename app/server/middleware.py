"""Middlewares: OpenAI-shaped errors, one log line per request, Host/Origin checks."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from aiohttp import web
from aiohttp.typedefs import Middleware

from app.core.errors import RequestTooLargeError, SwitchyardError
from app.server.metrics import CLIENT_CLOSED, SENT_STATUS
from app.server.request_keys import CLIENT, MODEL
from app.server.surface import surface_of

log = logging.getLogger("switchyard.access")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

LOOPBACK_NAMES = {"127.0.0.1", "localhost", "::1", "[::1]"}


def error_response(
    status: int, message: str, *, type_: str, code: str, param: str | None = None, source: str = "gateway"
) -> web.Response:
    body = {"error": {"message": message, "type": type_, "param": param, "code": code, "source": source}}
    return web.json_response(body, status=status)


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every refusal in the shape of the route's API surface (OpenAI's for routes that name none)."""
    try:
        return await handler(request)
    except SwitchyardError as exc:
        return surface_of(request).error_response(exc)
    except web.HTTPNotFound:
        return error_response(
            404,
            f"no route {request.method} {request.path}; see GET /v1/models and the API docs",
            type_="invalid_request_error",
            code="route_not_found",
        )
    except web.HTTPMethodNotAllowed as exc:
        return error_response(
            405,
            f"{request.method} is not allowed on {request.path}; "
            f"use {', '.join(sorted(exc.allowed_methods))}",
            type_="invalid_request_error",
            code="method_not_allowed",
        )
    except web.HTTPRequestEntityTooLarge:
        return surface_of(request).error_response(RequestTooLargeError("the request body is too large"))
    except web.HTTPException:
        raise
    except Exception as exc:
        logging.getLogger("switchyard").exception("unhandled error on %s %s", request.method, request.path)
        return surface_of(request).error_response(
            SwitchyardError(f"internal gateway error: {type(exc).__name__}: {exc}")
        )


@web.middleware
async def access_log(request: web.Request, handler: Handler) -> web.StreamResponse:
    t0 = time.perf_counter()
    status = 500
    try:
        resp = await handler(request)
        status = resp.status
        return resp
    except web.HTTPException as exc:
        status = exc.status
        raise
    except asyncio.CancelledError:
        # the client hung up: 499, as /metrics counts it (or the status of a stream it had read whole)
        status = request.get(SENT_STATUS, CLIENT_CLOSED)
        raise
    finally:
        ms = (time.perf_counter() - t0) * 1000
        model = request.get(MODEL, "-")
        client = request.get(CLIENT, "-")
        line = "%s %s model=%s status=%s %.1fms client=%s"
        log.info(line, request.method, request.path, model, status, ms, client)


def normalize_origin(origin: str) -> str:
    """scheme://host[:port] in lower case, without a default port or trailing slash."""
    parts = urlsplit(origin.strip().lower())
    netloc = parts.netloc
    default = {"http": ":80", "https": ":443"}.get(parts.scheme)
    if default and netloc.endswith(default):
        netloc = netloc[: -len(default)]
    return f"{parts.scheme}://{netloc}"


def host_guard(allowed_hosts: set[str], *, origins: frozenset[str] = frozenset()) -> Middleware:
    """Refuse requests whose Host is not ours (DNS rebinding) or whose Origin is a foreign site.

    `origins` (normalized, from the cors_origins setting) may call from any host name."""

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        host = (request.host or "").lower()
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        if name not in allowed_hosts:
            return error_response(
                403,
                f"Host {host!r} is not allowed (DNS rebinding protection); use http://127.0.0.1, or add "
                "the name to allowed_hosts in settings.json",
                type_="permission_error",
                code="host_not_allowed",
            )
        origin = request.headers.get("Origin")
        if (
            origin
            and (urlsplit(origin).hostname or "").lower() not in allowed_hosts
            and normalize_origin(origin) not in origins
        ):
            return error_response(
                403,
                f"Origin {origin!r} is not allowed to call this server; list it in cors_origins",
                type_="permission_error",
                code="origin_not_allowed",
            )
        return await handler(request)

    return guard
