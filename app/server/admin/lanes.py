"""Admin API: health, library, lanes, logs, load/unload, and an event stream."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from app import __version__
from app.core.errors import ModelNotFoundError
from app.server.admin.events import event_stream
from app.server.admin.peers import explained_on_peer, split_explained
from app.server.admin.settings import lane_view, load_with_body
from app.server.gateway.request_input import parse_json_object, query_int
from app.server.keys import GATEWAY, RUNTIME
from app.server.request_keys import MODEL

TAG = "Admin"  # the OpenAPI tag of its routes
routes = web.RouteTableDef()


@routes.get("/health")
async def health(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    states = [ln.state for ln in rt.supervisor.lanes.values()]
    return web.json_response(
        {"status": "ok", "version": __version__, "lanes": {s: states.count(s) for s in set(states)}}
    )


@routes.get("/api/models")
async def library(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    return web.json_response(
        {"models": [e.public() for e in rt.catalog.scan()], "dirs": [str(d) for d in rt.catalog.dirs]}
    )


@routes.post("/api/models/{model_id:.+}/load")
async def load(request: web.Request) -> web.Response:
    """Load the model; a JSON body of model_overrides keys (ctx_size, parallel, kv_type, flash_attn,
    gpu_layers, speculative, lora) is taken first, restarting its lane if loaded, with the plan before
    and after in the answer."""
    rt = request.app[RUNTIME]
    model = request.match_info["model_id"]
    request[MODEL] = model
    raw = await request.read()
    if raw.strip():
        return web.json_response(await load_with_body(rt, model, parse_json_object(raw)))
    known = rt.supervisor.lanes.get(model)
    again = known is not None and known.available  # loaded already: asked again, it tests again
    if not again:  # its engine missing: installed as a job (auto_install_engines), 503 naming the job
        request.app[GATEWAY].first_use.refuse(await rt.catalog.aget(model))
    lane = await rt.supervisor.load(model)
    if again:
        rt.smoke.retest(lane.model_id)  # the smoke test (app/lanes/smoke.py) runs again, in the background
    return web.json_response(lane_view(lane, rt.settings))


@routes.post("/api/models/{model_id:.+}/unload")
async def unload(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    model = request.match_info["model_id"]
    request[MODEL] = model
    lane = await rt.supervisor.unload(model)
    return web.json_response(lane.snapshot())


@routes.get("/api/lanes")
async def lanes(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    views = {ln.id: lane_view(ln, rt.settings)["settings"] for ln in rt.supervisor.lanes.values()}
    rows = rt.supervisor.snapshot()
    for row in rows:  # each lane's effective values, under the load body's names
        row["settings"] = views.get(str(row.get("id")))
    return web.json_response({"lanes": rows})


@routes.get("/api/lanes/{lane_id:.+}/logs")
async def lane_logs(request: web.Request) -> web.Response:
    lane = request.app[RUNTIME].supervisor.get_lane(request.match_info["lane_id"])
    lines = query_int(request, "lines", default=200, high=1_000_000)
    return web.json_response({"lane": lane.id, "lines": lane.ring.tail(lines)})


@routes.get("/api/lanes/{lane_id:.+}")
async def lane_detail(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    lane = rt.supervisor.get_lane(request.match_info["lane_id"])
    view = lane_view(lane, rt.settings)
    llama = lane.plan is not None and lane.plan.llama_server  # llama-server's API has /slots
    if llama and view.get("state") == "ready" and view.get("port"):
        # whether speculation is on, per slot, from the engine's own /slots (its /props says "none")
        view["speculation"] = await request.app[GATEWAY].speculation(lane)
    return web.json_response(view)


@routes.get("/api/events")
async def events(request: web.Request) -> web.StreamResponse:
    """Server-sent events: a `snapshot` of the lanes first, then every event as it happens."""
    rt = request.app[RUNTIME]

    async def snapshot() -> dict[str, Any]:
        return {"lanes": rt.supervisor.snapshot()}

    return await event_stream(request, bus=rt.bus, snapshot=snapshot)


@routes.get("/api/models/{model_id:.+}/explain")
async def explain_model(request: web.Request) -> web.Response:
    """The routing decision and memory plan, beside what is loaded now (and its measured footprint)."""
    rt = request.app[RUNTIME]
    model = request.match_info["model_id"]
    request[MODEL] = model
    if (on_peer := await explained_on_peer(request, model)) is not None:  # PEER/MODEL: that machine's plan
        return web.json_response(on_peer)
    placing = request.app[GATEWAY].placing
    try:
        found = await rt.explain(model)
    except ModelNotFoundError:
        placed = await placing.place(model, None)  # not here: a paired peer that has it, where it fits
        on_peer = await explained_on_peer(request, placed.model_id) if placed is not None else None
        if placed is None or on_peer is None:
            raise
        return web.json_response({**on_peer, "model": model, "placed": placed.public()})
    doc = await split_explained(request, model, found.public())
    entry = rt.catalog.find(model)
    if entry is not None and (placed := await placing.place(model, entry)) is not None:
        # requests for it go to that peer (gateway/placing.py): say so first
        doc["placed"] = placed.public()
        doc["decision_text"] = f"runs on peer {placed.peer!r}: {placed.why}\n{doc.get('decision_text', '')}"
    return web.json_response(doc)


@routes.get("/api/hardware")
async def hardware(request: web.Request) -> web.Response:
    hw = await request.app[RUNTIME].hardware_now()
    return web.json_response(hw.public())
