"""An in-process event bus: publishers never block; each subscriber owns a bounded queue.

`EventKind` is the catalogue: every kind published anywhere is a member here, with what its data holds. The
desktop bridge, the notifier and `/api/events` read these kinds; `publish` takes nothing else (mypy and
tests/structure/test_event_catalogue.py hold every publisher to it). Adding a kind is one member below.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class EventKind(StrEnum):
    """Every kind of event, by the name it has on the wire (`/api/events`'s `event:` line)."""

    LANE_STATE = "lane.state"  # lane, model, state, reason, port, pid...: a lane changed state
    LANE_READY = "lane.ready"  # lane, model, seconds, footprint: a lane finished loading
    REMOTE_STATE = "remote.state"  # remote, model, state, error: a remote model's health changed
    REMOTE_ERROR = "remote.error"  # error: a round of remote health checks failed as a whole
    REMOTE_REMOVED = "remote.removed"  # remote: a remote was removed
    LIBRARY_CHANGED = "library.changed"  # model, reason (smoke, ...): what the library knows of a model
    MODEL_UPDATE_AVAILABLE = "model.update_available"  # model, repo, revisions: a newer revision exists
    DOWNLOAD_QUEUED = "download.queued"  # a download job's public fields
    DOWNLOAD_STARTED = "download.started"
    DOWNLOAD_PROGRESS = "download.progress"  # ... plus delta: bytes since the last progress event
    DOWNLOAD_PAUSED = "download.paused"
    DOWNLOAD_RESUMED = "download.resumed"
    DOWNLOAD_COMPLETED = "download.completed"
    DOWNLOAD_FAILED = "download.failed"
    DOWNLOAD_CANCELLED = "download.cancelled"
    ENGINE_STARTED = "engine.started"  # id, engine, version, build: an engine install began
    ENGINE_PROGRESS = "engine.progress"  # id, engine, phase, line
    ENGINE_DONE = "engine.done"  # id, and the install's result
    ENGINE_FAILED = "engine.failed"  # id, engine, error, code
    ENGINE_CHANGED = "engine.changed"  # engine, ...: what is installed for a lane changed
    JOB_QUEUED = "job.queued"  # a registry job's public fields (app/core/jobs.py)
    JOB_STARTED = "job.started"
    JOB_PROGRESS = "job.progress"
    JOB_PAUSED = "job.paused"  # a mirrored download the user paused (resumed: job.queued again)
    JOB_COMPLETED = "job.completed"
    JOB_FAILED = "job.failed"
    JOB_CANCELLED = "job.cancelled"
    REQUEST_DONE = "request.done"  # method, path, status, model, client, seconds: one answered request
    HARDWARE_SAMPLE = "hardware.sample"  # the monitor's sample: memory, CPU and GPU use
    SAFETY_REFUSED = "safety.refused"  # stage, model, category, client: a judge refused a request
    SERVER_STATE = "server.state"  # running, url, error, fingerprint: the desktop's own server


@dataclass(frozen=True)
class Event:
    kind: EventKind
    data: dict[str, Any]
    ts: float = field(default_factory=time.time)


class EventBus:
    def __init__(self, *, queue_size: int = 1000) -> None:
        # each subscriber's queue and the kinds it takes (None: every kind)
        self._subs: dict[asyncio.Queue[Event], frozenset[EventKind] | None] = {}
        self._queue_size = queue_size

    def publish(self, kind: EventKind, **data: Any) -> Event:
        ev = Event(EventKind(kind), data)
        for q, kinds in list(self._subs.items()):
            if kinds is not None and ev.kind not in kinds:
                continue  # no wake-up of a task that would drop it (request.done comes once per request)
            if q.full():  # a slow subscriber loses its oldest event, never blocks the publisher
                with contextlib.suppress(asyncio.QueueEmpty):
                    q.get_nowait()
            q.put_nowait(ev)
        return ev

    @contextlib.asynccontextmanager
    async def subscribe(
        self, kinds: Iterable[EventKind] | None = None
    ) -> AsyncIterator[asyncio.Queue[Event]]:
        """A queue of the events published from now on: of `kinds` only, or every kind (None)."""
        q: asyncio.Queue[Event] = asyncio.Queue(self._queue_size)
        self._subs[q] = frozenset(kinds) if kinds is not None else None
        try:
            yield q
        finally:
            self._subs.pop(q, None)
