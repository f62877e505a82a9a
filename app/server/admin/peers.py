"""/api/peers (this machine's admin API) and /peer/... (what paired peers call, over mutual TLS).

- GET /api/peers, POST /api/peers/invite, POST /api/peers (pair with {"address", "code", "name"?,
  "fingerprint"?}), GET|DELETE /api/peers/{name}, POST /api/peers/{name}/check, GET /api/peers/nearby
  (machines that announce themselves on mDNS: app/lanes/peers/nearby.py, announced from `arm`).
- POST /peer/pair: another machine redeeming a code (open: the code is its credential, and wrong codes
  lock pairing: app/lanes/peers/pairing.py). GET /peer/info and DELETE /peer/link: a paired peer only.

A key issued to a peer (keys.json, `peer.NAME`) is accepted only on a connection that presented that
peer's pinned client certificate, and only for the API surfaces and /peer/ routes, never the admin API.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from app.core.errors import (
    BadRequestError,
    ModelNotFoundError,
    PeerNotTrustedError,
    PeersNeedTLSError,
    PeerUnavailableError,
    SwitchyardError,
)
from app.fit import lend
from app.lanes.lane_machine import LaneState
from app.lanes.peers import identity, multihead, nearby, nodes, rpc, split
from app.lanes.peers.placement import Placer
from app.lanes.peers.registry import (
    KEY_PREFIX,
    LINK_PATH,
    PAIR_PATH,
    Listening,
    PeerRegistry,
    split_address,
)
from app.lanes.peers.store import PeerSpec
from app.server.auth import is_admin, is_loopback
from app.server.keys import GATEWAY, RUNTIME
from app.server.middleware import Handler
from app.server.request_keys import CLIENT
from app.server.surfaces.base import encoding_of
from app.server.surfaces.openai.validate import parse_body

TAG = "Admin"  # the OpenAPI tag of its routes
PEERS: web.AppKey[PeerRegistry] = web.AppKey("peers", PeerRegistry)
PEER: web.RequestKey[PeerSpec] = web.RequestKey("peer", PeerSpec)
SPLITS: web.AppKey[split.SplitBroker] = web.AppKey("splits", split.SplitBroker)
NODES: web.AppKey[multihead.NodeBroker] = web.AppKey("nodes", multihead.NodeBroker)
ANNOUNCER: web.AppKey[nearby.Announcer] = web.AppKey("peers_announcer", nearby.Announcer)
routes = web.RouteTableDef()


def setup(app: web.Application) -> None:
    """The peers' owner (after the Runtime's remotes), the trust check, and the routes."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        rt = app[RUNTIME]
        async with PeerRegistry(rt.paths, bus=rt.bus, remotes=rt.remotes) as peers:
            app[PEERS] = peers

            def in_flight(model_id: str) -> int:
                lane = rt.supervisor.lanes.get(model_id)
                return lane.in_flight if lane is not None else 0

            def report(model_id: str, why: str) -> None:
                lane = rt.supervisor.lanes.get(model_id)
                if lane is not None:  # the lane kills its head, fails the requests naming `why`, restarts
                    lane.unresponsive(f"lost its split: {why}")

            broker = split.SplitBroker(peers, in_flight=in_flight, unload=rt.supervisor.unload, report=report)
            broker.register()
            app[SPLITS] = broker

            def alive(model_id: str) -> bool:
                lane = rt.supervisor.lanes.get(model_id)
                return lane is not None and lane.state in (LaneState.STARTING, LaneState.READY)

            def lost_part(model_id: str, why: str) -> None:
                lane = rt.supervisor.lanes.get(model_id)
                if lane is not None:
                    lane.unresponsive(f"lost a machine: {why}")

            heads = multihead.NodeBroker(peers, alive=alive, unload=rt.supervisor.unload, report=lost_part)
            heads.register()
            app[NODES] = heads
            placing = app[GATEWAY].placing if GATEWAY in app else None
            if placing is not None:  # a bare model id that cannot run here goes where it fits
                placing.placer = Placer(peers)
            try:
                yield
            finally:
                if placing is not None:
                    placing.placer = None
                await broker.close()  # its heads stopped first, then the tunnels and the peers' workers
                await heads.close()

    app.cleanup_ctx.append(ctx)
    app.cleanup_ctx.append(announcing)
    app.middlewares.append(pinned_peers)
    app.add_routes(routes)


async def announcing(app: web.Application) -> AsyncIterator[None]:
    """The mDNS responder's owner: its goodbyes go out when the server stops, whatever stopped it."""
    announcer = nearby.Announcer()
    app[ANNOUNCER] = announcer
    yield
    await announcer.aclose()


