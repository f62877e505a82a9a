"""The shell: a busy port is reported and never shown as started; a second launch brings the first window
forward; the last page and geometry come back; Stop/Start from the tray menu."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
pytest.importorskip("PySide6")
qasync = pytest.importorskip("qasync")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtTest import QTest  # noqa: E402

from app.core.paths import Paths  # noqa: E402
from app.core.settings import Settings  # noqa: E402


def test_busy_port_single_instance_state_and_tray(
    qloop: asyncio.AbstractEventLoop,
    qapp: Any,
    tmp_path: Path,
    isolated_env: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from app.ui.desktop import Desktop
    from app.ui.single import forward_to_running

    paths = Paths(home=isolated_env)
    xdg = tmp_path / "xdg"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(xdg))
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    busy = holder.getsockname()[1]

    async def first() -> None:
        settings = Settings.flat(port=busy, models_dirs=(tmp_path / "models",), monitor_interval_s=0)
        async with Desktop(paths, settings, qapp=qapp) as desk:
            assert not desk.server.running
            assert f"port {busy}" in (desk.server.error or "") and "in use" in (desk.server.error or "")
            assert "Server not running" in desk.window.server_label.text()
            page = desk.window.show_page("Server")
            assert "Stopped" in page.state.text() and page.toggle.text() == "Start server"
            assert [a.text() for a in desk.tray.menu.actions()][:2] == ["Server stopped", "Start server"]
            # a second launch: it finds this one and asks it to come forward
            desk.window.hide()
            assert forward_to_running(paths)
            await _until(desk.window.isVisible)
            # keyboard: Ctrl+3 is Chat, Ctrl+N a new conversation, Ctrl+F the search box of the page
            desk.window.activateWindow()
            QTest.keyClick(desk.window, Qt.Key.Key_3, Qt.KeyboardModifier.ControlModifier)
            assert desk.window.current_page() == "Chat"
            QTest.keyClick(desk.window, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
            assert len(desk.chats.conversations()) == 1
            QTest.keyClick(desk.window, Qt.Key.Key_1, Qt.KeyboardModifier.ControlModifier)
            QTest.keyClick(desk.window, Qt.Key.Key_F, Qt.KeyboardModifier.ControlModifier)
            assert desk.qapp.focusWidget() is desk.window.pages["Discover"].query
            desk.window.show_page("Lanes")
            assert "No lanes yet" in page.desk.window.pages["Lanes"].empty.text()
            # F1 / the sidebar button: the About box names the version from pyproject, without blocking
            QTest.keyClick(desk.window, Qt.Key.Key_F1)
            about = desk.window._about
            assert about is not None and about.isVisible()  # shown with open(): the loop keeps running
            from app import __version__

            assert f"Switchyard {__version__}" in about.text() and str(paths.home) in about.text()
            about.close()
            desk.quit()
            await desk.run()
        assert not forward_to_running(paths, timeout_ms=200)  # gone with the window

    async def second() -> None:
        holder.close()
        settings = Settings.flat(port=busy, models_dirs=(tmp_path / "models",), monitor_interval_s=0)
        async with Desktop(paths, settings, qapp=qapp) as desk:
            assert desk.window.current_page() == "Lanes"  # remembered
            assert desk.server.running and desk.server.url == f"http://127.0.0.1:{busy}"
            stop = next(a for a in desk.tray.menu.actions() if a.text() == "Stop server")
            stop.trigger()
            await desk.tasks.settle()
            assert not desk.server.running and not paths.server_file.exists()
            start = next(a for a in desk.tray.menu.actions() if a.text() == "Start server")
            start.trigger()
            await desk.tasks.settle()
            assert desk.server.running and paths.server_file.exists()
            # the port is editable: a busy one is reported and not shown as started; a free one works
            page = desk.window.pages["Server"]
            blocker = socket.socket()
            blocker.bind(("127.0.0.1", 0))
            blocker.listen()
            taken = blocker.getsockname()[1]
            page.apply_port(taken)
            await desk.tasks.settle()
            assert not desk.server.running and f"port {taken}" in page.status.text()
            assert "Stopped" in page.state.text()
            blocker.close()
            page.apply_port(0)
            await desk.tasks.settle()
            assert desk.server.running and page.address.text().endswith("/v1")
            assert '"port": 0' in paths.settings_file.read_text()
            # start on login: the checkbox writes and removes the XDG autostart entry
            settings_page = desk.window.pages["Settings"]
            settings_page.login.click()
            entry = xdg / "autostart" / "switchyard.desktop"
            assert entry.exists() and "-m app gui" in entry.read_text()
            settings_page.login.click()
            assert not entry.exists()
            # theme: dark now, kept in ui.json, and back to following the system
            settings_page.theme.setCurrentText("dark")
            assert qapp.palette().window().color().name() == "#2b2d30"
            assert '"theme": "dark"' in (paths.home / "ui.json").read_text()
            settings_page.theme.setCurrentText("light")
            assert qapp.palette().window().color().name() != "#2b2d30"
            settings_page.theme.setCurrentText("system")
            desk.quit()
            await desk.run()

    qloop.run_until_complete(asyncio.wait_for(first(), 60))
    qloop.run_until_complete(asyncio.wait_for(second(), 60))


async def _until(check: Any, limit: float = 10) -> None:
    deadline = asyncio.get_running_loop().time() + limit
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)
