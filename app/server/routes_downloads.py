"""Admin API for downloads: queue a pull, list, pause/resume/cancel, update/rollback, progress as SSE."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from app.core.errors import BadRequestError
from app.core.events import Event
from app.hub.download import DownloadManager
from app.hub.refs import split_ref
from app.server.keys import RUNTIME
from app.server.sse import event_stream
from app.server.validate import parse_body

routes = web.RouteTableDef()


def _manager(request: web.Request) -> DownloadManager:
    return request.app[RUNTIME].downloads


def _str(body: dict[str, Any], name: str, *, required: bool = False) -> str | None:
    value = body.get(name)
    if value is None or value == "":
        if required:
            raise BadRequestError(f"missing required field {name!r}", param=name)
        return None
    if not isinstance(value, str):
        raise BadRequestError(f"{name!r} must be a string", param=name)
    return value.strip()


@routes.post("/api/downloads")
async def create(request: web.Request) -> web.Response:
    """Queue a download: {repo, revision?, quant? | file?}; `repo` may carry the selector (`org/name:Q4_K_M`).

    Answers 202 with the job (an unfinished job for the same files is resumed and returned instead)."""
    body = parse_body(await request.read())
    repo, selector = split_ref(_str(body, "repo", required=True) or "")
    quant, file = _str(body, "quant"), _str(body, "file")
    if selector and not (quant or file):
        quant = selector
    job = await _manager(request).submit(repo, revision=_str(body, "revision"), quant=quant, file=file)
    return web.json_response(job.public(), status=202)


@routes.get("/api/downloads")
async def listing(request: web.Request) -> web.Response:
    """Every download this server knows: queued, running, paused, failed (finished ones are forgotten)."""
    return web.json_response({"downloads": [j.public() for j in _manager(request).all_jobs()]})


@routes.get("/api/downloads/events")
async def events(request: web.Request) -> web.StreamResponse:
    """Server-sent events: a `snapshot` of the downloads first, then every `download.*` event.

    `?id=JOB` follows one job only."""
    rt = request.app[RUNTIME]
    only = request.query.get("id")

    async def snapshot() -> dict[str, Any]:
        return {"downloads": [j.public() for j in rt.downloads.all_jobs() if only is None or j.id == only]}

    def keep(ev: Event) -> bool:
        return ev.kind.startswith("download.") and (only is None or ev.data.get("id") == only)

    return await event_stream(request, bus=rt.bus, snapshot=snapshot, keep=keep)


@routes.get("/api/downloads/{job_id}")
async def detail(request: web.Request) -> web.Response:
    return web.json_response(_manager(request).get(request.match_info["job_id"]).public())


@routes.post("/api/downloads/{job_id}/pause")
async def pause(request: web.Request) -> web.Response:
    """Stop fetching; the partial bytes stay for a resume."""
    return web.json_response(_manager(request).pause(request.match_info["job_id"]).public())


@routes.post("/api/downloads/{job_id}/resume")
async def resume(request: web.Request) -> web.Response:
    """Continue a paused or failed download from its partial bytes."""
    return web.json_response(_manager(request).resume(request.match_info["job_id"]).public())


@routes.delete("/api/downloads/{job_id}")
async def cancel(request: web.Request) -> web.Response:
    """Cancel a download and delete its partial bytes."""
    job = await _manager(request).cancel(request.match_info["job_id"])
    return web.json_response(job.public())


@routes.post("/api/hub/update")
async def update(request: web.Request) -> web.Response:
    """{repo, rollback?, revision?}: fetch what changed on the hub into a new snapshot and move the ref
    when verified (202 with the job, or 200 `up_to_date`); `rollback` points the ref back at once."""
    body = parse_body(await request.read())
    repo = _str(body, "repo", required=True) or ""
    revision = _str(body, "revision") or "main"
    rollback = body.get("rollback", False)
    if not isinstance(rollback, bool):
        raise BadRequestError("'rollback' must be true or false", param="rollback")
    mgr = _manager(request)
    if rollback:
        return web.json_response({"status": "rolled_back", **mgr.rollback(repo, revision=revision)})
    job = await mgr.update(repo, revision=revision)
    if job is None:
        return web.json_response({"status": "up_to_date", "repo": repo, "revision": revision})
    return web.json_response({"status": "queued", "job": job.public()}, status=202)
