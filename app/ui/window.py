"""The main window: a sidebar of pages, a status bar with the server's state, keyboard shortcuts."""

from __future__ import annotations

import base64
import time
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QByteArray, QEvent, QSize, Qt
from PySide6.QtGui import QCloseEvent, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMainWindow,
    QMessageBox,
    QPushButton,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from app.ui.icons import app_icon
from app.ui.pages.registry import PAGES as PAGE_CLASSES
from app.ui.pages.registry import TITLES

if TYPE_CHECKING:
    from app.ui.context import Desk

RESCAN_EVERY_S = 2.0
PAGES = TITLES  # the sidebar's names, from the page registry (app/ui/pages/registry.py)
# listed in the About box (and docs/desktop.md); the keys themselves are bound in MainWindow.__init__
SHORTCUTS = (
    (f"Ctrl+1 … Ctrl+{len(TITLES)}", "the pages, in sidebar order"),
    ("Ctrl+F", "the search box of this page"),
    ("Ctrl+N", "a new conversation"),
    ("Ctrl+Enter", "send the message (Chat)"),
    ("F9 (held)", "talk: record while held, then send what was heard (Chat)"),
    ("Tab, Shift+Tab", "the next or previous control, buttons in tables included"),
    ("Arrow keys", "move inside a list or table; Space presses the focused button"),
    ("Ctrl+W", "close the window to the tray"),
    ("Ctrl+Q", "quit: stop the server and every lane"),
    ("F1", "this box"),
)


