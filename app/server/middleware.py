"""Middlewares: `front` (the /metrics count, the span, one log line per request, OpenAI-shaped errors),
the Host/Origin checks auth.front_door runs."""

from __future__ import annotations

import errno
import logging
import time
import traceback
from collections.abc import Awaitable, Callable, Collection
from urllib.parse import urlsplit

from aiohttp import web
from aiohttp.typedefs import Middleware

from app.core import tracing
from app.core.errors import BadRequestError, RequestTooLargeError, SwitchyardError
from app.core.events import EventBus
from app.server.metrics import REQUEST_DONE, Metrics, Outcome, handled, request_event
from app.server.request_keys import CLIENT, MODEL
from app.server.surfaces.base import encoding_of

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
    except Exception as exc:
        return shaped_error(request, exc)


def shaped_error(request: web.Request, exc: Exception) -> web.StreamResponse:
    """The answer for `exc`, raised while handling `request`, in the route's surface's error shape; an
    HTTP exception that is an answer of its own (a redirect, a 304) is raised again, as it came."""
    if isinstance(exc, SwitchyardError):
        return encoding_of(request).error_response(exc)
    if isinstance(exc, web.HTTPNotFound):
        return error_response(
            404,
            f"no route {request.method} {request.path}; see GET /v1/models and the API docs",
            type_="invalid_request_error",
            code="route_not_found",
        )
    if isinstance(exc, web.HTTPMethodNotAllowed):
        return error_response(
            405,
            f"{request.method} is not allowed on {request.path}; "
            f"use {', '.join(sorted(exc.allowed_methods))}",
            type_="invalid_request_error",
            code="method_not_allowed",
        )
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        return encoding_of(request).error_response(RequestTooLargeError("the request body is too large"))
    if isinstance(exc, web.HTTPException):
        raise exc
    fault = client_fault(exc)
    if fault is not None:
        logging.getLogger("switchyard").info("refused %s %s: %s", request.method, request.path, fault.message)
        return encoding_of(request).error_response(fault)
    logging.getLogger("switchyard").error(
        "unhandled error on %s %s", request.method, request.path, exc_info=exc
    )
    return encoding_of(request).error_response(
        SwitchyardError(f"internal gateway error: {type(exc).__name__}: {exc}")
    )


# where decoding what the client sent happens: an error raised through one of these is the client's input
_READERS = (
    "/aiohttp/web_request.py",
    "/aiohttp/multipart.py",
    "/aiohttp/helpers.py",
    "/yarl/",
    "/multidict/",
    "/email/",
    "/app/server/request_input.py",
    "/app/server/validate.py",
    "/app/server/multipart.py",
)
_DECODING = (ValueError, UnicodeError, RecursionError, OverflowError, LookupError)


def client_fault(exc: Exception) -> BadRequestError | None:
    """A 400 for an error that hostile input caused, or None for a bug of ours (which stays a 500).

    Deliberately narrow: a decoding error counts only when it was raised while reading the request
    (a frame of _READERS on its way up), and an OS error only when a name was too long for the disk."""
    if isinstance(exc, OSError) and exc.errno == errno.ENAMETOOLONG:
        return BadRequestError(f"a name in the request is longer than the file system allows: {exc.strerror}")
    if isinstance(exc, _DECODING) and not isinstance(exc, OSError):
        files = [f.filename.replace("\\", "/") for f in traceback.extract_tb(exc.__traceback__)]
        if any(marker in name for name in files for marker in _READERS):
            return BadRequestError(f"the request could not be read: {type(exc).__name__}: {str(exc)[:300]}")
    return None


def front(stats: Metrics, bus: EventBus | None = None) -> Middleware:
    """The outer layers of every request in one middleware (a coroutine, an Outcome and a timer for all of
    them), from the outside in: counted for /metrics (and published as `request.done` given `bus`), one
    server span while tracing is on (docs/tracing.md; the route pattern names it, never the raw path,
    and it continues the client's `traceparent`), one access log line (a client that hung up is 499, as
    /metrics counts it), and every refusal in its surface's shape (`errors`)."""

    @web.middleware
    async def front(request: web.Request, handler: Handler) -> web.StreamResponse:
        t0 = time.perf_counter()
        stats.in_flight += 1
        out = Outcome()  # a client that hung up is logged 499, as /metrics counts it
        try:
            if tracing.enabled():
                return await _spanned(request, handler, out)
            return await handled(request, handler, out, shape=shaped_error)
        finally:
            stats.in_flight -= 1
            seconds = time.perf_counter() - t0
            model = request.get(MODEL, "-")
            client = request.get(CLIENT, "-")
            line = "%s %s model=%s status=%s %.1fms client=%s"
            log.info(line, request.method, request.path, model, out.status, seconds * 1000, client)
            stats.record(request, status=out.status, seconds=seconds, t0=t0, resp=out.resp)
            if bus is not None and (data := request_event(request, status=out.status, seconds=seconds)):
                bus.publish(REQUEST_DONE, **data)

    return front


