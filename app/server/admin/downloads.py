"""Admin API for downloads: queue a pull, list, pause/resume/cancel, update/rollback, progress as SSE."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from app.core.errors import BadRequestError
from app.core.events import Event
from app.hub.download import DownloadManager
from app.hub.refs import split_ref
from app.server.admin.events import event_stream, task_stream
from app.server.admin.jobs import JOBS, job_work
from app.server.admin.update_gate import Gate, GateConflictError, gated_models, updatable
from app.server.keys import RUNTIME
from app.server.surfaces.openai.validate import parse_body, text_field

TAG = "Downloads"  # the OpenAPI tag of its routes
routes = web.RouteTableDef()


def _manager(request: web.Request) -> DownloadManager:
    return request.app[RUNTIME].downloads


@routes.post("/api/downloads")
async def create(request: web.Request) -> web.Response:
    """Queue a download: {repo, revision?, quant? | file?, mmproj?}; `repo` may carry the selector
    (`org/name:Q4_K_M`); `mmproj` picks the vision projector pulled with a quantization ("none": none).

    Answers 202 with the job (an unfinished job for the same files is resumed and returned instead)."""
    body = parse_body(await request.read())
    repo, selector = split_ref(text_field(body, "repo", required=True) or "")
    quant, file = text_field(body, "quant"), text_field(body, "file")
    if selector and not (quant or file):
        quant = selector
    job = await _manager(request).submit(
        repo, revision=text_field(body, "revision"), quant=quant, file=file, mmproj=text_field(body, "mmproj")
    )
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
    repo = text_field(body, "repo", required=True) or ""
    revision = text_field(body, "revision") or "main"
    rollback = body.get("rollback", False)
    if not isinstance(rollback, bool):
        raise BadRequestError("'rollback' must be true or false", param="rollback")
    mgr = _manager(request)
    gated = gated_models(request.app[RUNTIME], repo)
    if gated and not rollback:
        raise GateConflictError(
            f"{', '.join(gated)} of {repo} has a standing gate: update it through POST /api/hub/gated-update "
            "(`switchyard update MODEL`), which scores the new revision before it becomes current",
            param="repo",
        )
    if rollback:
        return web.json_response({"status": "rolled_back", **mgr.rollback(repo, revision=revision)})
    job = await mgr.update(repo, revision=revision)
    if job is None:
        return web.json_response({"status": "up_to_date", "repo": repo, "revision": revision})
    return web.json_response({"status": "queued", "job": job.public()}, status=202)


@routes.post("/api/hub/gated-update")
async def gated_update_route(request: web.Request) -> web.StreamResponse:
    """{model, suite?, min_score?}: fetch the model's new revision beside the current one, score it with
    the suite (default: the model's standing gate), and make it current only if it reaches min_score.
    Server-sent events: `job`, one `case` per case, then `done` ({status: switched|kept|up_to_date})"""
    rt = request.app[RUNTIME]
    body = parse_body(await request.read())
    model = text_field(body, "model", required=True) or ""
    gate = Gate.of(rt, model, body)
    repo = await updatable(rt, model)  # 404 or 400 before the stream starts
    # the update runs as a job of the server, one per repository (a second one is a 409)
    request.app[JOBS].check_free(f"update:{repo}")
    return await task_stream(request, job_work(request, model=model, repo=repo, gate=gate))
