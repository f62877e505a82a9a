"""Admin API for jobs (docs/jobs.md): every download, engine install, update and eval run of this server.

GET /api/jobs lists them (newest first), POST /api/jobs starts one and answers 202 at once (what
`--detach` uses), GET /api/jobs/{id} reads one, DELETE /api/jobs/{id} cancels it where its kind allows,
and GET /api/jobs/{id}/events follows it as server-sent events until it ends. Update checks are
/api/updates; the webhooks' test is POST /api/notify/test.

`setup(app)` owns the registry, the adapters of the existing kinds, the update checker and the notifier
for as long as the app runs (after the Runtime has started, before it stops).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from app.core.background import running
from app.core.errors import BadRequestError, ConflictError, SwitchyardError
from app.core.events import Event, EventKind
from app.core.jobs import Job, JobHandle, JobKind, JobRegistry
from app.core.notify import NOTIFICATION_HEADER, Notifier
from app.hub.refs import split_ref
from app.hub.update_check import Pulled, UpdateChecker
from app.library.sources import CANDIDATE_SUFFIX
from app.quality.runner import http_ask, run_suite
from app.quality.score import Ask
from app.quality.store import CaseResult, EvalStore
from app.runtime import Runtime
from app.server.admin.evals import own_base_url, requested_suite
from app.server.admin.events import event_stream
from app.server.admin.job_sources import JobSources
from app.server.admin.update_gate import Emit, Gate, gated_models, gated_update_job, updatable
from app.server.auth import caller_key
from app.server.gateway.request_input import path_text
from app.server.keys import RUNTIME
from app.server.surfaces.openai.validate import parse_body, text_field

TAG = "Jobs"  # the OpenAPI tag of its routes
routes = web.RouteTableDef()
Work = Callable[[Emit], Coroutine[Any, Any, dict[str, Any]]]
JOBS: web.AppKey[JobRegistry] = web.AppKey("jobs", JobRegistry)
SOURCES: web.AppKey[JobSources] = web.AppKey("job_sources", JobSources)
UPDATES: web.AppKey[UpdateChecker] = web.AppKey("updates", UpdateChecker)
NOTIFIER: web.AppKey[Notifier] = web.AppKey("notifier", Notifier)
# what the notifier is fed: every kind but the per-request and periodic ones, which it never notifies
NOTIFIER_KINDS = frozenset(EventKind) - {
    EventKind.REQUEST_DONE,
    EventKind.HARDWARE_SAMPLE,
    EventKind.DOWNLOAD_PROGRESS,
    EventKind.ENGINE_PROGRESS,
    EventKind.JOB_PROGRESS,
}


def registry(app: web.Application) -> JobRegistry | None:
    """The app's job registry while it runs (None before its startup and after its cleanup): what the
    desktop's jobs panel reads, in the same process."""
    return app.get(JOBS)


def pulled_models(rt: Runtime) -> list[Pulled]:
    """Each model pulled from a hub, with the repository paths and sha256 of the files it uses."""
    out = []
    for e in rt.catalog.entries():
        o = e.origin
        if (
            e.id.endswith(CANDIDATE_SUFFIX)
            or o is None
            or not o.commit
            or e.source not in ("hf_cache", "download")
        ):
            continue
        files: dict[str, str | None] = {}
        for f in e.files:
            full = Path(e.location or e.path.parent, f.rel)
            try:
                rel = full.relative_to(o.snapshot).as_posix() if o.snapshot else f.rel
            except ValueError:
                rel = f.rel
            files[rel] = f.sha256
        out.append(Pulled(e.id, o.repo, o.revision or "main", o.commit, files))
    return out


def setup(app: web.Application) -> None:
    """Register the routes and the owner of the jobs' parts (added after the Runtime's own)."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        rt = app[RUNTIME]
        async with contextlib.AsyncExitStack() as stack:
            jobs = await stack.enter_async_context(
                JobRegistry(bus=rt.bus, state_file=rt.paths.home / "jobs.json")
            )
            sources = JobSources(rt, jobs)
            await stack.enter_async_context(sources.running())
            notifier = await stack.enter_async_context(Notifier(config=lambda: rt.settings.jobs.notify))
            checker = UpdateChecker(
                bus=rt.bus,
                state_file=rt.paths.home / "updates.json",
                config=rt.downloads.config,
                pulled=lambda: pulled_models(rt),
                interval_h=lambda: rt.settings.jobs.update_check_h,
            )
            await stack.enter_async_context(checker)
            await stack.enter_async_context(_feeding(rt, notifier))
            app[JOBS], app[SOURCES], app[UPDATES], app[NOTIFIER] = jobs, sources, checker, notifier
            yield

    app.cleanup_ctx.append(ctx)
    app.add_routes(routes)


@contextlib.asynccontextmanager
async def _feeding(rt: Runtime, notifier: Notifier) -> AsyncIterator[None]:
    """The bus's events to the notifier, while the server runs."""
    ready = asyncio.Event()

    async def follow() -> None:
        async with rt.bus.subscribe(NOTIFIER_KINDS) as q:
            ready.set()
            while True:
                notifier.observe(await q.get())

    async with running(follow(), name="notify feed"):
        await ready.wait()
        yield


