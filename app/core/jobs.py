"""The job registry: downloads, engine installs, updates and eval runs as one list of jobs of the server.

A Job has an id, a kind, a title, a state (queued, running, paused, completed, failed, cancelled), named steps
with progress, its start and end, and its error or result. Work of this process runs through `run()` (an
asyncio task the registry owns, cancellable); work another part already runs (the download manager, the
engine installs) is mirrored with `track()` and moved by its adapter (app/server/admin/job_sources.py).

Every move is published once on the bus as `job.queued`, `job.started`, `job.progress`, `job.paused`,
`job.completed`, `job.failed` or `job.cancelled`, with the job's public form (its kind as `job_kind`).
Finished jobs (the newest KEEP_FINISHED) are kept in `<home>/jobs.json`, so a restarted server still
lists them. `guard` names a subject ("update:org/repo") only one active job may hold at a time: a second
one is a 409 saying which job holds it.

Traces (docs/tracing.md): a job is a `switchyard.job` span from its queueing to its end, and each of its
steps a `switchyard.job_step` span under it, from the step's first report to the next step or the end
(attributes: the job's kind and id, the step's name and its last progress, the job's end state).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from types import TracebackType
from typing import Any

from app.core import statefile, tracing
from app.core.background import all_cancelled
from app.core.errors import ConflictError, NotFoundError, SwitchyardError
from app.core.events import EventBus, EventKind

log = logging.getLogger(__name__)
KEEP_FINISHED = 50


class JobKind(StrEnum):
    DOWNLOAD = "download"
    ENGINE_INSTALL = "engine_install"
    UPDATE = "update"
    EVAL = "eval"


class JobState(StrEnum):
    """The one state machine of every job: registry jobs, downloads and engine installs alike."""

    QUEUED = "queued"  # waiting for a slot (a download also waits here after a restart, to resume)
    RUNNING = "running"  # working; a download may go back to queued when its process stops
    PAUSED = "paused"  # held by the user (downloads only); resumed by going back to queued
    COMPLETED = "completed"  # ended with its result
    FAILED = "failed"  # ended with an error; a download may be queued again (retry)
    CANCELLED = "cancelled"  # ended by the user


_Q, _R, _P, _F, _X = JobState.QUEUED, JobState.RUNNING, JobState.PAUSED, JobState.FAILED, JobState.CANCELLED
# The moves a job may make. queued -> queued and running -> queued: a job recorded as active by a process that
# stopped is resumed. A kind of job uses the part it needs (engine installs: running -> completed, failed).
TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset({_Q, _R, _P, _F, _X}),
    JobState.RUNNING: frozenset({_Q, JobState.COMPLETED, _P, _F, _X}),
    JobState.PAUSED: frozenset({_Q, _X}),
    JobState.FAILED: frozenset({_Q, _X}),
    JobState.COMPLETED: frozenset(),
    JobState.CANCELLED: frozenset(),
}
ACTIVE = frozenset({JobState.QUEUED, JobState.RUNNING})
TERMINAL = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})
_EVENTS = {s: EventKind(f"job.{s.value}") for s in TERMINAL | {_Q, _P}} | {
    JobState.RUNNING: EventKind.JOB_STARTED
}


class JobNotFoundError(NotFoundError):
    code = "job_not_found"


class JobBusyError(ConflictError):
    code = "job_busy"


class JobNotCancellableError(ConflictError):
    code = "job_not_cancellable"


@dataclass
class Step:
    name: str
    done: int = 0
    total: int | None = None

    def public(self) -> dict[str, Any]:
        return {"name": self.name, "done": self.done, "total": self.total}


@dataclass
class Job:
    id: str
    kind: JobKind
    title: str
    subject: str | None = None  # the repository, model or engine the job is about
    source: str | None = None  # the id the wrapped part knows it by (a download id, an engine job id)
    state: JobState = JobState.QUEUED
    steps: list[Step] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    ended: float | None = None
    error: str | None = None
    result: dict[str, Any] | None = None
    guard: str | None = None

    @property
    def progress(self) -> float | None:
        """The last step's fraction done (None when its total is unknown)."""
        step = self.steps[-1] if self.steps else None
        if step is None or not step.total:
            return None
        return min(1.0, step.done / step.total)

    def public(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind.value,
            "title": self.title,
            "subject": self.subject,
            "source": self.source,
            "state": self.state.value,
            "steps": [s.public() for s in self.steps],
            "progress": self.progress,
            "started": self.started,
            "ended": self.ended,
            "error": self.error,
            "result": self.result,
        }

    @classmethod
    def restore(cls, doc: dict[str, Any]) -> Job:
        steps = [Step(s["name"], int(s.get("done") or 0), s.get("total")) for s in doc.get("steps") or []]
        return cls(
            id=str(doc["id"]),
            kind=JobKind(doc["kind"]),
            title=str(doc.get("title") or ""),
            subject=doc.get("subject"),
            source=doc.get("source"),
            state=JobState(doc["state"]),
            steps=steps,
            started=float(doc.get("started") or 0),
            ended=doc.get("ended"),
            error=doc.get("error"),
            result=doc.get("result"),
        )


