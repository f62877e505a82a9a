"""OpenAI-compatible routes: /v1/models, chat, completions, embeddings."""

from __future__ import annotations

from aiohttp import web

from app.lanes.lane import LaneState
from app.lanes.lane_requests import adapter_ids
from app.lanes.remote.lane import INSTANCE_HEADER
from app.server.gateway.model_limits import LISTING_BUDGET_S, limits_of, plan_for_listing
from app.server.gateway.proxy import forward
from app.server.keys import GATEWAY, RUNTIME

routes = web.RouteTableDef()


@routes.get("/v1/models")
async def list_models(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    lanes = rt.supervisor.lanes
    slots = request.app[GATEWAY].planned
    entries = [e for e in rt.catalog.listing() if e.ok]
    unloaded = [e for e in entries if e.id not in lanes or lanes[e.id].state is not LaneState.READY]
    await plan_for_listing(slots, unloaded, budget_s=LISTING_BUDGET_S)
    data = []
    for e in entries:
        lane = lanes.get(e.id) or lanes.get(
            getattr(rt.catalog.find(e.id), "id", e.id)
        )  # an alias: its model's
        data.append(
            {
                "id": e.id,
                "object": "model",
                "created": int(e.path.stat().st_mtime) if e.path.exists() else 0,
                "owned_by": "switchyard",
                "kind": e.kind,
                "capabilities": sorted(rt.supervisor.capabilities(e)),
                "loaded": lane is not None and lane.state is LaneState.READY,
                "state": str(lane.state) if lane else "stopped",
            }
        )
        if (limits := limits_of(rt, e, lane, slots=slots)) is not None:
            data[-1].update(limits)
            for aid in adapter_ids(e.id, rt.settings):  # BASE+ADAPTER: the base's lane, its adapter on
                data.append({**data[-1], "id": aid, "base": e.id, "adapter": aid.rpartition("+")[2]})
    local = {d["id"] for d in data}
    for m in rt.remotes.listing():  # NAME/MODEL of each remote; a local model of the same id wins
        if m["id"] not in local:
            data.append(_remote_model(m))
    # this server's id: a remote registered with this server's own URL is told apart by it (defect: loops)
    headers = {INSTANCE_HEADER: rt.remotes.instance}
    return web.json_response({"object": "list", "data": data}, headers=headers)


def _remote_model(m: dict[str, str]) -> dict[str, object]:
    return {
        "id": m["id"],
        "object": "model",
        "created": 0,
        "owned_by": f"remote:{m['remote']}",
        "kind": m["kind"],
        "loaded": m["state"] == "ready",
        "state": m["state"],
        "remote": m["remote"],
    }


@routes.get("/v1/models/{model_id:.+}")
async def get_model(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    mid = request.match_info["model_id"]
    if rt.catalog.find(mid) is None and rt.remotes.resolve(mid) is not None:
        for m in rt.remotes.listing():
            if m["id"] == mid:
                return web.json_response(_remote_model(m))
    e = rt.catalog.get(mid)
    return web.json_response(
        {
            "id": e.id,
            "object": "model",
            "created": int(e.path.stat().st_mtime),
            "owned_by": "switchyard",
            "kind": e.kind,
        }
    )


@routes.post("/v1/chat/completions")
async def chat(request: web.Request) -> web.StreamResponse:
    return await forward(request, route="chat", path="/v1/chat/completions")


@routes.post("/v1/completions")
async def completions(request: web.Request) -> web.StreamResponse:
    return await forward(request, route="completions", path="/v1/completions")


@routes.post("/v1/embeddings")
async def embeddings(request: web.Request) -> web.StreamResponse:
    return await forward(request, route="embeddings", path="/v1/embeddings")
