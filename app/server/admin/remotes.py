"""/api/remotes: register, list, check and remove remote lanes (admin API: this machine only by default).

A key given here is kept by this server (the keyring, or its memory where no keyring exists) and is never
part of any answer: a remote shows only whether it has a key and where it came from.
"""

from __future__ import annotations

from aiohttp import web

from app.core.errors import BadRequestError
from app.core.secrets import Secret
from app.server.keys import RUNTIME
from app.server.surfaces.openai.validate import parse_body

TAG = "Admin"  # the OpenAPI tag of its routes
routes = web.RouteTableDef()


@routes.get("/api/remotes")
async def list_remotes(request: web.Request) -> web.Response:
    """The remotes: URL, state (checking, ready, unreachable, unauthorized), models, key source; no key"""
    return web.json_response({"remotes": request.app[RUNTIME].remotes.public()})


@routes.post("/api/remotes")
async def add_remote(request: web.Request) -> web.Response:
    """Register a remote: {"name", "url" (…/v1), "api_key"?, "models"?: [...]}; it is checked at once"""
    body = parse_body(await request.read())
    name, url, key, models = body.get("name"), body.get("url"), body.get("api_key"), body.get("models", [])
    if not isinstance(name, str) or not isinstance(url, str):
        raise BadRequestError('send {"name": "...", "url": "http://host:port/v1"}', param="name")
    if key is not None and (not isinstance(key, str) or not key.strip() or not key.strip().isprintable()):
        raise BadRequestError("'api_key' must be the key itself: printable, not empty", param="api_key")
    if not isinstance(models, list) or not all(isinstance(m, str) and m.strip() for m in models):
        raise BadRequestError("'models' must be a list of model names the remote serves", param="models")
    secret = Secret(key.strip()) if isinstance(key, str) else None
    remote, notes = await request.app[RUNTIME].remotes.add(name, url, key=secret, models=tuple(models))
    return web.json_response({**remote.public(), "notes": notes}, status=201)


@routes.get("/api/remotes/{name}")
async def get_remote(request: web.Request) -> web.Response:
    """One remote, as of its last check"""
    return web.json_response(request.app[RUNTIME].remotes.get(request.match_info["name"]).public())


@routes.post("/api/remotes/{name}/check")
async def check_remote(request: web.Request) -> web.Response:
    """Check a remote now (GET its /models with its key) and answer its state"""
    remote = await request.app[RUNTIME].remotes.check(request.match_info["name"])
    return web.json_response(remote.public())


@routes.delete("/api/remotes/{name}")
async def remove_remote(request: web.Request) -> web.Response:
    """Remove a remote and its key (keyring and memory); requests in flight finish"""
    gone = await request.app[RUNTIME].remotes.remove(request.match_info["name"])
    return web.json_response({"name": gone.name, "removed": True})
