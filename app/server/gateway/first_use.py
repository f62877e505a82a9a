"""Engines installed when a request first needs them (the `auto_install_engines` setting).

A model whose format only an uninstalled engine runs (an MLX folder on a machine without the MLX lane)
is not refused with a command to run: the engine is installed as a job (the same EngineJobs job as
`switchyard engine install`, so the jobs panel and /api/jobs show it). A stream waits for it, hearing
its progress in loading comments; any other request gets 503 `engine_installing` with the job's id and
an estimate, and its retry after the job ends is served. An install that fails leaves every engine as
it was (the install writes a new environment and switches to it only once it works) and is not retried
for RETRY_AFTER_FAIL_S: requests meanwhile hear why it failed and what to run.

Only an engine whose one obstacle is that it is not installed is installed this way: a CUDA engine on a
machine without a GPU is refused as before.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from app.core.errors import (
    EngineInstallFailedError,
    EngineInstallingError,
    EngineUnavailableError,
    SwitchyardError,
)
from app.lanes.install.jobs import EngineJob, JobState
from app.lanes.install.store import load_manifest
from app.library.model import ModelEntry
from app.routing.engines import install_hint, title
from app.runtime import Runtime

RETRY_AFTER_FAIL_S = 300.0  # a failed automatic install is not tried again for this long
TICK_S = 1.0
Tick = Callable[[str, float], Awaitable[None]]


class FirstUse:
    """The automatic installs of one server (kept on the Gateway)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._failed: dict[str, tuple[float, str]] = {}  # engine -> (when, why) of its last automatic try

    def missing(self, entry: ModelEntry) -> str | None:
        """The engine to install before `entry` can start, or None: it can start already, the setting is
        off, or something an install cannot give (a GPU, a format no engine reads) is missing too."""
        if not self.rt.settings.engines.auto_install_engines:
            return None
        sup = self.rt.supervisor
        try:
            sup.kind_for(entry)
            return None
        except EngineUnavailableError:
            pass
        except SwitchyardError:
            return None
        pinned = sup.pins.get(entry.id) if sup.pins else None
        kinds = sup.kinds  # the engine kinds, asked through the supervisor (the server imports none)
        readers = [k for k in kinds.values() if entry.format in k.formats]
        candidates = [kinds[pinned]] if pinned in kinds else readers
        installable = load_manifest()
        for kind in candidates:
            found = kind.install(self.rt.settings)
            if found.installed or kind.lane not in installable:
                continue
            if (
                kind.start_refusal(self.rt.settings, sup.hardware) == found.note
            ):  # the install is all it lacks
                return kind.lane
        return None

    def _job(self, engine: str, model: str) -> EngineJob:
        """The running install of `engine`, or a new one; EngineInstallFailedError while a recent automatic
        try's failure stands."""
        jobs = self.rt.engines
        running = next((j for j in jobs.all() if j.engine == engine and j.state is JobState.RUNNING), None)
        if running is not None:
            return running
        failed = self._failed.get(engine)
        if failed is not None and time.monotonic() - failed[0] < RETRY_AFTER_FAIL_S:
            raise EngineInstallFailedError(_failure(engine, model, failed[1]))
        job = jobs.start(engine)
        asyncio.get_running_loop().create_task(self._note_end(job), name=f"first use {engine}")
        return job

    async def _note_end(self, job: EngineJob) -> None:
        ended = await self.rt.engines.wait(job.id)
        if ended.state is JobState.FAILED:
            self._failed[job.engine] = (time.monotonic(), ended.error or "the install failed")
        else:
            self._failed.pop(job.engine, None)

    def refuse(self, entry: ModelEntry) -> None:
        """For a request that cannot wait: start (or join) the install of `entry`'s engine and raise
        EngineInstallingError with the job; nothing when no install is needed."""
        engine = self.missing(entry)
        if engine is None:
            return
        job = self._job(engine, entry.id)
        kind = self.rt.supervisor.kinds.get(engine)  # its rough install time, for the 503's estimate
        estimate = kind.install_estimate_s if kind is not None else 120
        left = max(5, round(estimate - (time.time() - job.started_at)))
        raise EngineInstallingError(
            f"{title(engine)} is being installed so that {entry.id!r} can run (job {job.id}: GET "
            f"/api/engines/jobs/{job.id}, or the jobs panel); retry in about {left} s, or send the request "
            "with stream: true to wait for it"
        )

    async def wait(self, entry: ModelEntry, *, tick: Tick) -> None:
        """For a stream: install `entry`'s engine if it needs one, calling `tick(phase, seconds)` every
        TICK_S with the install's progress; EngineInstallFailedError when it fails."""
        engine = self.missing(entry)
        if engine is None:
            return
        job = self._job(engine, entry.id)
        t0 = time.monotonic()
        waiting = asyncio.ensure_future(self.rt.engines.wait(job.id))
        try:
            while not waiting.done():
                last = job.lines[-1].strip()[:120] if job.lines else "starting"
                await tick(f"installing {title(engine)}, job {job.id}: {last}", time.monotonic() - t0)
                await asyncio.wait({waiting}, timeout=TICK_S)
        finally:
            waiting.cancel()
        if job.state is JobState.FAILED:
            raise EngineInstallFailedError(_failure(engine, entry.id, job.error or "the install failed"))


def _failure(engine: str, model: str, why: str) -> str:
    return (
        f"installing {title(engine)} for {model!r} failed: {why}; every engine installed before is as it "
        f"was. Fix the cause, then: {install_hint(engine)} (or POST /api/engines/{engine}/install)"
    )
