"""Core EventBus -> the window's widgets. Widgets connect to `received` and never poll the core themselves.

`received` is not a Qt Signal: PySide6 6.12.0's `Signal.emit`, called from Python, drops a reference to the
bool it returns on every call, so a long session of events (a hardware sample a second, every download
progress) counted `True` down until the interpreter aborted (`Fatal Python error: bool_dealloc`, at quit
or before; tests/test_ui_signal_refcount.py). Every event here is published and handled on the one GUI
thread (qasync runs asyncio on Qt's loop), so a plain list of slots does what the signal did, with Qt's
rules kept: a bound method is held weakly and dropped with its widget (C++ side deleted or Python side
collected), a plain function or lambda strongly; a slot that raises is logged and the others still run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Callable
from typing import Any

import shiboken6
from PySide6.QtCore import QObject

from app.core.events import EventBus

log = logging.getLogger("switchyard.ui")
Slot = Callable[[str, Any], object]


class _Strong:
    """A plain function or lambda, held as Qt holds one: for as long as it is connected."""

    def __init__(self, slot: Slot) -> None:
        self.slot = slot

    def __call__(self) -> Slot:
        return self.slot


class Received:
    """`connect(slot)`, `disconnect(slot)`, `emit(kind, data)`: the shape of the Qt signal it replaces."""

    def __init__(self) -> None:
        self._slots: list[Callable[[], Slot | None]] = []

    def connect(self, slot: Slot) -> None:
        if hasattr(slot, "__self__") and hasattr(slot, "__func__"):  # a bound method: weak, as Qt holds it
            self._slots.append(weakref.WeakMethod(slot))
        else:
            self._slots.append(_Strong(slot))

    def disconnect(self, slot: Slot) -> None:
        for ref in list(self._slots):
            if ref() == slot:
                self._slots.remove(ref)
                return
        raise RuntimeError(f"{slot!r} is not connected")

    def emit(self, kind: str, data: Any) -> None:
        for ref in list(self._slots):  # a slot may connect or disconnect others while this runs
            slot = ref()
            owner = getattr(slot, "__self__", None)
            if slot is None or (isinstance(owner, QObject) and not shiboken6.isValid(owner)):
                with contextlib.suppress(ValueError):
                    self._slots.remove(ref)  # its widget is gone
                continue
            try:
                slot(kind, data)
            except Exception:  # as Qt does with a slot that raises: say so, go on with the others
                log.exception("a window handler failed on %s", kind)

    def clear(self) -> None:
        """Every handler dropped (the window's quit)."""
        self._slots.clear()

    def __len__(self) -> int:
        return len(self._slots)


class Bridge:
    def __init__(self, bus: EventBus) -> None:
        self.bus = bus
        self.received = Received()  # kind, data (a dict)
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
