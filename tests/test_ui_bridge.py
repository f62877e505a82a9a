"""The window's event bridge: the slots Qt's signal had, without PySide6 6.12.0's lost references."""

from __future__ import annotations

import asyncio
import gc
import os
import sys
from typing import Any

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
pytest.importorskip("PySide6")

import shiboken6
from PySide6.QtWidgets import QWidget

from app.core.events import EventBus
from app.ui.bridge import Bridge, Received


class Page(QWidget):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def on_event(self, kind: str, _data: Any) -> None:
        self.seen.append(kind)


def test_slots_follow_their_widgets(qapp: Any) -> None:
    got: list[str] = []
    hub = Received()
    page, gone = Page(), Page()
    hub.connect(page.on_event)
    hub.connect(gone.on_event)
    hub.connect(lambda kind, _d: got.append(kind))  # a lambda is held strongly, as Qt holds it

    def broken(_kind: str, _data: Any) -> None:
        raise ValueError("a handler's own bug")

    hub.connect(broken)
    gc.collect()
    hub.emit("one", {})
    assert page.seen == ["one"] and gone.seen == ["one"] and got == ["one"]  # the raising slot stopped none
    shiboken6.delete(gone)  # the C++ widget goes, its Python wrapper stays
    hub.emit("two", {})
    assert page.seen == ["one", "two"] and got == ["one", "two"] and len(hub) == 3
    del page
    gc.collect()
    hub.emit("three", {})
    assert got == ["one", "two", "three"] and len(hub) == 2  # a collected page is dropped too
    hub.disconnect(broken)
    with pytest.raises(RuntimeError, match="not connected"):
        hub.disconnect(broken)


def test_a_long_session_of_events_keeps_reference_counts(qapp: Any) -> None:
    """PySide6 6.12.0's Signal.emit lost a reference to True per call: 2,000 events through the bridge
    must leave True, False and None where they were (the interpreter aborted at quit after a long
    session: issue 20's quit defect)."""
    bus = EventBus()
    bridge = Bridge(bus)
    page = Page()
    bridge.received.connect(page.on_event)
    n = 2000

    async def run() -> tuple[int, int, int]:
        await bridge.start()
        before = sys.getrefcount(True), sys.getrefcount(False), sys.getrefcount(None)
        for _ in range(n):
            bridge.emit_local("hardware.sample", gpu=None, busy=True)
        for _ in range(n):
            bus.publish("lane.state", ready=False)
            await asyncio.sleep(0)  # the pump delivers each before the next is published (none dropped)
        after = sys.getrefcount(True), sys.getrefcount(False), sys.getrefcount(None)
        await bridge.stop()
        return after[0] - before[0], after[1] - before[1], after[2] - before[2]

    drift = asyncio.run(run())
    assert len(page.seen) == 2 * n
    assert all(abs(d) < n // 10 for d in drift), f"True/False/None reference counts moved by {drift}"