def _job_id(request: web.Request) -> str:
    return request.match_info["job_id"]


@routes.get("/api/jobs")
async def jobs_list(request: web.Request) -> web.Response:
    """Every job this server knows, newest first: running ones and the recent finished ones"""
    return web.json_response({"jobs": [j.public() for j in request.app[JOBS].all()]})


@routes.get("/api/jobs/{job_id}")
async def jobs_one(request: web.Request) -> web.Response:
    """One job: its state, steps with progress, start and end, error or result"""
    return web.json_response(request.app[JOBS].get(_job_id(request)).public())


@routes.delete("/api/jobs/{job_id}")
async def jobs_cancel(request: web.Request) -> web.Response:
    """Cancel a job (downloads, updates and eval runs; an engine install runs to its end: 409)"""
    job = await request.app[JOBS].cancel(_job_id(request))
    return web.json_response(job.public())


@routes.get("/api/jobs/{job_id}/events")
async def jobs_events(request: web.Request) -> web.StreamResponse:
    """Server-sent events: the job as a `snapshot`, then its `job.*` events; the stream ends with it"""
    jobs = request.app[JOBS]
    job = jobs.get(_job_id(request))
    ends = {"job.completed", "job.failed", "job.cancelled"}

    async def snapshot() -> dict[str, Any]:
        return job.public()

    def keep(ev: Event) -> bool:
        return ev.kind.startswith("job.") and ev.data.get("id") == job.id

    def until(item: dict[str, Any] | Event) -> bool:
        return (
            item.kind in ends
            if isinstance(item, Event)
            else item["state"] in ("completed", "failed", "cancelled")
        )

    return await event_stream(
        request, bus=request.app[RUNTIME].bus, snapshot=snapshot, keep=keep, until=until
    )


@routes.post("/api/jobs")
async def jobs_start(request: web.Request) -> web.Response:
    """Start a job and answer 202 with it at once: {"kind": "download", "repo", "revision"?, "quant"?,
    "file"?, "mmproj"?} | {"kind": "update", "repo" | "model", "suite"?, "min_score"?} |
    {"kind": "engine_install", "engine", "version"?, "build"?} |
    {"kind": "eval", "model", "suite", "min_score"?}"""
    body = parse_body(await request.read())
    kind = body.get("kind")
    starters = {
        "download": _start_download,
        "update": _start_update,
        "engine_install": _start_engine,
        "eval": _start_eval,
    }
    if kind not in starters:
        raise BadRequestError(f"'kind' must be one of: {', '.join(starters)}", param="kind")
    job = await starters[kind](request, body)
    if job is None:
        return web.json_response({"status": "up_to_date", "job": None})
    return web.json_response({"status": "queued", "job": job.public()}, status=202)


async def _start_download(request: web.Request, body: dict[str, Any]) -> Job | None:
    repo, selector = split_ref(text_field(body, "repo", required=True) or "")
    quant, file = text_field(body, "quant"), text_field(body, "file")
    dl = await request.app[RUNTIME].downloads.submit(
        repo, revision=text_field(body, "revision"), quant=quant or (None if file else selector), file=file,
        mmproj=text_field(body, "mmproj"),
    )  # fmt: skip
    return request.app[SOURCES].adopt_download(dl)


async def _start_update(request: web.Request, body: dict[str, Any]) -> Job | None:
    rt = request.app[RUNTIME]
    model, repo = text_field(body, "model"), text_field(body, "repo")
    if model is not None:
        repo = await updatable(rt, model)
        if body.get("suite") or rt.settings.jobs.gates.get(model):
            return _gated(request, rt, model, repo, Gate.of(rt, model, body))
    if repo is None:
        raise BadRequestError(
            "send 'repo' (owner/name) or 'model' (an id from `switchyard ls`)", param="repo"
        )
    gated = gated_models(rt, repo)
    if gated:  # a plain update would bypass the gate: run the first gated model's gate instead
        return _gated(request, rt, gated[0], repo, Gate.of(rt, gated[0], body))
    request.app[JOBS].check_free(f"update:{repo}")
    dl = await rt.downloads.update(repo, revision=text_field(body, "revision") or "main")
    return None if dl is None else request.app[SOURCES].adopt_download(dl)


