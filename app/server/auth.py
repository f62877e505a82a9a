"""Who may call the server: API keys, the admin gate, CORS for listed origins, and the /api/keys routes.

- Keys are required when the bind is not loopback, or when `require_api_key` is on. A key is sent in the
  headers the matched route's surface names (`Surface.key_headers`: `Authorization: Bearer KEY` or
  `x-api-key: KEY` on every surface today). `/health` and CORS preflights of listed origins stay open. A
  valid key, required or not, names its client on the request (`request[CLIENT]`).
- The admin API (every `/api/...` route of no surface, and a surface's routes that change this machine:
  Ollama's pull, delete, copy, create) answers only clients on this machine, unless `allow_remote_admin`
  is on; a remote admin request then always needs a key. A refusal takes the matched surface's error shape.
- CORS: only origins listed in `cors_origins` get `Access-Control-Allow-Origin` (their exact origin) and a
  preflight answer, which allows the key headers and the surfaces' own request headers
  (`Surface.cors_headers`); there is never a `*` and an unlisted origin is never echoed.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass

from aiohttp import web

from app.core.errors import AdminNotAllowedError, BadRequestError, KeyRequiredError
from app.core.paths import Paths
from app.core.secrets import KeyStore, Secret
from app.core.settings import Settings
from app.server.dashboard.routes import is_page_path
from app.server.middleware import LOOPBACK_NAMES, Handler, host_refusal, normalize_origin
from app.server.request_keys import CLIENT
from app.server.surfaces.base import KEY_HEADERS, Surface, encoding_of, manages, surface_of
from app.server.surfaces.openai.validate import parse_body

log = logging.getLogger("switchyard")

# /peer/pair: another machine redeeming a pairing code, which is its credential (wrong codes lock pairing);
# /peer/link: a paired peer unpairing, proven by its pinned client certificate (app/server/admin/peers.py)
OPEN_PATHS = frozenset({"/health", "/peer/pair", "/peer/link"})
ALLOW_METHODS = "GET, POST, DELETE, OPTIONS"
_TOKEN = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+")
CREATE_HINT = "create one with `switchyard keys create NAME`"
_LOOPBACK_FORMS = frozenset({"127.0.0.1", "::1"})


@dataclass(frozen=True)
class Guard:
    store: KeyStore
    required: bool
    remote_admin: bool
    origins: frozenset[str]
    allow_headers: tuple[str, ...]  # what a listed origin's preflight allows, whatever it asks for
    hosts: frozenset[str] = frozenset()  # the Host names this server answers to (DNS rebinding check)


class Gate:
    """The guard in force on an app. `arm` swaps it whole, so a server that listens again (the desktop's
    Stop and Start) checks keys, Host and Origin by the settings of that moment, not those of the app's
    first start; a request reads one Guard from start to end."""

    def __init__(self, guard: Guard) -> None:
        self.guard = guard


GATE: web.AppKey[Gate] = web.AppKey("auth_gate", Gate)


def guard_of(request: web.Request) -> Guard:
    return request.app[GATE].guard


def is_loopback(host: str | None) -> bool:
    """True for localhost names and loopback addresses (IPv4-mapped ones too)."""
    if not host:
        return False
    if host in _LOOPBACK_FORMS or host.lower() == "localhost":
        return True  # the common caller, named without the address parse (a request's remote, each time)
    try:
        ip = ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


def keys_required(settings: Settings) -> bool:
    return settings.security.require_api_key or not is_loopback(settings.server.host)


def host_names(address: str) -> set[str]:
    """The forms an address takes in a Host header: IPv6 ones in brackets."""
    a = address.lower().split("%", 1)[0]
    return {a, f"[{a}]"} if ":" in a and not a.startswith("[") else {a}


def own_addresses() -> set[str]:
    """This machine's interface addresses, as Host header names."""
    out: set[str] = set()
    try:
        import psutil

        for snics in psutil.net_if_addrs().values():
            for s in snics:
                if s.family in (socket.AF_INET, socket.AF_INET6):
                    out |= host_names(s.address)
    except Exception:  # psutil may be unavailable or denied; the bound address is allowed anyway
        log.warning("could not list this machine's addresses; only the bound address is allowed as Host")
    return out


def cors_origins(settings: Settings) -> frozenset[str]:
    return frozenset(normalize_origin(o) for o in settings.security.cors_origins)


def is_admin(request: web.Request) -> bool:
    """Whether the matched route administers this machine: a surface's route only where it says so (Ollama's
    client API lives under /api/ too, and is client traffic), any other route under /api/."""
    if surface_of(request) is not None:
        return manages(request)
    return request.path == "/api" or request.path.startswith("/api/")


