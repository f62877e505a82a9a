"""Engine installs as background jobs of a running server (or the desktop): one per engine at a time.

The admin API and the Lanes page start a job and return at once; progress arrives as `engine.*` events
on the bus (`engine.started`, `engine.progress` per pip line, `engine.done` or `engine.failed`). A job's
state moves once, running -> completed | failed, through `EngineJobs._settle`, which publishes the move
(JOB_TRANSITIONS). Jobs are kept in memory only: a server restarted mid-install finds the new folder
unrecorded, and the next install deletes it (app/lanes/install/engine.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import deque
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from app.core.background import all_cancelled
from app.core.errors import EngineBusyError, SwitchyardError
from app.core.events import EventBus, EventKind
from app.core.jobs import TRANSITIONS, JobState
from app.core.settings import Settings
from app.hardware.probe import probe
from app.lanes.install import engine as engine_install
from app.lanes.install.store import EngineStore, load_manifest, spec_for

KEEP_LINES = 200
KEEP_JOBS = 20


# an engine job runs once, on the one job state machine (app/core/jobs.py): running -> completed | failed,
# and an ended job never moves again
JOB_TRANSITIONS: dict[JobState, frozenset[JobState]] = {s: frozenset() for s in JobState} | {
    JobState.RUNNING: TRANSITIONS[JobState.RUNNING] & {JobState.COMPLETED, JobState.FAILED}
}


@dataclass
class EngineJob:
    id: str
    engine: str
    action: str  # install | update
    version: str | None  # asked for; None: the pin or the manifest's
    build: str | None = None  # asked for; None: the one the hardware probe chooses
    state: JobState = JobState.RUNNING
    error: str | None = None
    result: dict[str, Any] | None = None
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    lines: deque[str] = field(default_factory=lambda: deque(maxlen=KEEP_LINES))

    def public(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "engine": self.engine,
            "action": self.action,
            "version": self.version,
            "build": self.build,
            "state": self.state,
            "error": self.error,
            "result": self.result,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "tail": list(self.lines)[-20:],
        }


class EngineJobs:
    """Owned by the Runtime: started jobs, cancelled when it closes."""

    def __init__(self, *, bus: EventBus, settings: Settings, store: EngineStore | None = None) -> None:
        self.bus = bus
        self.settings = settings
        self.store = store or EngineStore.default()
        self._jobs: dict[str, EngineJob] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._ids = itertools.count(1)

    def start(
        self, engine: str, *, version: str | None = None, build: str | None = None, action: str = "install"
    ) -> EngineJob:
        """Start installing; EngineBusyError if this engine already has a running job, EngineStateError
        (listing the valid ones) for a build the engine has no package for."""
        spec = spec_for(engine)
        if build is not None:
            spec.check_build(build)
        if any(j.engine == engine and j.state is JobState.RUNNING for j in self._jobs.values()):
            raise EngineBusyError(f"{engine} is already being installed; follow GET /api/engines/events")
        job = EngineJob(
            id=f"eng-{next(self._ids)}", engine=engine, action=action, version=version, build=build
        )
        self._jobs[job.id] = job
        self._tasks[job.id] = asyncio.create_task(self._run(job), name=f"engine {engine}")
        self._forget_old()
        return job

    def update_all(self) -> list[EngineJob]:
        """An update job per engine that has an environment of its own and is behind its target: another
        version, or (mistral.rs, MLX) another build than the one the hardware probe chooses now."""
        jobs = []
        hardware = None  # probed once, and only when an installed engine has several builds
        for lane, spec in load_manifest().items():
            with contextlib.suppress(SwitchyardError):
                state = self.store.read(lane)
                if state.current is None:
                    continue
                if spec.builds and hardware is None:
                    hardware = probe(engine=False)
                want = engine_install.plan(spec, state, hardware=hardware)
                if (state.current.version, state.current.build) != (want.version, want.build):
                    jobs.append(self.start(lane, action="update"))
        return jobs

    async def _run(self, job: EngineJob) -> None:
        try:
            result = await engine_install.install(
                job.engine,
                store=self.store,
                bus=self.bus,
                version=job.version,
                build=job.build,
                engine_python=self.settings.engines.engine_python,
                job=job.id,
                on_line=job.lines.append,
            )
        except SwitchyardError as exc:
            self._settle(job, JobState.FAILED, error=exc.message, code=exc.code)
        except asyncio.CancelledError:
            self._settle(job, JobState.FAILED, error="cancelled: the server stopped", code="cancelled")
            raise
        except Exception as exc:  # a job never dies silently: it says what went wrong
            self._settle(job, JobState.FAILED, error=f"{type(exc).__name__}: {exc}", code="internal")
        else:
            self._settle(job, JobState.COMPLETED, result=result.public())
        finally:
            self._tasks.pop(job.id, None)

    def _settle(
        self,
        job: EngineJob,
        state: JobState,
        *,
        error: str | None = None,
        code: str | None = None,
        result: dict[str, Any] | None = None,
    ) -> None:
        """The one writer of a job's state: a move JOB_TRANSITIONS allows, published as `engine.done`
        (with `result`) or `engine.failed` (with `error` and `code`). A second ending is a bug: refused."""
        if state not in JOB_TRANSITIONS[job.state]:
            raise RuntimeError(f"engine job {job.id} cannot go {job.state} -> {state}")
        job.state, job.error, job.result, job.finished_at = state, error, result, time.time()
        if state is JobState.COMPLETED:
            self.bus.publish(EventKind.ENGINE_DONE, id=job.id, **(result or {}))
        else:
            self.bus.publish(EventKind.ENGINE_FAILED, id=job.id, engine=job.engine, error=error, code=code)

    def get(self, job_id: str) -> EngineJob | None:
        return self._jobs.get(job_id)

    def all(self) -> list[EngineJob]:
        return list(self._jobs.values())

    def _forget_old(self) -> None:
        done = [j for j in self._jobs.values() if j.state is not JobState.RUNNING]
        for j in done[: max(0, len(self._jobs) - KEEP_JOBS)]:
            del self._jobs[j.id]

    async def wait(self, job_id: str) -> EngineJob:
        task = self._tasks.get(job_id)
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(task)
        return self._jobs[job_id]

    async def __aenter__(self) -> EngineJobs:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        # each installer deletes its half-built folder; the current version stays
        await all_cancelled(self._tasks.values())