def _asking(request: web.Request) -> Any:
    base_url, context = own_base_url(request)
    key = caller_key(request)

    @contextlib.asynccontextmanager
    async def asking() -> AsyncIterator[Ask]:
        async with aiohttp.ClientSession() as session:
            yield http_ask(session, base_url, api_key=key, ssl_context=context)

    return asking


def job_work(request: web.Request, *, model: str, repo: str, gate: Gate) -> Work:
    """A gated update for a streamed answer (sse.task_stream): the job's events go to the stream, its
    result ends it; a client that leaves cancels the job, as before jobs existed."""
    rt, jobs = request.app[RUNTIME], request.app[JOBS]

    async def work(emit: Emit) -> dict[str, Any]:
        job = gated_update_job(
            rt, jobs, model_id=model, repo=repo, gate=gate, asking=_asking(request), emit=emit
        )
        try:
            await jobs.wait(job.id)
        except asyncio.CancelledError:
            await jobs.cancel(job.id)
            raise
        if job.error is not None:
            raise SwitchyardError(job.error)
        return job.result or {}

    return work


def _gated(request: web.Request, rt: Runtime, model: str, repo: str, gate: Gate) -> Job:
    return gated_update_job(
        rt, request.app[JOBS], model_id=model, repo=repo, gate=gate, asking=_asking(request)
    )


async def _start_engine(request: web.Request, body: dict[str, Any]) -> Job | None:
    """An engine install job; `build` (mistral.rs, MLX) overrides the probe's choice, and one the engine
    has no package for is a 400 naming its builds before anything starts."""
    engine = text_field(body, "engine", required=True) or ""
    started = request.app[RUNTIME].engines.start(
        engine, version=text_field(body, "version"), build=text_field(body, "build")
    )
    return request.app[SOURCES].adopt_engine(started)


async def _start_eval(request: web.Request, body: dict[str, Any]) -> Job | None:
    rt = request.app[RUNTIME]
    model = text_field(body, "model", required=True) or ""
    suite_ref = text_field(body, "suite", required=True) or ""
    path_text(body, "suite")
    threshold = body.get("min_score")
    if threshold is not None and (
        isinstance(threshold, bool) or not isinstance(threshold, int | float) or not 0 <= threshold <= 1
    ):
        raise BadRequestError("'min_score' must be a number from 0 to 1", param="min_score")
    await rt.catalog.aget(model)
    suite = await requested_suite(request, body, suite_ref)
    asking = _asking(request)

    async def work(handle: JobHandle) -> dict[str, Any]:
        def on_case(index: int, total: int, result: CaseResult) -> None:
            handle.step("eval", done=index, total=total)

        async with asking() as ask:
            outcome = await run_suite(
                suite,
                model=model,
                ask=ask,
                store=EvalStore(rt.paths.evals_db),
                threshold=threshold,
                on_case=on_case,
            )
        return outcome.public()

    return request.app[JOBS].run(JobKind.EVAL, f"eval {suite.name} on {model}", work, subject=model)


@routes.get("/api/updates")
async def updates_list(request: web.Request) -> web.Response:
    """The last update check: per pulled model, its commit, the hub's head and the files that changed"""
    return web.json_response(request.app[UPDATES].public())


@routes.post("/api/updates/check")
async def updates_check(request: web.Request) -> web.Response:
    """Check every pulled model against the hub now (the periodic check does it every update_check_h)"""
    return web.json_response(await request.app[UPDATES].check_now())


class NotificationReentryError(ConflictError):
    code = "notification_reentry"


@routes.post("/api/notify/test")
async def notify_test(request: web.Request) -> web.Response:
    """Post a test message to every webhook in `notify.webhooks`; each hook's status or error"""
    if NOTIFICATION_HEADER in request.headers:  # a hook calling back here would recurse without end
        raise NotificationReentryError(
            "this request came from a Switchyard webhook, and a notification may not send notifications; "
            "point the hook at its real receiver"
        )
    return web.json_response({"hooks": await request.app[NOTIFIER].test()})
