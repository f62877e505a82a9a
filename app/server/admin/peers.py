"""/api/peers (this machine's admin API) and /peer/... (what paired peers call, over mutual TLS).

- GET /api/peers, POST /api/peers/invite, POST /api/peers (pair with {"address", "code", "name"?,
  "fingerprint"?}), GET|DELETE /api/peers/{name}, POST /api/peers/{name}/check.
- POST /peer/pair: another machine redeeming a code (open: the code is its credential, and wrong codes
  lock pairing: app/lanes/peers/pairing.py). GET /peer/info and DELETE /peer/link: a paired peer only.

A key issued to a peer (keys.json, `peer.NAME`) is accepted only on a connection that presented that
peer's pinned client certificate, and only for the API surfaces and /peer/ routes, never the admin API.
"""

from __future__ import annotations

import contextlib
import ssl
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from app.core.errors import (
    BadRequestError,
    ModelNotFoundError,
    PeerNotTrustedError,
    PeerUnavailableError,
)
from app.lanes.peers import identity
from app.lanes.peers.registry import KEY_PREFIX, LINK_PATH, PAIR_PATH, Listening, PeerRegistry
from app.lanes.peers.store import PeerSpec
from app.server.auth import is_admin
from app.server.keys import RUNTIME
from app.server.middleware import Handler
from app.server.request_keys import CLIENT
from app.server.surfaces.base import encoding_of
from app.server.surfaces.openai.validate import parse_body

TAG = "Admin"  # the OpenAPI tag of its routes
PEERS: web.AppKey[PeerRegistry] = web.AppKey("peers", PeerRegistry)
PEER: web.RequestKey[PeerSpec] = web.RequestKey("peer", PeerSpec)
routes = web.RouteTableDef()


def setup(app: web.Application) -> None:
    """The peers' owner (after the Runtime's remotes), the trust check, and the routes."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        rt = app[RUNTIME]
        async with PeerRegistry(rt.paths, bus=rt.bus, remotes=rt.remotes) as peers:
            app[PEERS] = peers
            yield

    app.cleanup_ctx.append(ctx)
    app.middlewares.append(pinned_peers)
    app.add_routes(routes)


def arm(app: web.Application, *, cert_pem: str, ctx: ssl.SSLContext, host: str, port: int) -> None:
    """Once the TLS site listens: peers' client certificates are trusted on `ctx`, pairing can begin."""
    app[PEERS].arm(Listening(server_pem=cert_pem, ctx=ctx, host=host, port=port))


def disarm(app: web.Application) -> None:
    """The TLS site stopped (the window's Stop): pairing waits for the next TLS start."""
    if PEERS in app:
        app[PEERS].disarm()