def allow_headers(surfaces: Iterable[Surface]) -> tuple[str, ...]:
    """The request headers a listed origin's preflight allows: the key headers and each surface's own."""
    names = [*KEY_HEADERS, "Content-Type"]
    for surface in surfaces:
        names += [*surface.key_headers, *surface.cors_headers]
    return tuple(dict.fromkeys(names))


def refusal(request: web.Request, exc: KeyRequiredError | AdminNotAllowedError) -> web.Response:
    """A 401/403 in the error shape of the matched route's surface (OpenAI's for routes of none)."""
    headers = {"WWW-Authenticate": 'Bearer realm="switchyard"'} if exc.status == 401 else None
    return encoding_of(request).error_response(exc, headers=headers)


def presented_keys(request: web.Request) -> list[Secret]:
    """The keys the request carries, in the headers its surface reads them from (`Authorization` as a
    bearer token, any other header as it is)."""
    surface = surface_of(request)
    found = []
    for name in surface.key_headers if surface is not None else KEY_HEADERS:
        raw = request.headers.get(name, "")
        if name.lower() == "authorization":
            scheme, _, raw = raw.partition(" ")
            if scheme.lower() != "bearer":
                continue
        if raw.strip():
            found.append(Secret(raw.strip()))
    return found


def caller_key(request: web.Request) -> str | None:
    """The key this request was sent with, however it was sent (Bearer or x-api-key), for work the server
    does on the caller's behalf through its own front door (eval cases, job steps)."""
    keys = presented_keys(request)
    return keys[0].reveal() if keys else None


async def identify(store: KeyStore, keys: list[Secret]) -> str | None:
    """The client name of the first valid key; scrypt runs off the event loop, once per key."""
    for key in keys:
        name = store.cached(key)
        if name is None and store.candidate(key):  # anything else ("unused", "sk-...") costs no thread
            name = await asyncio.to_thread(store.verify, key)
        if name:
            return name
    return None


