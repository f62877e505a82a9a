"""Admin API for the library: list, one model, import, remove (refused while a lane has the model loaded).

Ids from a request are only looked up in the catalog, never joined onto a path; an import's id is checked
(app.library.importer.check_id) before it names a folder, and `rm` deletes only files the library recorded,
each checked to lie inside its root.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from aiohttp import web

from app.core.errors import BadRequestError, ModelInUseError, ModelNotFoundError
from app.lanes.lane import LaneState
from app.library.importer import import_model
from app.library.listing import listing
from app.library.remove import remove_model
from app.runtime import Runtime
from app.server.gateway.request_input import path_text, query_flag
from app.server.keys import RUNTIME
from app.server.request_keys import MODEL
from app.server.surfaces.openai.validate import parse_body

TAG = "Library"  # the OpenAPI tag of its routes
routes = web.RouteTableDef()
_LOADED = (LaneState.STARTING, LaneState.READY, LaneState.STOPPING)


def _one(rt: Runtime, model_id: str) -> dict[str, object]:
    entry = rt.catalog.get(model_id, allow_broken=True)
    for doc in listing(rt.library, rt.catalog, rt.settings):
        if doc["id"] == entry.id:
            return doc
    raise ModelNotFoundError(f"model {model_id!r} is not in the library", param="model")


@routes.get("/api/library")
async def library_list(request: web.Request) -> web.Response:
    """Every model in the library, with its files (size, sha256), origin, source and times"""
    rt = request.app[RUNTIME]
    return web.json_response(
        {
            "library": str(rt.library.path),
            "dirs": [str(d) for d in rt.catalog.dirs],
            "hf_cache": str(rt.catalog.hf_cache),
            "models": listing(rt.library, rt.catalog, rt.settings),
        }
    )


@routes.post("/api/library/import")
async def library_import(request: web.Request) -> web.Response:
    """Import a local model file or folder: `{"path", "link": false, "name": null}`; copied unless `link`"""
    rt = request.app[RUNTIME]
    body = parse_body(await request.read())
    if not isinstance(body.get("path"), str) or not body["path"]:
        raise BadRequestError(
            "send a JSON object with 'path' (a model file or folder on this machine)", param="path"
        )
    path_text(body, "path")
    link, name = body.get("link", False), body.get("name")
    if not isinstance(link, bool) or not (name is None or isinstance(name, str)):
        raise BadRequestError("'link' must be true or false and 'name' a string", param="link")
    entry = await asyncio.to_thread(
        import_model,
        Path(body["path"]),
        catalog=rt.catalog,
        library=rt.library,
        imported_root=rt.paths.imported,
        link=link,
        name=name,
    )
    return web.json_response(_one(rt, entry.id), status=201)


@routes.get("/api/library/{model_id:.+}")
async def library_model(request: web.Request) -> web.Response:
    """One model of the library (an id or an `org/repo:QUANT` alias), with its files and origin"""
    request[MODEL] = request.match_info["model_id"]
    return web.json_response(_one(request.app[RUNTIME], request.match_info["model_id"]))


@routes.delete("/api/library/{model_id:.+}")
async def library_remove(request: web.Request) -> web.Response:
    """Remove a model (409 naming the lane while loaded); `?delete_files=true` also for the user's files"""
    rt = request.app[RUNTIME]
    model_id = request.match_info["model_id"]
    request[MODEL] = model_id
    delete_files = query_flag(request, "delete_files", default=False)
    entry = rt.catalog.get(model_id, allow_broken=True)
    for lane in rt.supervisor.lanes.values():
        if lane.model_id == entry.id and (lane.state in _LOADED or lane.in_flight > 0):
            raise ModelInUseError(
                f"model {entry.id!r} is loaded in lane {lane.id!r} ({lane.state}); unload it first "
                f"(`switchyard unload {entry.id}` or POST /api/models/{entry.id}/unload), then remove it",
                param="model",
            )
    done = await asyncio.to_thread(
        remove_model,
        entry.id,
        catalog=rt.catalog,
        library=rt.library,
        imported_root=rt.paths.imported,
        delete_files=delete_files,
    )
    await rt.forget_lane(entry.id)
    return web.json_response(done.public())
