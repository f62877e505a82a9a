"""Who may call the server: API keys, the admin gate, CORS for listed origins, and the /api/keys routes.

- Keys are required when the bind is not loopback, or when `require_api_key` is on. A key is sent as
  `Authorization: Bearer KEY` or `x-api-key: KEY`. `/health` and CORS preflights of listed origins stay
  open. A valid key, required or not, names its client on the request (`request[CLIENT]`).
- The admin API (every `/api/...` route that is not an Ollama client route) answers only clients on this
  machine, unless `allow_remote_admin` is on; a remote admin request then always needs a key.
- CORS: only origins listed in `cors_origins` get `Access-Control-Allow-Origin` (their exact origin) and a
  preflight answer; there is never a `*` and an unlisted origin is never echoed.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
import socket
from dataclasses import dataclass

from aiohttp import web

from app.core.errors import BadRequestError
from app.core.paths import Paths
from app.core.secrets import KeyStore, Secret
from app.core.settings import Settings
from app.server.middleware import Handler, error_response, normalize_origin
from app.server.request_keys import CLIENT
from app.server.validate import parse_body

log = logging.getLogger("switchyard")

OPEN_PATHS = frozenset({"/health"})
# Ollama's client API lives under /api/ too; it is client traffic, not administration
OLLAMA_PATHS = frozenset(
    {
        "/api/tags",
        "/api/ps",
        "/api/show",
        "/api/chat",
        "/api/generate",
        "/api/embed",
        "/api/embeddings",
        "/api/version",
    }
)
ALLOW_METHODS = "GET, POST, DELETE, OPTIONS"
ALLOW_HEADERS = ("Authorization", "x-api-key", "Content-Type", "anthropic-version", "anthropic-beta")
_TOKEN = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+")
CREATE_HINT = "create one with `switchyard keys create NAME`"


@dataclass(frozen=True)
class Guard:
    store: KeyStore
    required: bool
    remote_admin: bool
    origins: frozenset[str]


GUARD: web.AppKey[Guard] = web.AppKey("auth_guard", Guard)


def is_loopback(host: str | None) -> bool:
    """True for localhost names and loopback addresses (IPv4-mapped ones too)."""
    if not host:
        return False
    if host.lower() == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


def keys_required(settings: Settings) -> bool:
    return settings.require_api_key or not is_loopback(settings.host)


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
    return frozenset(normalize_origin(o) for o in settings.cors_origins)


def is_admin_path(path: str) -> bool:
    return (path == "/api" or path.startswith("/api/")) and path not in OLLAMA_PATHS


def refusal(path: str, status: int, message: str, *, code: str) -> web.Response:
    """A 401/403 in the shape of the surface `path` belongs to (Anthropic, Ollama or OpenAI)."""
    headers = {"WWW-Authenticate": 'Bearer realm="switchyard"'} if status == 401 else {}
    if path.startswith("/v1/messages"):
        kind = "authentication_error" if status == 401 else "permission_error"
        body: object = {"type": "error", "error": {"type": kind, "message": message}}
        return web.json_response(body, status=status, headers=headers)
    if path in OLLAMA_PATHS:
        return web.json_response({"error": message}, status=status, headers=headers)
    kind = "invalid_request_error" if status == 401 else "permission_error"
    resp = error_response(status, message, type_=kind, code=code)
    resp.headers.update(headers)
    return resp


def presented_keys(request: web.Request) -> list[Secret]:
    found = []
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        found.append(Secret(value.strip()))
    if request.headers.get("x-api-key", "").strip():
        found.append(Secret(request.headers["x-api-key"].strip()))
    return found


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
    origin = request.headers.get("Origin")
    if (
        request.method == "OPTIONS"
        and origin
        and "Access-Control-Request-Method" in request.headers
        and normalize_origin(origin) in request.app[GUARD].origins
    ):
        asked = request.headers.get("Access-Control-Request-Headers", "")
        extra = [h.strip() for h in asked.split(",") if _TOKEN.fullmatch(h.strip())]
        # the origin is trusted: allow the headers it asks for too (SDKs send their own x-... headers)
        names = list({h.lower(): h for h in [*extra, *ALLOW_HEADERS]}.values())
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
    return await handler(request)


@web.middleware
async def require_key(request: web.Request, handler: Handler) -> web.StreamResponse:
    guard = request.app[GUARD]
    path = request.path
    if path in OPEN_PATHS:
        return await handler(request)
    admin = is_admin_path(path)
    remote = not is_loopback(request.remote)
    if admin and remote and not guard.remote_admin:
        return refusal(
            path,
            403,
            f"the admin API ({path}) answers only on this machine; call it from there, or set "
            "allow_remote_admin: true in settings.json (a key is then required)",
            code="admin_not_allowed",
        )
    keys = presented_keys(request)
    client = await identify(guard.store, keys) if keys else None
    if client:
        request[CLIENT] = client
    elif guard.required or (admin and remote):
        if keys:
            msg = "the API key is not valid (unknown, revoked or mistyped); see `switchyard keys list`"
        else:
            msg = (
                "this server needs an API key: send Authorization: Bearer KEY or x-api-key: KEY; "
                + CREATE_HINT
            )
        return refusal(path, 401, msg, code="invalid_api_key")
    return await handler(request)


async def cors_headers(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: runs for streamed responses too, before their headers go out."""
    origins = request.app[GUARD].origins
    if not origins:
        return
    origin = request.headers.get("Origin")
    if origin and normalize_origin(origin) in origins:
        response.headers["Access-Control-Allow-Origin"] = origin
    vary = response.headers.get("Vary")
    if not vary or "origin" not in vary.lower():
        response.headers["Vary"] = f"{vary}, Origin" if vary else "Origin"