@web.middleware
async def cors_preflight(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Answer a CORS preflight from a listed origin (before any key check: browsers send none)."""
    answer = preflight_answer(request, guard_of(request))
    return answer if answer is not None else await handler(request)


def preflight_answer(request: web.Request, guard: Guard) -> web.Response | None:
    """`cors_preflight`'s answer to `request`, or None when it is no preflight of a listed origin."""
    if request.method != "OPTIONS":
        return None
    origin = request.headers.get("Origin")
    if not (
        origin
        and "Access-Control-Request-Method" in request.headers
        and normalize_origin(origin) in guard.origins
    ):
        return None
    asked = request.headers.get("Access-Control-Request-Headers", "")
    extra = [h.strip() for h in asked.split(",") if _TOKEN.fullmatch(h.strip())]
    # the origin is trusted: allow the headers it asks for too (SDKs send their own x-... headers)
    names = list({h.lower(): h for h in [*extra, *guard.allow_headers]}.values())
    headers = {
        "Access-Control-Allow-Origin": origin,
        "Access-Control-Allow-Methods": ALLOW_METHODS,
        "Access-Control-Allow-Headers": ", ".join(names),
        "Access-Control-Max-Age": "600",
        "Vary": "Origin, Access-Control-Request-Method, Access-Control-Request-Headers",
    }
    if request.headers.get("Access-Control-Request-Private-Network", "").lower() == "true":
        headers["Access-Control-Allow-Private-Network"] = "true"
    return web.Response(status=204, headers=headers)


@web.middleware
async def require_key(request: web.Request, handler: Handler) -> web.StreamResponse:
    refused = await key_refusal(request, guard_of(request))
    return refused if refused is not None else await handler(request)


async def key_refusal(request: web.Request, guard: Guard) -> web.Response | None:
    """`require_key`'s refusal of `request` (no valid key where one is needed, the admin API from
    elsewhere), or None; a valid key names its client on the request."""
    path = request.path
    if path in OPEN_PATHS or is_page_path(path):  # the dashboard's files: no data, the API asks for keys
        return None
    admin = is_admin(request)
    remote = not is_loopback(request.remote)
    if admin and remote and not guard.remote_admin:
        return refusal(
            request,
            AdminNotAllowedError(
                f"the admin API ({path}) answers only on this machine; call it from there, or set "
                "allow_remote_admin: true in settings.json (a key is then required)"
            ),
        )
    keys = presented_keys(request)
    client = await identify(guard.store, keys) if keys else None
    if client:
        request[CLIENT] = client
    elif guard.required or (admin and remote):
        if keys:
            msg = "the API key is not valid (unknown, revoked or mistyped); see `switchyard keys ls`"
        else:
            msg = (
                "this server needs an API key: send Authorization: Bearer KEY or x-api-key: KEY; "
                + CREATE_HINT
            )
        return refusal(request, KeyRequiredError(msg))
    return None


@web.middleware
async def front_door(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The Host and Origin check (middleware.host_refusal), `cors_preflight` and `require_key` in one
    middleware, in that order (one coroutine per request instead of three), by the one Guard in force
    when the request came."""
    guard = guard_of(request)
    refused = host_refusal(request, guard.hosts, guard.origins) or preflight_answer(request, guard)
    if refused is None:
        refused = await key_refusal(request, guard)
    return refused if refused is not None else await handler(request)


async def cors_headers(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: runs for streamed responses too, before their headers go out."""
    origins = guard_of(request).origins
    if not origins:
        return
    origin = request.headers.get("Origin")
    if origin and normalize_origin(origin) in origins:
        response.headers["Access-Control-Allow-Origin"] = origin
    vary = response.headers.get("Vary")
    if not vary or "origin" not in vary.lower():
        response.headers["Vary"] = f"{vary}, Origin" if vary else "Origin"


def allowed_hosts(settings: Settings) -> frozenset[str]:
    """The Host names a server bound by `settings` answers to: loopback names, the bound name, every address
    of this machine when the bind reaches the network, and the `allowed_hosts` setting."""
    hosts = set(LOOPBACK_NAMES)
    if settings.server.host not in ("0.0.0.0", "::"):
        hosts |= host_names(settings.server.host)
    if not is_loopback(settings.server.host):  # reachable from the network: by any of our addresses
        hosts |= own_addresses()
    for name in settings.security.allowed_hosts:
        hosts |= host_names(name)
    return frozenset(hosts)


def guard_for(settings: Settings, *, store: KeyStore, allow_headers: tuple[str, ...]) -> Guard:
    return Guard(
        store=store,
        required=keys_required(settings),
        remote_admin=settings.security.allow_remote_admin,
        origins=cors_origins(settings),
        allow_headers=allow_headers,
        hosts=allowed_hosts(settings),
    )


def setup(app: web.Application, settings: Settings, paths: Paths, *, surfaces: Iterable[Surface]) -> None:
    """Install the guard's state, the CORS header hook and the /api/keys routes on `app`, for `surfaces`."""
    store = KeyStore.at(paths)
    app[GATE] = Gate(guard_for(settings, store=store, allow_headers=allow_headers(surfaces)))
    app.on_response_prepare.append(cors_headers)
    app.add_routes(routes)
    _log_required(app[GATE].guard)


def arm(app: web.Application, settings: Settings) -> None:
    """Rebuild the app's guard from `settings` (before it listens again): keys required or not, remote
    admin, CORS origins and the Host names follow what the settings say now."""
    gate = app[GATE]
    gate.guard = guard_for(settings, store=gate.guard.store, allow_headers=gate.guard.allow_headers)
    _log_required(gate.guard)


def _log_required(guard: Guard) -> None:
    if guard.required:
        n = len(guard.store.entries())
        log.info("API keys required (%d key%s in %s)", n, "" if n == 1 else "s", guard.store.path)
        if not n:
            log.warning("no API key exists, so every request but /health gets 401; %s", CREATE_HINT)


# ---- admin API: /api/keys ---------------------------------------------------------------------------
TAG = "Admin"  # the OpenAPI tag of its routes
routes = web.RouteTableDef()


@routes.get("/api/keys")
async def list_keys(request: web.Request) -> web.Response:
    """The API keys: name, creation time, last 4 characters, whether the keyring holds it; never a secret."""
    store = guard_of(request).store
    return web.json_response(
        {"keys": [k.public() for k in store.entries()], "required": guard_of(request).required}
    )


@routes.post("/api/keys")
async def create_key(request: web.Request) -> web.Response:
    """Make a key for the client named in `{"name": ...}`; the answer holds its secret, this once."""
    body = parse_body(await request.read())
    name = body.get("name")
    if not isinstance(name, str):
        raise BadRequestError('send {"name": "..."}: the client\'s name for the new key', param="name")
    created = await asyncio.to_thread(guard_of(request).store.create, name)
    return web.json_response(
        {**created.info.public(), "key": created.secret.reveal(), "note": created.note()},
        status=201,
        headers={"Cache-Control": "no-store"},
    )


@routes.delete("/api/keys/{name}")
async def revoke_key(request: web.Request) -> web.Response:
    """Revoke a key; clients that send it get 401 from the next request on."""
    info = await asyncio.to_thread(guard_of(request).store.revoke, request.match_info["name"])
    return web.json_response({"name": info.name, "revoked": True})