async def _spanned(request: web.Request, handler: Handler, out: Outcome) -> web.StreamResponse:
    """The request in one server span, its status noted in `out` (tracing is on)."""
    info = request.match_info
    route = info.route.resource.canonical if info.route.resource is not None else "(no route)"
    with tracing.server_span(f"{request.method} {route}", headers=request.headers) as sp:
        sp.set_attribute("http.request.method", request.method)
        sp.set_attribute("http.route", route)
        try:
            return await handled(request, handler, out, shape=shaped_error)
        finally:
            sp.set_attribute("http.response.status_code", out.status)
            if (model := request.get(MODEL)) is not None:
                sp.set_attribute("switchyard.model", model)
            if out.status >= 500:
                tracing.fail(sp, f"HTTP {out.status}")


def normalize_origin(origin: str) -> str:
    """scheme://host[:port] in lower case, without a default port or trailing slash ('' when it is no
    origin: a bad port, user info, a path)."""
    try:
        parts = urlsplit(origin.strip().lower())
        port = parts.port  # reading it checks it: 'http://a:99999' and 'http://a:x' are no origins
    except ValueError:
        return ""
    if parts.username is not None or parts.path not in ("", "/") or parts.query or not parts.hostname:
        return ""
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    default = {"http": 80, "https": 443}.get(parts.scheme)
    return f"{parts.scheme}://{host}" if port in (None, default) else f"{parts.scheme}://{host}:{port}"


def own_origins(request: web.Request, allowed_hosts: Collection[str]) -> set[str]:
    """The origins of this server as a browser names them: our scheme, each allowed host name, and the
    port this connection reached. Another port on the same host is another site (another program)."""
    sock = request.transport.get_extra_info("sockname") if request.transport else None
    port = int(sock[1]) if isinstance(sock, tuple) and len(sock) >= 2 else None
    if port is None:
        return set()
    suffix = "" if (request.scheme, port) in (("http", 80), ("https", 443)) else f":{port}"
    return {f"{request.scheme}://{name}{suffix}" for name in allowed_hosts}


def _host_name(host: str) -> str:
    return host.rsplit(":", 1)[0] if not host.endswith("]") else host


def _bare(allowed_hosts: Collection[str]) -> set[str]:
    return {h.strip("[]") for h in allowed_hosts}


def host_refusal(
    request: web.Request, allowed_hosts: Collection[str], origins: Collection[str]
) -> web.Response | None:
    """The refusal of a request whose Host is not ours (DNS rebinding) or that comes from another site's
    page, or None: it may pass. `allowed_hosts` and `origins` (the listed CORS origins) are those in force
    now (auth.py's Guard), so a server that listens again under new settings checks by them.

    The same-site rule: an Origin is ours only when scheme://host:port is exactly this server (one of the
    allowed hosts, on the port the connection reached) or is listed (normalized, from the cors_origins
    setting); http://localhost:3000 calling us on :8686 is foreign. A browser's `Sec-Fetch-Site:
    cross-site|same-site` without such an Origin is refused too (no-cors requests)."""
    # read the header itself: aiohttp's request.host falls back to this machine's name without one
    sent = request.headers.get("Host")
    host = (sent or "").strip().lower()
    if not host or _host_name(host) not in allowed_hosts:
        shown = repr(host) if sent is not None else "(no Host header)"
        return error_response(
            403,
            f"Host {shown} is not allowed (DNS rebinding protection); use http://127.0.0.1, or add "
            "the name to allowed_hosts in settings.json",
            type_="permission_error",
            code="host_not_allowed",
        )
    target = request.url  # from an absolute-form target when one is sent, else from Host
    if (target.host or "").lower().strip("[]") not in _bare(allowed_hosts):
        # an absolute-form target names the host the request is for (RFC 9112 3.2.2), over Host
        return error_response(
            403,
            f"the request target names the host {str(target.host)[:200]!r}, which is not this server "
            "(DNS rebinding protection); send the path only, with a Host this server answers to",
            type_="permission_error",
            code="host_not_allowed",
        )
    origin = request.headers.get("Origin")
    if origin is not None:
        ours = normalize_origin(origin)
        if not ours or (ours not in origins and ours not in own_origins(request, allowed_hosts)):
            return error_response(
                403,
                f"Origin {origin[:200]!r} is not allowed to call this server (only its own origin, "
                "scheme, host and port, is); list it in cors_origins",
                type_="permission_error",
                code="origin_not_allowed",
            )
    elif request.headers.get("Sec-Fetch-Site", "").lower() in ("cross-site", "same-site"):
        return error_response(
            403,
            "a page of another site may not call this server; list its origin in cors_origins",
            type_="permission_error",
            code="origin_not_allowed",
        )
    return None
