"""Core EventBus -> Qt signal. Widgets connect to `received` and never poll the core themselves."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from PySide6.QtCore import QObject, Signal

from app.core.events import EventBus


class Bridge(QObject):
    received = Signal(str, object)  # kind, data (a dict)

    def __init__(self, bus: EventBus) -> None:
        super().__init__()
        self.bus = bus
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._pump(), name="ui-bridge")
        await self._ready.wait()  # subscribed: nothing published after start() is missed

    async def _pump(self) -> None:
        async with self.bus.subscribe() as q:
            self._ready.set()
            while True:
                ev = await q.get()
                self.received.emit(ev.kind, dict(ev.data))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def emit_local(self, kind: str, **data: Any) -> None:
        """UI-only notices (not core events) travel the same way."""
        self.received.emit(kind, data)