def arm(app: web.Application, *, cert_pem: str, ctx: ssl.SSLContext, host: str, port: int) -> None:
    """Once the TLS site listens: peers' client certificates are trusted on `ctx`, pairing can begin, and
    the machine is announced on mDNS when `peers_announce` wants it."""
    peers = app[PEERS]
    peers.arm(Listening(server_pem=cert_pem, ctx=ctx, host=host, port=port))
    if announce_wanted(app[RUNTIME].settings.server.peers_announce, host=host):
        hosts = tuple(split_address(a)[0] for a in peers.addresses())
        app[ANNOUNCER].announce(
            nearby.Announcement(
                machine=socket.gethostname(),
                hosts=hosts,
                port=port,
                fingerprint=identity.fingerprint(cert_pem.encode()),
                everywhere=host in ("", "0.0.0.0", "::"),
            )
        )


def disarm(app: web.Application) -> None:
    """The TLS site stopped (the window's Stop): pairing waits for the next TLS start, unannounced."""
    if PEERS in app:
        app[PEERS].disarm()
    if ANNOUNCER in app:
        app[ANNOUNCER].withdraw()


def announce_wanted(mode: str, *, host: str) -> bool:
    """`peers_announce`: auto announces only a server others can dial (bound beyond loopback)."""
    return mode == "on" or (mode == "auto" and not is_loopback(host))


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


@routes.get("/api/peers/nearby")  # before /api/peers/{name}, which would take the word as a name
async def nearby_peers(request: web.Request) -> web.Response:
    """Machines nearby that announce Switchyard on mDNS (?seconds=1-10, default 3): each with the peer it is
    paired as, or the `peers add` line to type (a hint: pairing still needs their code and checks their
    certificate against the announced fingerprint)"""
    peers = request.app[PEERS]
    if peers.listening is None:
        raise PeersNeedTLSError(
            "looking for machines nearby is for pairing, which needs this server to serve TLS: start it with "
            "`switchyard serve --tls --host 0.0.0.0` (or, in the window, the Server page's network switch)"
        )
    seconds = _seconds(request.query.get("seconds"))
    try:
        machines = await nearby.around(peers, seconds=seconds)
    except OSError as exc:
        raise PeerUnavailableError(
            f"cannot listen for mDNS announcements here ({exc}); type the address `switchyard peers "
            "invite` shows on the other machine instead"
        ) from exc
    return web.json_response(
        {
            "machines": machines,
            "seconds": seconds,
            "this_machine": request.app[ANNOUNCER].public(),
        }
    )


def _seconds(raw: str | None) -> float:
    if raw is None:
        return nearby.BROWSE_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 1 <= value <= 10:  # also refuses nan and inf
        raise BadRequestError("seconds must be a number from 1 to 10 (how long to listen)", param="seconds")
    return value


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
    # the folder too: a multi-node head plans each machine's part on that machine's own copy
    models = [{"id": e.id, "kind": e.kind, "path": str(e.path)} for e in rt.catalog.servable()]
    offer = await asyncio.to_thread(request.app[PEERS].workers.offer)
    if offer.get("available"):  # what a split may place here: never more than this machine lends
        offer["budget_bytes"] = lend.lend_budget(rt.settings, hw)
    return web.json_response({"hardware": hw.public(), "models": models, "rpc": offer})


@routes.get("/api/splits")
async def list_splits(request: web.Request) -> web.Response:
    """The split lanes this machine heads (each worker's tunnel and the plan) and the RPC workers it lends"""
    peers = request.app[PEERS]
    heads = request.app[SPLITS].public() if SPLITS in request.app else []
    return web.json_response({"heads": heads, "workers": peers.workers.public()})


@routes.post(split.WORKER_PATH)
async def rpc_start(request: web.Request) -> web.Response:
    """For a paired peer: a fresh llama.cpp RPC worker on this machine's loopback, for its split lane"""
    # the `threads` setting counts for a lent worker as for any engine of this machine's
    threads = request.app[RUNTIME].settings.models.threads
    worker = await request.app[PEERS].workers.start(request[PEER].name, threads=threads)
    return web.json_response(worker.public())


@routes.get(split.WORKER_PATH + "/{worker_id}/link")
async def rpc_link(request: web.Request) -> web.StreamResponse:
    """For a paired peer: the WebSocket that carries one RPC connection to its worker (the only way in)"""
    worker = request.app[PEERS].workers.get(request.match_info["worker_id"], peer=request[PEER].name)
    # no permessage-deflate even if offered: RPC payloads are mostly weights, which do not compress
    ws = web.WebSocketResponse(max_msg_size=0, heartbeat=split.HEARTBEAT_S, compress=False)
    await ws.prepare(request)
    await rpc.bridge(worker, ws)
    return ws


@routes.delete(split.WORKER_PATH + "/{worker_id}")
async def rpc_stop(request: web.Request) -> web.Response:
    """For a paired peer: stop the RPC worker it started here"""
    return await _stop_lent(request, request.app[PEERS].workers.stop, request.match_info["worker_id"])


async def _stop_lent(request: web.Request, stop: Any, lent_id: str) -> web.Response:
    """Stop what a paired peer started here (an RPC worker, a node part), only if that peer started it."""
    await stop(lent_id, peer=request[PEER].name)
    return web.json_response({"id": lent_id, "stopped": True})


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


