"""An in-process event bus: publishers never block; each subscriber owns a bounded queue."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Event:
    kind: str
    data: dict[str, Any]
    ts: float = field(default_factory=time.time)


class EventBus:
    def __init__(self, *, queue_size: int = 1000) -> None:
        self._subs: set[asyncio.Queue[Event]] = set()
        self._queue_size = queue_size

    def publish(self, kind: str, **data: Any) -> Event:
        ev = Event(kind, data)
        for q in list(self._subs):
            if q.full():  # a slow subscriber loses its oldest event, never blocks the publisher
                with contextlib.suppress(asyncio.QueueEmpty):
                    q.get_nowait()
            q.put_nowait(ev)
        return ev

    @contextlib.asynccontextmanager
    async def subscribe(self) -> AsyncIterator[asyncio.Queue[Event]]:
        q: asyncio.Queue[Event] = asyncio.Queue(self._queue_size)
        self._subs.add(q)
        try:
            yield q
        finally:
            self._subs.discard(q)
