"""A keyboard-only walk from search to download to chat (issue 32).

Each drives the real widgets offscreen, with a real Desktop over a models folder of tiny generated models
(tests/support/desks.py); one file a Desktop or two, as each Qt file runs in a process of its own."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
pytest.importorskip("PySide6")
pytest.importorskip("qasync")

from PySide6.QtCore import Qt

from tests.support.desks import run_desk
from tests.support.tinymodels import CHAT, write_tiny_gguf


# ---- keyboard only: search -> download -> chat ---------------------------------------------------------
def test_keyboard_only_walk_from_search_to_download_to_chat(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path, fake_hub: Any
) -> None:
    """No mouse and no method calls on the pages: keys go to the focused widget, as a person's would."""
    from PySide6.QtTest import QTest
    from PySide6.QtWidgets import QApplication, QPushButton

    repo = "acme/Keyboard-Tiny-GGUF"
    gguf = write_tiny_gguf(tmp_path / "src" / "kb-tiny-Q8_0.gguf", CHAT)
    fake_hub.add_repo(repo, {"kb-tiny-Q8_0.gguf": gguf.read_bytes()}, tags=["gguf", "text-generation"])

    def focused() -> Any:
        return QApplication.focusWidget()

    def key(k: Any, mod: Any = Qt.KeyboardModifier.NoModifier) -> None:
        target = focused() or QApplication.activeWindow()
        assert target is not None, "nothing has the keyboard focus"
        QTest.keyClick(target, k, mod)

    async def tab_to(match: Callable[[Any], bool], what: str, *, limit: int = 60) -> Any:
        reached = []
        for _ in range(limit):
            key(Qt.Key.Key_Tab)
            await asyncio.sleep(0)
            w = focused()
            if isinstance(w, QPushButton):  # every button Tab reaches says what it does
                name = w.accessibleName() or w.text()
                assert name.strip(), f"a button with no accessible name: {w!r}"
                reached.append(name)
            if w is not None and match(w):
                return w
        raise AssertionError(f"Tab never reached {what}; buttons reached: {reached}")

    async def body(desk: Any) -> None:
        w = desk.window
        w.activateWindow()
        await asyncio.sleep(0.1)
        done = asyncio.get_running_loop().create_future()
        desk.bridge.received.connect(
            lambda kind, _d: done.done() or kind != "download.completed" or done.set_result(None)
        )
        QTest.keyClick(w, Qt.Key.Key_1, Qt.KeyboardModifier.ControlModifier)  # Discover
        QTest.keyClick(w, Qt.Key.Key_F, Qt.KeyboardModifier.ControlModifier)  # its search box
        disc = desk.window.pages["Discover"]
        assert focused() is disc.query
        QTest.keyClicks(focused(), "Keyboard")
        key(Qt.Key.Key_Return)
        await desk.tasks.settle()
        assert disc.results.rowCount() == 1
        await tab_to(lambda x: x is disc.results, "the results table")
        key(Qt.Key.Key_Down)  # arrows move inside the table: the first result opens
        await desk.tasks.settle()
        assert disc.detail is not None and disc.detail["id"] == repo
        button = await tab_to(
            lambda x: isinstance(x, QPushButton) and x.text() == "Download" and disc.quants.isAncestorOf(x),
            "the Download button in the files table",
        )
        assert button.accessibleName() == "Download Q8_0", button.accessibleName()
        key(Qt.Key.Key_Space)
        await asyncio.wait_for(done, 60)
        await desk.tasks.settle()
        # Why? in the same table is reached the same way
        why = await tab_to(
            lambda x: isinstance(x, QPushButton) and x.text() == "Why?" and disc.quants.isAncestorOf(x),
            "the Why? button",
        )
        assert why.accessibleName() == "Why Q8_0 fits or not"
        # the chat: Ctrl+3, Ctrl+N, type, Ctrl+Enter
        QTest.keyClick(w, Qt.Key.Key_3, Qt.KeyboardModifier.ControlModifier)
        chat = desk.window.pages["Chat"]
        QTest.keyClick(w, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
        assert focused() is chat.input
        assert chat.model.currentData() is not None and "kb-tiny" in str(chat.model.currentData()).lower()
        chat.max_tokens.setValue(8)
        QTest.keyClicks(focused(), "Hello")
        key(Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
        for _ in range(600):
            await asyncio.sleep(0.1)
            if chat.stream_task is None:
                break
        messages = desk.chats.messages(chat.current)
        assert [m.role for m in messages] == ["user", "assistant"], [(m.role, m.content) for m in messages]
        assert messages[0].content == "Hello" and messages[1].meta.get("tokens"), messages[1]

    run_desk(qloop, qapp, isolated_env, tmp_path / "models", body, timeout=150)