async def split_explained(request: web.Request, model: str, doc: dict[str, Any]) -> dict[str, Any]:
    """`explain MODEL --across PEERS` (the query's `across`): the split plan over this machine and those
    peers. Without it, a model that does not fit here is offered a split over every paired peer that
    lends an RPC worker, when that plan fits (with its numbers)."""
    rt = request.app[RUNTIME]
    peers = request.app.get(PEERS)
    entry = rt.catalog.find(model)
    broker = request.app.get(SPLITS)
    across = [n.strip() for n in request.query.get("across", "").split(",") if n.strip()]
    if (
        peers is not None
        and entry is not None
        and across
        and entry.format == "safetensors"
        and NODES in request.app
    ):
        return await multinode_explained(request, entry, doc, across)
    if peers is None or broker is None or entry is None or entry.format != "gguf":
        return doc
    asked = bool(across)
    hardware = await rt.hardware_now()
    if not asked:
        if not lend.beyond(doc.get("fit"), lend.lend_budget(rt.settings, hardware)):
            return doc
        across = [s.name for s in peers.store.specs() if s.name in rt.remotes.attached]
        if not across:
            return doc
    try:
        plan = await split.plan_across(broker, entry, rt.settings, across, hardware=hardware)
    except SwitchyardError as exc:
        if asked:
            raise
        return {**doc, "split_offer": {"across": across, "refused": exc.message}}
    key = "split" if asked else "split_offer"
    if not asked and not plan.fits:
        return doc
    return {**doc, key: {"across": across, **plan.public()}}


@routes.post(nodes.NODE_PATH)
async def node_start(request: web.Request) -> web.Response:
    """For a paired peer: start this machine's part of its multi-node vLLM/SGLang model ({"launch": the
    NodeLaunch its head planned, "dry_run"?: true to get the exact program, environment and budget only);
    refused, every reason named, unless this machine trusts the link too, has the NVIDIA memory free, the
    engine and the model"""
    body = parse_body(await request.read())
    raw, dry = body.get("launch"), body.get("dry_run", False)
    if not isinstance(raw, dict) or not isinstance(dry, bool):
        raise BadRequestError('send {"launch": <a NodeLaunch>, "dry_run"?: true|false}', param="launch")
    launch = nodes.parse_launch(raw)
    rt = request.app[RUNTIME]
    library = {str(e.path) for e in rt.catalog.servable()}
    doc = await request.app[PEERS].nodes.start(
        request[PEER], launch, settings=rt.settings, library=library, dry=dry
    )
    return web.json_response(doc, status=200 if dry else 201)


@routes.get(nodes.NODE_PATH + "/{part_id}")
async def node_status(request: web.Request) -> web.Response:
    """For a paired peer: one part it started here (alive, exit code, its log's tail)"""
    part = request.app[PEERS].nodes.get(request.match_info["part_id"], peer=request[PEER].name)
    return web.json_response(part.public())


@routes.delete(nodes.NODE_PATH + "/{part_id}")
async def node_stop(request: web.Request) -> web.Response:
    """For a paired peer: stop a part it started here"""
    return await _stop_lent(request, request.app[PEERS].nodes.stop, request.match_info["part_id"])


@routes.get("/api/nodes")
async def list_nodes(request: web.Request) -> web.Response:
    """The multi-node models this machine heads (each peer's part, the plan) and the parts it runs for
    peers"""
    heads = request.app[NODES].public() if NODES in request.app else []
    return web.json_response({"heads": heads, "parts": request.app[PEERS].nodes.public()})


async def multinode_explained(
    request: web.Request, entry: Any, doc: dict[str, Any], across: list[str]
) -> dict[str, Any]:
    """`explain MODEL --across PEERS` for a safetensors model: the multi-node plan over this machine and
    those peers (each peer's own dry run of its part beside it), or every reason it cannot run."""
    rt = request.app[RUNTIME]
    chosen = (doc.get("decision") or {}).get("lane") if isinstance(doc.get("decision"), dict) else None
    engine = multihead.engine_for(chosen)
    out: dict[str, Any] = {"across": across, "engine": engine}
    try:
        plan = await request.app[NODES].plan(
            entry, rt.settings, across, engine=engine, hardware=await rt.hardware_now()
        )
    except SwitchyardError as exc:  # a MultiNodeRefused names every reason
        reasons = list(getattr(exc, "reasons", ()) or [exc.message])
        return {**doc, "multinode": {**out, "refused": exc.message, "reasons": reasons}}
    parts = await request.app[NODES].dry_runs(plan)
    return {**doc, "multinode": {**out, **plan.public(), "peers": parts}}


@routes.delete(LINK_PATH)
async def unlink(request: web.Request) -> web.Response:
    """A peer that unpaired: forget it here too"""
    spec = request[PEER]
    with contextlib.suppress(Exception):
        await request.app[PEERS].remove(spec.name, tell=False)
    return web.json_response({"name": spec.name, "removed": True})