class MainWindow(QMainWindow):
    def __init__(self, desk: Desk) -> None:
        super().__init__()
        self.desk = desk
        self.quitting = False
        self.setWindowTitle("Switchyard")
        self.setWindowIcon(app_icon(running=True))
        self.sidebar = QListWidget()
        self.sidebar.setFixedWidth(150)
        self.sidebar.setIconSize(QSize(0, 0))
        self.stack = QStackedWidget()
        self.pages: dict[str, QWidget] = {}
        for name, make in zip(PAGES, PAGE_CLASSES, strict=True):
            page = make(desk)
            self.pages[name] = page
            self.stack.addWidget(page)
            item = QListWidgetItem(name)
            item.setSizeHint(QSize(140, 34))
            self.sidebar.addItem(item)
        self.sidebar.currentRowChanged.connect(self.stack.setCurrentIndex)
        side = QWidget()
        side_lay = QVBoxLayout(side)
        side_lay.setContentsMargins(0, 0, 0, 4)
        side_lay.addWidget(self.sidebar, 1)
        self.about_btn = QPushButton("About Switchyard")
        self.about_btn.setFlat(True)
        self.about_btn.setFixedWidth(150)
        self.about_btn.clicked.connect(self.show_about)
        side_lay.addWidget(self.about_btn)
        body = QWidget()
        lay = QHBoxLayout(body)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(0)
        lay.addWidget(side)
        lay.addWidget(self.stack, 1)
        self.setCentralWidget(body)
        self.server_label = QLabel()
        self.statusBar().addPermanentWidget(self.server_label)
        desk.bridge.received.connect(self._on_event)
        self._server_changed()
        for i in range(len(PAGES)):
            QShortcut(QKeySequence(f"Ctrl+{i + 1}"), self, lambda i=i: self.show_page(PAGES[i]))
        QShortcut(QKeySequence("Ctrl+Q"), self, desk.quit)
        QShortcut(QKeySequence("Ctrl+W"), self, self.close)
        QShortcut(QKeySequence("Ctrl+F"), self, self._find)
        QShortcut(QKeySequence("Ctrl+N"), self, self._new_chat)
        QShortcut(QKeySequence("F1"), self, self.show_about)
        self._about: QMessageBox | None = None
        self._rescanned = 0.0  # when the models folders were last read for the window coming back

    # ---- about ------------------------------------------------------------------------------------
    def about_text(self) -> str:
        from app import __version__

        home = self.desk.runtime.paths.home
        return (
            f"<b>Switchyard {__version__}</b><br>Local AI models behind one OpenAI-compatible endpoint, "
            f"each run by a real upstream engine.<br><br>Data folder: {home}<br>"
            f"Server: {self.desk.server.url if self.desk.server.running else 'stopped'}<br>"
            "Licence: Apache-2.0<br><br><b>Keyboard</b><table>"
            + "".join(f"<tr><td>{k}&nbsp;&nbsp;</td><td>{what}</td></tr>" for k, what in SHORTCUTS)
            + "</table>"
        )

    def show_about(self) -> QMessageBox:
        """A non-modal box (`open()`, never `exec()`): the event loop keeps serving while it shows."""
        if self._about is None:
            self._about = QMessageBox(QMessageBox.Icon.Information, "About Switchyard", "", parent=self)
            self._about.setIconPixmap(app_icon(running=True).pixmap(64, 64))
        self._about.setText(self.about_text())
        self._about.open()
        return self._about

    # ---- pages ------------------------------------------------------------------------------------
    def show_page(self, name: str) -> QWidget:
        self.sidebar.setCurrentRow(PAGES.index(name))
        return self.pages[name]

    def current_page(self) -> str:
        return PAGES[max(self.sidebar.currentRow(), 0)]

    def _find(self) -> None:
        page = self.pages[self.current_page()]
        focus = getattr(page, "focus_search", None)
        if focus is None:
            page = self.show_page("Discover")
            focus = page.focus_search  # type: ignore[attr-defined]
        focus()

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.ActivationChange and self.isActiveWindow():
            self.rescan_models()

    def rescan_models(self) -> None:
        """A file dropped into a models folder while the window was in the background shows up when the
        window comes back (Library, and the Chat list through library.refreshed); at most every 2 s."""
        now = time.monotonic()
        if now - self._rescanned < RESCAN_EVERY_S:
            return
        self._rescanned = now
        self.pages["Library"].refresh()  # type: ignore[attr-defined]

    def _new_chat(self) -> None:
        self.show_page("Chat").new_conversation()  # type: ignore[attr-defined]

    # ---- events -----------------------------------------------------------------------------------
    def _on_event(self, kind: str, _data: Any) -> None:
        if kind == "server.state":
            self._server_changed()

    def _server_changed(self) -> None:
        srv = self.desk.server
        if srv.running:
            self.server_label.setText(f"Server running at {srv.url}")
        elif srv.error:
            self.server_label.setText(f"Server not running: {srv.error}")
        else:
            self.server_label.setText("Server stopped (start it on the Server page or from the tray)")

    # ---- state ------------------------------------------------------------------------------------
    def restore(self) -> None:
        st = self.desk.state
        geo = st.get("geometry")
        if isinstance(geo, str):
            self.restoreGeometry(QByteArray(base64.b64decode(geo)))
        else:
            self.resize(1180, 760)
        last = st.get("page")
        self.show_page(last if last in PAGES else "Discover")

    def save_state(self) -> None:
        st = self.desk.state
        st.data["geometry"] = base64.b64encode(bytes(self.saveGeometry().data())).decode()
        st.data["page"] = self.current_page()
        st.save()

    def closeEvent(self, event: QCloseEvent) -> None:
        if self.quitting:
            event.accept()
            return
        # closing keeps the app (and the local API) running; Quit is in the tray menu or Ctrl+Q
        event.ignore()
        self.save_state()
        self.hide()
        if not self.desk.state.get("closed_to_tray_noted"):
            self.desk.state.set("closed_to_tray_noted", True)
            where = (
                "the tray icon"
                if self.desk.tray.isVisible()
                else "starting Switchyard again from the applications menu"
            )
            self.desk.notify(
                "Switchyard is still running",
                f"The server keeps answering. Open the window from {where}; Quit stops it.",
            )

    def keyPressEvent(self, event: Any) -> None:
        if event.key() == Qt.Key.Key_Escape and self.isFullScreen():
            self.showNormal()
        super().keyPressEvent(event)
