"""Admin API for engines in their own environments: list, install, update, pin, roll back, remove.

Installs run as jobs of the server (app/lanes/install/jobs.py): the POST answers 202 with the job, and
pip's output follows as `engine.progress` server-sent events on GET /api/engines/events. Engine ids
from a request are checked against the manifest before they name a folder.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from app.core.errors import BadRequestError, EngineJobNotFoundError
from app.lanes.install import engine as engine_install
from app.lanes.install.listing import engine_rows
from app.lanes.install.store import EngineState, spec_for
from app.runtime import Runtime
from app.server.admin.events import event_stream
from app.server.keys import RUNTIME
from app.server.surfaces.openai.validate import parse_body

TAG = "Engines"  # the OpenAPI tag of its routes
routes = web.RouteTableDef()


async def _rows(rt: Runtime) -> list[dict[str, Any]]:
    return await asyncio.to_thread(engine_rows, rt.settings, rt.hardware, store=rt.engines.store)


def _version(body: dict[str, Any]) -> str | None:
    value = body.get("version")
    if value is not None and not isinstance(value, str):
        raise BadRequestError("'version' must be a string such as \"1.8.0\", or null", param="version")
    return value or None


def _build(body: dict[str, Any]) -> str | None:
    """`build` of an install or update body (the engines' check names the valid ones); None: the probe's."""
    value = body.get("build")
    if value is not None and not isinstance(value, str):
        raise BadRequestError("'build' must be a string such as \"cuda12\", or null", param="build")
    return value.strip() if value else None


async def _body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    return parse_body(raw) if raw.strip() else {}


@routes.get("/api/engines")
async def listing(request: web.Request) -> web.Response:
    """Every engine: installed version and where, pinned version, previous version, health"""
    rt = request.app[RUNTIME]
    jobs = [j.public() for j in rt.engines.all()]
    return web.json_response({"engines": await _rows(rt), "jobs": jobs})


@routes.get("/api/engines/events")
async def events(request: web.Request) -> web.StreamResponse:
    """Server-sent events: a `snapshot` of the engines and jobs first, then every `engine.*` event."""
    rt = request.app[RUNTIME]

    async def snapshot() -> dict[str, Any]:
        return {"engines": await _rows(rt), "jobs": [j.public() for j in rt.engines.all()]}

    return await event_stream(
        request, bus=rt.bus, snapshot=snapshot, keep=lambda ev: ev.kind.startswith("engine.")
    )


@routes.get("/api/engines/jobs/{job_id}")
async def job(request: web.Request) -> web.Response:
    """One install job: running, done (with the result) or failed (with pip's error)"""
    found = request.app[RUNTIME].engines.get(request.match_info["job_id"])
    if found is None:
        raise EngineJobNotFoundError(
            f"no engine job {request.match_info['job_id']!r}; GET /api/engines lists them"
        )
    return web.json_response(found.public())


@routes.post("/api/engines/update")
async def update_all(request: web.Request) -> web.Response:
    """Update every engine installed in its own environment to its pinned version (a job each)"""
    jobs = request.app[RUNTIME].engines.update_all()
    return web.json_response({"jobs": [j.public() for j in jobs]}, status=202 if jobs else 200)


@routes.post("/api/engines/{engine}/install")
async def install(request: web.Request) -> web.Response:
    """Install an engine into its own environment: {"version"?, "build"?}; 202 with the job (default: the
    pin, and the build the hardware probe chooses; a build the engine lacks is a 400 naming its builds)."""
    engine = request.match_info["engine"]
    body = await _body(request)
    started = request.app[RUNTIME].engines.start(engine, version=_version(body), build=_build(body))
    return web.json_response(started.public(), status=202)


@routes.post("/api/engines/{engine}/update")
async def update(request: web.Request) -> web.Response:
    """Install the pinned version where the current one differs in version or build ({"build"?}, else
    the probe's): 202 with the job, or 200 `up_to_date`."""
    rt = request.app[RUNTIME]
    engine = request.match_info["engine"]
    build = _build(await _body(request))
    spec = spec_for(engine)
    state = rt.engines.store.read(engine)
    # plan() may probe the GPUs (no snapshot yet): off the event loop
    want = await asyncio.to_thread(engine_install.plan, spec, state, build=build, hardware=rt.hardware)
    if state.current is not None and (state.current.version, state.current.build) == (
        want.version,
        want.build,
    ):
        return web.json_response(
            {"status": "up_to_date", "engine": engine, "version": want.version, "build": want.build}
        )
    started = rt.engines.start(engine, build=build, action="update")
    return web.json_response({"status": "queued", "job": started.public()}, status=202)


@routes.post("/api/engines/{engine}/pin")
async def pin(request: web.Request) -> web.Response:
    """Record the version install and update use: {"version": "1.7.0"}, or {"version": null} to clear."""
    rt = request.app[RUNTIME]
    body = parse_body(await request.read())
    if "version" not in body:
        raise BadRequestError(
            'send {"version": "1.7.0"}, or {"version": null} to clear the pin', param="version"
        )
    state = engine_install.pin(
        request.match_info["engine"], _version(body), store=rt.engines.store, bus=rt.bus
    )
    return web.json_response(state.public())


@routes.post("/api/engines/{engine}/rollback")
async def rollback(request: web.Request) -> web.Response:
    """Make the previous version current again (running lanes keep theirs until they restart)."""
    rt = request.app[RUNTIME]
    state = engine_install.rollback(request.match_info["engine"], store=rt.engines.store, bus=rt.bus)
    return web.json_response(state.public())


@routes.delete("/api/engines/{engine}")
async def remove(request: web.Request) -> web.Response:
    """Delete an engine's environments and pin; 409 while a lane runs from it or an install is running."""
    rt = request.app[RUNTIME]
    engine = request.match_info["engine"]
    gone = await asyncio.to_thread(engine_install.remove, engine, store=rt.engines.store)  # rmtree
    engine_install.announce(rt.bus, engine, "remove", EngineState())
    return web.json_response({"engine": engine, "removed": gone})