def setup(app: web.Application, settings: Settings, paths: Paths) -> None:
    """Install the guard's state, the CORS header hook and the /api/keys routes on `app`."""
    store = KeyStore.at(paths)
    guard = Guard(
        store=store,
        required=keys_required(settings),
        remote_admin=settings.allow_remote_admin,
        origins=cors_origins(settings),
    )
    app[GUARD] = guard
    app.on_response_prepare.append(cors_headers)
    app.add_routes(routes)
    if guard.required:
        n = len(store.entries())
        log.info("API keys required (%d key%s in %s)", n, "" if n == 1 else "s", store.path)
        if not n:
            log.warning("no API key exists, so every request but /health gets 401; %s", CREATE_HINT)


# ---- admin API: /api/keys ---------------------------------------------------------------------------
routes = web.RouteTableDef()


@routes.get("/api/keys")
async def list_keys(request: web.Request) -> web.Response:
    """The API keys: name, creation time, last 4 characters, whether the keyring holds it; never a secret."""
    store = request.app[GUARD].store
    return web.json_response(
        {"keys": [k.public() for k in store.entries()], "required": request.app[GUARD].required}
    )


@routes.post("/api/keys")
async def create_key(request: web.Request) -> web.Response:
    """Make a key for the client named in `{"name": ...}`; the answer holds its secret, this once."""
    body = parse_body(await request.read())
    name = body.get("name")
    if not isinstance(name, str):
        raise BadRequestError('send {"name": "..."}: the client\'s name for the new key', param="name")
    created = await asyncio.to_thread(request.app[GUARD].store.create, name)
    return web.json_response(
        {**created.info.public(), "key": created.secret.reveal(), "note": created.note()},
        status=201,
        headers={"Cache-Control": "no-store"},
    )


@routes.delete("/api/keys/{name}")
async def revoke_key(request: web.Request) -> web.Response:
    """Revoke a key; clients that send it get 401 from the next request on."""
    info = await asyncio.to_thread(request.app[GUARD].store.revoke, request.match_info["name"])
    return web.json_response({"name": info.name, "revoked": True})
