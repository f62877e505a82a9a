"""Adapters: the work other parts already run, mirrored into the job registry (app/core/jobs.py).

Downloads (app/hub/download.py) and engine installs (app/lanes/engine_jobs.py) keep their own managers,
ids and `download.*` / `engine.*` events; this adapter gives each one a registry job (adopt_*, at once
when a route starts it, or from its first event when another part did) and moves it as its events come.
A gated update's candidate download is not mirrored: it is a step of its update job.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from app.core.background import running
from app.core.errors import DownloadNotFoundError
from app.core.events import Event
from app.core.jobs import Job, JobKind, JobRegistry, JobState
from app.hub import download
from app.lanes.engine_jobs import EngineJob
from app.lanes.engine_jobs import JobState as EngineState
from app.runtime import Runtime

_DOWNLOAD_ENDS = {
    "download.completed": JobState.COMPLETED,
    "download.failed": JobState.FAILED,
    "download.cancelled": JobState.CANCELLED,
}


class JobSources:
    def __init__(self, rt: Runtime, jobs: JobRegistry) -> None:
        self.rt, self.jobs = rt, jobs

    def adopt_download(self, dl: download.Job) -> Job | None:
        """The registry job of a download (made once); None for a gated update's candidate."""
        if dl.kind == "candidate":
            return None
        kind = JobKind.UPDATE if dl.kind == "update" else JobKind.DOWNLOAD
        verb = "update" if kind is JobKind.UPDATE else "pull"
        title = f"{verb} {dl.repo}" + (f":{dl.selector}" if dl.selector else "")
        mgr = self.rt.downloads
        guard = f"update:{dl.repo}" if kind is JobKind.UPDATE else None  # one update of a repo at a time
        job = self.jobs.track(
            kind, title, source=dl.id, subject=dl.repo, cancel=lambda: mgr.cancel(dl.id), guard=guard
        )
        self._mirror_download(job, dl)
        return job

    def _mirror_download(self, job: Job, dl: download.Job) -> None:
        if dl.state is download.JobState.RUNNING:
            self.jobs.step(job, "download", done=dl.bytes_done, total=dl.bytes_total)
        elif dl.state in download.TERMINAL:
            end = {download.JobState.COMPLETED: JobState.COMPLETED, download.JobState.FAILED: JobState.FAILED}
            result = {"repo": dl.repo, "commit": dl.commit, "bytes": dl.bytes_total}
            self.jobs.settle(job, end.get(dl.state, JobState.CANCELLED), error=dl.error, result=result)

    def adopt_engine(self, ej: EngineJob) -> Job:
        title = f"engine {ej.action} {ej.engine}" + (f" {ej.version}" if ej.version else "")
        job = self.jobs.track(JobKind.ENGINE_INSTALL, title, source=ej.id, subject=ej.engine)
        if ej.state is EngineState.RUNNING:
            self.jobs.start(job)
        elif ej.state is EngineState.DONE:
            self.jobs.settle(job, JobState.COMPLETED, result=ej.result)
        else:
            self.jobs.settle(job, JobState.FAILED, error=ej.error)
        return job

    def adopt_all(self) -> None:
        """What was already running when the registry started (downloads resumed at start)."""
        for dl in self.rt.downloads.all_jobs():
            self.adopt_download(dl)
        for ej in self.rt.engines.all():
            self.adopt_engine(ej)

    def observe(self, ev: Event) -> None:
        if ev.kind.startswith("download."):
            self._on_download(ev)
        elif ev.kind.startswith("engine.") and isinstance(ev.data.get("id"), str):
            ej = self.rt.engines.get(ev.data["id"])
            if ej is not None:
                self.adopt_engine(ej)

    def _on_download(self, ev: Event) -> None:
        source = ev.data.get("id")
        if not isinstance(source, str):
            return
        try:
            dl = self.rt.downloads.get(source)
        except DownloadNotFoundError:  # already forgotten: its ending event still settles a known job
            job = self.jobs.by_source(source)
            if job is not None and ev.kind in _DOWNLOAD_ENDS:
                self.jobs.settle(job, _DOWNLOAD_ENDS[ev.kind], error=ev.data.get("error"))
            return
        job = self.adopt_download(dl)
        if job is not None and ev.kind == "download.paused":
            self.jobs.requeue(job)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Follow the bus while the server runs."""
        ready = asyncio.Event()
        async with running(self._follow(ready), name="job sources"):
            await ready.wait()
            self.adopt_all()
            yield

    async def _follow(self, ready: asyncio.Event) -> None:
        async with self.rt.bus.subscribe() as q:
            ready.set()
            while True:
                self.observe(await q.get())