@web.middleware
async def pinned_peers(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A peer's key counts only with that peer's certificate on this very connection. Unpairing
    (DELETE /peer/link) needs only the pinned certificate: a peer whose key was lost (kept in memory
    where no keyring exists, then restarted) can still be forgotten here."""
    client = request.get(CLIENT)
    peer_route = request.path.startswith("/peer/") and request.path != PAIR_PATH
    if not (peer_route or (client and client.startswith(KEY_PREFIX))):
        return await handler(request)
    peers = request.app[PEERS]
    ssl_object = request.transport.get_extra_info("ssl_object") if request.transport else None
    seen = identity.peer_fingerprint(ssl_object)
    if client and client.startswith(KEY_PREFIX):
        spec = peers.peer_of_key(client)
    elif request.path == LINK_PATH and request.method == "DELETE":
        spec = peers.peer_of_certificate(seen)
    else:
        spec = None
    problem = None
    if spec is None:
        problem = "this route is for paired peers only (send the key this machine issued at pairing)"
    elif seen != spec.client_fingerprint:
        problem = (
            f"the key of peer {spec.name!r} came without that peer's pinned client certificate; a peer's key "
            "works only on its own mutual-TLS link (pair again if its certificate changed)"
        )
    elif is_admin(request):
        problem = "a peer may use the model APIs and /peer/ routes, not this machine's admin API"
    if problem is not None:
        return encoding_of(request).error_response(PeerNotTrustedError(problem))
    assert spec is not None
    request[PEER] = spec
    return await handler(request)


# ---- this machine's admin API -----------------------------------------------------------------------------
@routes.get("/api/peers")
async def list_peers(request: web.Request) -> web.Response:
    """The paired peers (address, pinned fingerprints, state, models) and whether pairing is open or locked"""
    return web.json_response(request.app[PEERS].public())


@routes.post("/api/peers/invite")
async def invite(request: web.Request) -> web.Response:
    """A one-time pairing code with this server's addresses and certificate fingerprint (needs TLS)"""
    return web.json_response(request.app[PEERS].invite(), headers={"Cache-Control": "no-store"})


@routes.post("/api/peers")
async def add_peer(request: web.Request) -> web.Response:
    """Pair with another machine: {"address": "HOST:PORT", "code": "XXXXX-XXXXX", "name"?, "fingerprint"?}"""
    body = parse_body(await request.read())
    address, code = body.get("address"), body.get("code")
    name, fp = body.get("name"), body.get("fingerprint")
    if not isinstance(address, str) or not isinstance(code, str):
        raise BadRequestError('send {"address": "HOST:PORT", "code": "XXXXX-XXXXX"}', param="address")
    if not isinstance(name, str | None) or not isinstance(fp, str | None):
        raise BadRequestError("'name' and 'fingerprint' must be text when given", param="name")
    peers = request.app[PEERS]
    spec, _ = await peers.pair(address, code, name=name, fingerprint=fp)
    return web.json_response(peers.describe(spec), status=201)


@routes.get("/api/peers/{name}")
async def get_peer(request: web.Request) -> web.Response:
    """One peer, as of its last check"""
    peers = request.app[PEERS]
    return web.json_response(peers.describe(peers.get(request.match_info["name"])))


@routes.post("/api/peers/{name}/check")
async def check_peer(request: web.Request) -> web.Response:
    """Check a peer now: its health, its own hardware probe and its models"""
    return web.json_response(await request.app[PEERS].check(request.match_info["name"]))


@routes.delete("/api/peers/{name}")
async def remove_peer(request: web.Request) -> web.Response:
    """Unpair: its models leave at once, its key and certificate are no longer accepted, it is told"""
    gone = await request.app[PEERS].remove(request.match_info["name"])
    return web.json_response({"name": gone.name, "removed": True})


# ---- what peers call ------------------------------------------------------------------------------------
@routes.post(PAIR_PATH)
async def pair(request: web.Request) -> web.Response:
    """Redeem a pairing code (another machine's `switchyard peers add`); wrong codes lock pairing"""
    body = parse_body(await request.read())
    answer = await request.app[PEERS].accept(body, remote_addr=request.remote)
    return web.json_response(answer, headers={"Cache-Control": "no-store"})


@routes.get("/peer/info")
async def peer_info(request: web.Request) -> web.Response:
    """For a paired peer: this machine's hardware probe and its models"""
    rt = request.app[RUNTIME]
    hw = await rt.hardware_now()
    models = [{"id": e.id, "kind": e.kind} for e in rt.catalog.servable()]
    return web.json_response({"hardware": hw.public(), "models": models})


@routes.get("/peer/explain/{model_id:.+}")
async def peer_explain(request: web.Request) -> web.Response:
    """For a paired peer: how this machine would run one of its models (decision and memory plan)"""
    found = await request.app[RUNTIME].explain(request.match_info["model_id"])
    return web.json_response(found.public())


async def explained_on_peer(request: web.Request, model: str) -> dict[str, Any] | None:
    """`explain PEER/MODEL`: the peer's own decision and plan on its own memory, said to run there; None
    when `model` is no peer's (a local model of the same id wins, as it does for requests)."""
    rt = request.app[RUNTIME]
    name, sep, upstream = model.partition("/")
    peers = request.app.get(PEERS)
    if peers is None or not sep or rt.catalog.find(model) is not None or name not in rt.remotes.attached:
        return None
    url = peers.get(name).url
    try:
        doc = await peers.ask(name, "GET", f"/peer/explain/{urllib.parse.quote(upstream, safe='/')}")
    except PeerUnavailableError as exc:
        if "HTTP 404" in exc.message:
            raise ModelNotFoundError(
                f"peer {name!r} has no model {upstream!r}; see GET /v1/models for what it serves"
            ) from exc
        raise
    why = (
        f"runs on peer {name!r} ({url}), another machine paired with this one: {upstream!r} is in its "
        "library, not this machine's; requests are passed to it over the pinned TLS link, and the plan "
        f"below is {name!r}'s own, on its memory"
    )
    return {
        **doc,
        "model": model,
        "machine": {"peer": name, "url": url, "why": why},
        "decision_text": f"{why}\n{doc.get('decision_text', '')}",
    }


@routes.delete(LINK_PATH)
async def unlink(request: web.Request) -> web.Response:
    """A peer that unpaired: forget it here too"""
    spec = request[PEER]
    with contextlib.suppress(Exception):
        await request.app[PEERS].remove(spec.name, tell=False)
    return web.json_response({"name": spec.name, "removed": True})
