"""Adapters: the work other parts already run, mirrored into the job registry (app/core/jobs.py).

Downloads (app/hub/download.py) and engine installs (app/lanes/install/jobs.py) keep their own managers,
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
from app.core.events import Event, EventKind
from app.core.jobs import TERMINAL, Job, JobKind, JobRegistry, JobState
from app.hub import download
from app.lanes.install.jobs import EngineJob
from app.runtime import Runtime

_DOWNLOAD_ENDS = {
    "download.completed": JobState.COMPLETED,
    "download.failed": JobState.FAILED,
    "download.cancelled": JobState.CANCELLED,
}

# what `observe` reads: a download's and an engine install's events (never request.done, once per request)
FOLLOWED = frozenset(k for k in EventKind if k.startswith(("download.", "engine.")))


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
            kind,
            title,
            source=dl.id,
            subject=dl.repo,
            cancel=lambda: mgr.cancel(dl.id),
            guard=guard,
            renew=dl.state not in TERMINAL,  # a failed download retried: a new job, not the failed one
        )
        self._mirror_download(job, dl)
        return job

    def _mirror_download(self, job: Job, dl: download.Job) -> None:
        """The job takes the download's state: running with its bytes, paused, queued again, or its end."""
        if dl.state is JobState.RUNNING:
            self.jobs.step(job, "download", done=dl.bytes_done, total=dl.bytes_total)
        elif dl.state is JobState.PAUSED:
            self.jobs.pause(job)
        elif dl.state is JobState.QUEUED:
            self.jobs.requeue(job)
        elif dl.state in TERMINAL:  # one state machine: the download's end is the job's
            result = {"repo": dl.repo, "commit": dl.commit, "bytes": dl.bytes_total}
            self.jobs.settle(job, dl.state, error=dl.error, result=result)

    def adopt_engine(self, ej: EngineJob) -> Job:
        title = f"engine {ej.action} {ej.engine}" + (f" {ej.version}" if ej.version else "")
        job = self.jobs.track(JobKind.ENGINE_INSTALL, title, source=ej.id, subject=ej.engine)
        if ej.state is JobState.RUNNING:
            self.jobs.start(job)
        elif ej.state is JobState.COMPLETED:
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
        self.adopt_download(dl)  # the job takes the download's state as it is now

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Follow the bus while the server runs."""
        ready = asyncio.Event()
        async with running(self._follow(ready), name="job sources"):
            await ready.wait()
            self.adopt_all()
            yield

    async def _follow(self, ready: asyncio.Event) -> None:
        async with self.rt.bus.subscribe(FOLLOWED) as q:
            ready.set()
            while True:
                self.observe(await q.get())
