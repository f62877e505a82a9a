"""The desktop app: the Runtime and the server in-process, the main window, the tray, single instance.

`Desktop` is entered once under qasync and left when Quit sets `quit_event` (never app.quit() mid-await).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from types import TracebackType
from typing import Any

import shiboken6
from PySide6.QtWidgets import QApplication, QSystemTrayIcon

from app.chat.store import ChatStore
from app.core.errors import SwitchyardError
from app.core.paths import Paths
from app.core.settings import Settings
from app.runtime import Runtime
from app.ui.asyncs import Tasks
from app.ui.bridge import Bridge
from app.ui.server_ctl import ServerControl
from app.ui.single import InstanceServer
from app.ui.state import UiState
from app.ui.tray import Tray
from app.ui.window import MainWindow
from app.ui.wording import for_window

log = logging.getLogger("switchyard.ui")


class Desktop:
    window: MainWindow
    tray: Tray

    def __init__(self, paths: Paths, settings: Settings, *, qapp: QApplication) -> None:
        self.paths = paths
        self.settings = settings
        self.qapp = qapp
        self.tasks = Tasks()
        self.quit_event = asyncio.Event()
        self.state = UiState(paths.home / "ui.json")
        self.notices: list[tuple[str, str]] = []
        self.closing = False  # every notification shown (the tray may not exist)

    async def __aenter__(self) -> Desktop:
        # the catalog's first scan reads model headers: off the UI thread
        self.runtime = await asyncio.to_thread(Runtime, settings=self.settings, paths=self.paths)
        self.server = ServerControl(self.runtime, self.paths)
        await self.server.setup()
        try:
            await self._build()
        except BaseException:  # a window that cannot be built must not leave engines or the socket behind
            await self.server.close()
            raise
        if self.settings.server.start_server_with_app:
            with contextlib.suppress(SwitchyardError):  # the Server page and status bar show why
                await self.server.start()
        # drawn now, not when the bus event arrives a loop turn later
        self.window._server_changed()
        self.window.pages["Server"].refresh_state()  # type: ignore[attr-defined]
        self.tray.rebuild()
        self.window.restore()
        self.window.show()
        return self

    async def _build(self) -> None:
        from app.ui import theme

        self.bridge = Bridge(self.runtime.bus)
        await self.bridge.start()
        self.hub = self.runtime.hub  # follows settings applied while running (the hub endpoint)
        self.chats = ChatStore(self.paths.home / "chat.db")
        self.theme = theme.apply(self.qapp)
        self.theme.set(str(self.state.get("theme", "system")))
        self.window = MainWindow(self)
        self.tray = Tray(self)
        self.instance = InstanceServer(self.paths, self.bring_forward)
        self.bridge.received.connect(self._on_event)

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.closing = True
        self.window.save_state()
        await self.bridge.stop()  # widgets get no more events while the Runtime shuts down
        self.tasks.cancel_all()
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            await self.tasks.settle(limit=5)
        self.instance.close()
        self.tray.hide()
        await self.server.close()  # stops every lane
        self.chats.close()
        self.window.quitting = True
        self.window.close()
        await self._release_qt()

    async def _release_qt(self) -> None:
        """Before Quit returns: every Python callback disconnected from Qt's side (the bridge's signal,
        the tray's, the single-instance socket's, the tray menu's actions), and every Qt object this
        Desktop made without a parent deleted here, on the GUI thread.

        Those objects (the window, the tray icon and its menus, the bridge, the single-instance socket)
        are owned by their Python wrappers, and the wrappers sit in reference cycles with this Desktop
        (the tray's `desk`, the pages' slots). A cycle is freed by Python's cyclic garbage collector on
        whichever thread crosses its threshold: often a worker of `asyncio.to_thread` (a catalog scan,
        an explain) of the next Desktop in the same process. Qt objects deleted from that thread ("QObject:
        Timers cannot be stopped from another thread") crashed the tests' processes with SIGSEGV at
        their second to fourth Desktop. Deleted now, a wrapper the collector frees later holds nothing."""
        for signal in (self.bridge.received, self.tray.activated, self.instance.server.newConnection):
            with contextlib.suppress(RuntimeError, TypeError):
                signal.disconnect()
        self.tray.menu.clear()  # its actions hold lambdas over this Desktop
        self.window.deleteLater()
        for _ in range(3):  # the loop deletes the window (and its pages, dialogs, timers) at once
            await asyncio.sleep(0)
        for obj in (*self.tray.submenus, self.tray.menu, self.tray, self.instance.server, self.bridge):
            if shiboken6.isValid(obj):
                shiboken6.delete(obj)
        if shiboken6.isValid(self.window):  # not deleted by the loop (it did not run): delete it here
            shiboken6.delete(self.window)

    async def run(self) -> None:
        await self.quit_event.wait()

    def quit(self) -> None:
        self.quit_event.set()

    def bring_forward(self) -> None:
        self.window.showNormal()
        self.window.raise_()
        self.window.activateWindow()

    def _on_event(self, kind: str, data: dict[str, Any]) -> None:
        if kind == "lane.state" and data.get("state") == "failed":
            reason = data.get("reason") or "see its log on the Lanes page"
            self.notify(f"{data.get('model')} stopped", f"The engine failed: {reason}", warn=True)

    def notify(self, title: str, text: str, *, warn: bool = False) -> None:
        text = for_window(text)  # the window's buttons, not the command line
        self.notices.append((title, text))
        icon = QSystemTrayIcon.MessageIcon.Warning if warn else QSystemTrayIcon.MessageIcon.Information
        if self.tray.isVisible():
            self.tray.showMessage(title, text, icon, 6000)
        self.window.statusBar().showMessage(f"{title}: {text}", 10000)

    def spawn(self, coro: Any, **kw: Any) -> asyncio.Task[Any]:
        if self.closing:  # nothing new starts while quitting
            coro.close()
            fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            fut.set_result(None)
            return fut  # type: ignore[return-value]
        return self.tasks.spawn(coro, **kw)
