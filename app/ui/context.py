"""What the window, the tray and every page are handed: the desktop's services, seen through a Protocol.

`Desktop` builds the window and the tray and so imports them; they in turn need the Desktop's parts. Typing
them against this Protocol instead of `Desktop` keeps the imports one-way (desktop -> window -> pages ->
context), which tests/structure/test_import_cycles.py checks. Members are read-only: nothing but Desktop
assigns them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from PySide6.QtWidgets import QApplication, QSystemTrayIcon, QWidget

    from app.chat.store import ChatStore
    from app.core.paths import Paths
    from app.hub.browse import Hub
    from app.runtime import Runtime
    from app.ui.bridge import Bridge
    from app.ui.server_ctl import ServerControl
    from app.ui.state import UiState
    from app.ui.theme import Theme


class PageHost(Protocol):
    """The main window as a page sees it: it can bring another page forward."""

    def show_page(self, name: str) -> QWidget: ...


class Desk(Protocol):
    """The running desktop app: its Runtime and server, the bus bridge, stores, and the top-level widgets."""

    @property
    def paths(self) -> Paths: ...
    @property
    def qapp(self) -> QApplication: ...
    @property
    def runtime(self) -> Runtime: ...
    @property
    def server(self) -> ServerControl: ...
    @property
    def hub(self) -> Hub: ...
    @property
    def chats(self) -> ChatStore: ...
    @property
    def bridge(self) -> Bridge: ...
    @property
    def state(self) -> UiState: ...
    @property
    def theme(self) -> Theme: ...
    @property
    def window(self) -> PageHost: ...
    @property
    def tray(self) -> QSystemTrayIcon: ...

    def spawn(
        self,
        coro: Coroutine[Any, Any, Any],
        *,
        disable: Iterable[QWidget] = (),
        report: Callable[[str], None] | None = None,
    ) -> asyncio.Task[Any]: ...

    def notify(self, title: str, text: str, *, warn: bool = False) -> None: ...

    def quit(self) -> None: ...

    def bring_forward(self) -> None: ...
