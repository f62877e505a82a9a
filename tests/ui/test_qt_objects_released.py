"""A Desktop leaves no Qt object of its own for Python's cyclic collector (the root of the SIGSEGVs of Qt
test files that build several Desktops in one process).

Its parentless Qt objects (window, tray icon and menu, event bridge, single-instance socket) are owned by
their Python wrappers, which sit in reference cycles with the Desktop. The collector frees a cycle on
whichever thread crosses its threshold, often a `to_thread` worker of the next Desktop; Qt objects
deleted there ("QObject::~QObject: Timers cannot be stopped from another thread") crashed the process.
So the Desktop deletes them on the GUI thread as it exits; this checks that none is left alive."""

from __future__ import annotations

import asyncio
import gc
import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
pytest.importorskip("PySide6")
pytest.importorskip("qasync")

from tests.support.desks import run_desk


def _python_owned_qt() -> set[int]:
    """The ids of live Qt objects whose deletion is left to Python (their wrappers own them)."""
    import shiboken6
    from PySide6.QtCore import QObject

    return {
        id(o)
        for o in gc.get_objects()
        if isinstance(o, QObject) and shiboken6.isValid(o) and shiboken6.ownedByPython(o)
    }


def test_a_desktop_deletes_its_own_qt_objects_on_the_gui_thread(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path
) -> None:
    import shiboken6

    from tests.support.tinymodels import CHAT, write_tiny_gguf

    write_tiny_gguf(tmp_path / "models" / "tiny.gguf", CHAT)
    before = _python_owned_qt()  # the loop's own (its timer, its executor's threads): the fixture's
    kept: list[Any] = []

    async def body(desk: Any) -> None:
        kept.append(desk)
        desk.window.show_page("Library")
        await desk.tasks.settle()
        desk.window.show_page("Chat")
        await asyncio.sleep(0.1)

    gc.disable()  # nothing collected meanwhile: what is left is what the Desktop left
    try:
        run_desk(qloop, qapp, isolated_env, tmp_path / "models", body)
        (desk,) = kept
        named = {
            "window": desk.window,
            "tray": desk.tray,
            "tray menu": desk.tray.menu,
            "bridge": desk.bridge,
            "single-instance socket": desk.instance.server,
        }
        alive = [name for name, obj in named.items() if shiboken6.isValid(obj)]
        assert not alive, f"left for the garbage collector's thread: {alive}"
        new = _python_owned_qt() - before
        # the loop's executor threads start with its first to_thread: the qloop fixture frees them
        ours = [o for o in gc.get_objects() if id(o) in new and not type(o).__module__.startswith("qasync")]
        left = [type(o).__name__ for o in ours]
        assert not left, f"Qt objects left for the garbage collector's thread: {left}"
    finally:
        gc.enable()
