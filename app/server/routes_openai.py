"""OpenAI-compatible routes: /v1/models, chat, completions, embeddings."""

from __future__ import annotations

from aiohttp import web

from app.lanes.lane import LaneState
from app.server.keys import RUNTIME
from app.server.proxy import forward

routes = web.RouteTableDef()


@routes.get("/v1/models")
async def list_models(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    lanes = rt.supervisor.lanes
    data = []
    for e in rt.catalog.scan():
        if not e.ok:
            continue
        lane = lanes.get(e.id)
        data.append(
            {
                "id": e.id,
                "object": "model",
                "created": int(e.path.stat().st_mtime) if e.path.exists() else 0,
                "owned_by": "switchyard",
                "kind": e.kind,
                "loaded": lane is not None and lane.state is LaneState.READY,
                "state": str(lane.state) if lane else "stopped",
            }
        )
    local = {d["id"] for d in data}
    for m in rt.remotes.listing():  # NAME/MODEL of each remote; a local model of the same id wins
        if m["id"] not in local:
            data.append(_remote_model(m))
    return web.json_response({"object": "list", "data": data})


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