class JobHandle:
    """What a job's work is given: `step(name, done=, total=)` reports progress."""

    def __init__(self, registry: JobRegistry, job: Job) -> None:
        self._registry, self.job = registry, job

    def step(self, name: str, *, done: int = 0, total: int | None = None) -> None:
        self._registry.step(self.job, name, done=done, total=total)


Work = Callable[[JobHandle], Awaitable[dict[str, Any]]]
Cancel = Callable[[], Awaitable[Any]]


class JobRegistry:
    """Owned by the server (an async context manager): the jobs, their tasks and jobs.json."""

    def __init__(self, *, bus: EventBus, state_file: Path, keep: int = KEEP_FINISHED) -> None:
        self.bus = bus
        self.state_file = state_file
        self.keep = keep
        self._jobs: dict[str, Job] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._cancels: dict[str, Cancel] = {}
        self._ended: dict[str, asyncio.Event] = {}
        self._writes: set[asyncio.Future[None]] = set()
        # the open trace spans of each active job: its own and its current step's (no-ops while off)
        self._spans: dict[str, tuple[tracing.OpenSpan, tracing.OpenSpan | None]] = {}

    async def __aenter__(self) -> JobRegistry:
        for job in await asyncio.to_thread(self._load):
            self._jobs.setdefault(job.id, job)
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await all_cancelled(self._tasks.values())
        for job in self._jobs.values():  # mirrored work stops with the server (downloads resume later)
            if job.state not in TERMINAL and job.kind is not JobKind.DOWNLOAD:
                self.settle(job, JobState.CANCELLED, error="the server stopped")
        for job_id in list(self._spans):  # a download that resumes later: its spans end with this server
            self._end_spans(job_id, "interrupted")
        await asyncio.gather(*self._writes, return_exceptions=True)  # the last write must be the newest
        await asyncio.to_thread(self._write, self._finished())

    # ---- reading -----------------------------------------------------------------------------------
    def all(self) -> list[Job]:
        """Every job, newest first."""
        return sorted(self._jobs.values(), key=lambda j: j.started, reverse=True)

    def get(self, job_id: str) -> Job:
        job = self._jobs.get(job_id)
        if job is None:
            raise JobNotFoundError(f"no job {job_id!r}; `switchyard jobs` lists them", param="id")
        return job

    def by_source(self, source: str) -> Job | None:
        """The newest job mirroring `source` (a retried download has one per try)."""
        return next((j for j in reversed(self._jobs.values()) if j.source == source), None)

    def active(self) -> list[Job]:
        """The queued and running jobs, newest first."""
        return [j for j in self.all() if j.state not in TERMINAL]

    def cancellable(self, job_id: str) -> bool:
        """Whether `cancel` can stop the job now (a job of this process, or mirrored work with a stop)."""
        job = self._jobs.get(job_id)
        return (
            job is not None
            and job.state not in TERMINAL
            and (job_id in self._tasks or job_id in self._cancels)
        )

    def holder(self, guard: str) -> Job | None:
        """The active job holding `guard`, if any."""
        return next((j for j in self._jobs.values() if j.guard == guard and j.state not in TERMINAL), None)

    # ---- creating ----------------------------------------------------------------------------------
    def check_free(self, guard: str) -> None:
        """JobBusyError (409) naming the active job that holds `guard`, if one does."""
        if (busy := self.holder(guard)) is not None:
            raise JobBusyError(
                f"{busy.title} is already running as job {busy.id}; wait for it "
                f"(`switchyard jobs follow {busy.id}`) or cancel it, then try again",
                param="id",
            )

    def _new(
        self, kind: JobKind, title: str, *, subject: str | None, source: str | None, guard: str | None
    ) -> Job:
        if guard is not None:
            self.check_free(guard)
        job = Job(id=f"job-{secrets.token_hex(4)}", kind=kind, title=title, subject=subject, source=source)
        job.guard = guard
        self._jobs[job.id] = job
        self._ended[job.id] = asyncio.Event()
        job_span = tracing.open_span(
            "switchyard.job", job_kind=kind.value, job=job.id, title=title, subject=subject
        )
        self._spans[job.id] = (job_span, None)
        self._publish(job, EventKind.JOB_QUEUED)
        return job

    def run(
        self, kind: JobKind, title: str, work: Work, *, subject: str | None = None, guard: str | None = None
    ) -> Job:
        """Start `work` as a job of this process; its returned dict is the result, its error the error."""
        job = self._new(kind, title, subject=subject, source=None, guard=guard)
        self._tasks[job.id] = asyncio.create_task(self._drive(job, work), name=f"job {job.id}")
        return job

    def track(
        self,
        kind: JobKind,
        title: str,
        *,
        source: str,
        subject: str | None = None,
        cancel: Cancel | None = None,
        guard: str | None = None,
        renew: bool = False,
    ) -> Job:
        """Mirror work another part runs (once per source): its adapter moves it with start/step/settle.
        `guard` is held, not checked: the work already runs. `renew`: the source runs again after its job
        ended (a failed download retried), so it gets a new job rather than the ended one."""
        known = self.by_source(source)
        if known is not None and not (renew and known.state in TERMINAL):
            return known
        job = self._new(kind, title, subject=subject, source=source, guard=None)
        job.guard = guard
        if cancel is not None:
            self._cancels[job.id] = cancel
        return job

    async def _drive(self, job: Job, work: Work) -> None:
        self.start(job)
        try:
            result = await work(JobHandle(self, job))
        except asyncio.CancelledError:
            self.settle(job, JobState.CANCELLED, error="cancelled")
            raise
        except SwitchyardError as exc:
            self.settle(job, JobState.FAILED, error=exc.message)
        except Exception as exc:  # a job never ends silently: it says what went wrong
            log.exception("job %s failed", job.id)
            self.settle(job, JobState.FAILED, error=f"{type(exc).__name__}: {exc}")
        else:
            self.settle(job, JobState.COMPLETED, result=result)
        finally:
            self._tasks.pop(job.id, None)

    # ---- moving ------------------------------------------------------------------------------------
    def start(self, job: Job) -> None:
        if job.state is JobState.QUEUED:
            job.state = JobState.RUNNING
            self._publish(job, EventKind.JOB_STARTED)

    def requeue(self, job: Job) -> None:
        """A mirrored download resumed (or whose process stopped): back to queued until it runs again."""
        if job.state in (JobState.RUNNING, JobState.PAUSED):
            job.state = JobState.QUEUED
            self._publish(job, EventKind.JOB_QUEUED)

    def pause(self, job: Job) -> None:
        """A mirrored download the user paused: the job says paused, as the download does."""
        if job.state in ACTIVE:
            job.state = JobState.PAUSED
            self._publish(job, EventKind.JOB_PAUSED)

    def step(self, job: Job, name: str, *, done: int = 0, total: int | None = None) -> None:
        if job.state in TERMINAL:
            return
        self.start(job)
        if job.steps and job.steps[-1].name == name:
            job.steps[-1].done, job.steps[-1].total = done, total
        else:
            job.steps.append(Step(name, done, total))
            self._open_step(job, name)
        if (spans := self._spans.get(job.id)) is not None and spans[1] is not None:
            spans[1].set_attribute(tracing.PREFIX + "done", done)
            if total is not None:
                spans[1].set_attribute(tracing.PREFIX + "total", total)
        self._publish(job, EventKind.JOB_PROGRESS)

    def _open_step(self, job: Job, name: str) -> None:
        """The step's span, under the job's; the previous step's ends (completed: a next step began)."""
        job_span, step_span = self._spans.get(job.id, (None, None))
        if job_span is None:
            return
        if step_span is not None:
            step_span.set_attribute(tracing.PREFIX + "state", JobState.COMPLETED.value)
            step_span.end()
        step_span = tracing.open_span(
            "switchyard.job_step", parent=job_span, job_kind=job.kind.value, job=job.id, step=name
        )
        self._spans[job.id] = (job_span, step_span)

    def _end_spans(self, job_id: str, state: str, error: str | None = None) -> None:
        job_span, step_span = self._spans.pop(job_id, (None, None))
        for span_ in (step_span, job_span):
            if span_ is None:
                continue
            span_.set_attribute(tracing.PREFIX + "state", state)
            if state == JobState.FAILED.value:
                tracing.fail(span_, error or "failed")
            span_.end()

    def settle(
        self,
        job: Job,
        state: JobState,
        *,
        error: str | None = None,
        result: dict[str, Any] | None = None,
    ) -> None:
        """The one ending of a job: it moves once to a terminal state, published and saved."""
        if job.state in TERMINAL or state not in TERMINAL:
            return
        if state is JobState.COMPLETED and job.steps and job.steps[-1].total:
            # its work is all done, whatever the last progress report said (a mirrored download's last
            # event may come before its final bytes): shown at 100 %, never 0 % or 22 %
            job.steps[-1].done = job.steps[-1].total or 0
        job.state, job.error, job.result, job.ended = state, error, result, time.time()
        self._cancels.pop(job.id, None)
        self._end_spans(job.id, state.value, error)
        self._publish(job, _EVENTS[state])
        if (ended := self._ended.get(job.id)) is not None:
            ended.set()
        self._save_soon()

    async def cancel(self, job_id: str) -> Job:
        """Stop a job where its kind allows (409 otherwise, or when it has already ended)."""
        job = self.get(job_id)
        if job.state in TERMINAL:
            raise JobNotCancellableError(f"job {job_id} has already {job.state.value}", param="id")
        task, cancel = self._tasks.get(job_id), self._cancels.get(job_id)
        if task is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        elif cancel is not None:
            await cancel()
            self.settle(job, JobState.CANCELLED, error="cancelled")
        else:
            raise JobNotCancellableError(
                f"a {job.kind.value} job cannot be stopped half-way; wait for it to end", param="id"
            )
        return job

    async def wait(self, job_id: str) -> Job:
        job = self.get(job_id)
        if job.state not in TERMINAL:
            await self._ended.setdefault(job_id, asyncio.Event()).wait()
        return job

    # ---- events and the file -----------------------------------------------------------------------
    def _publish(self, job: Job, kind: EventKind) -> None:
        data = job.public()
        data["job_kind"] = data.pop("kind")  # `kind` is the event's own name on the bus
        self.bus.publish(kind, **data)

    def _save_soon(self) -> None:
        finished = self._finished()  # read on the loop; only the write goes to a thread
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._write(finished)
            return
        write = loop.run_in_executor(None, self._write, finished)
        self._writes.add(write)
        write.add_done_callback(self._writes.discard)

    def _finished(self) -> list[dict[str, Any]]:
        done = [j for j in self.all() if j.state in TERMINAL]
        return [j.public() for j in done[: self.keep]]

    def _write(self, finished: list[dict[str, Any]]) -> None:
        try:
            statefile.update(self.state_file, lambda _old: {"jobs": finished})
        except OSError as exc:  # the list is a convenience: a full disk must not fail the job itself
            log.warning("could not save %s: %s", self.state_file, exc)

    def _load(self) -> list[Job]:
        text = statefile.read_text(self.state_file)
        if text is None:
            return []
        out = []
        try:
            docs = json.loads(text).get("jobs") or []
        except (ValueError, AttributeError):
            log.warning("%s is not a jobs file; starting with no finished jobs", self.state_file)
            return []
        for doc in docs:
            with contextlib.suppress(KeyError, ValueError, TypeError):
                out.append(Job.restore(doc))
        return out


def read_finished(state_file: Path) -> list[dict[str, Any]]:
    """The finished jobs a server saved (for `switchyard jobs` when no server runs), newest first."""
    text = statefile.read_text(state_file)
    if text is None:
        return []
    try:
        docs = json.loads(text).get("jobs") or []
    except (ValueError, AttributeError):
        return []
    return [d for d in docs if isinstance(d, dict)]
