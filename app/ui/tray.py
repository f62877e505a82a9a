"""The tray icon: server state in the icon; Start/Stop, loaded models with Unload, Copy address, Quit."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from PySide6.QtGui import QAction, QGuiApplication
from PySide6.QtWidgets import QMenu, QSystemTrayIcon

from app.core.notify import tray_message
from app.ui.icons import app_icon

if TYPE_CHECKING:
    from app.ui.context import Desk


class Tray(QSystemTrayIcon):
    def __init__(self, desk: Desk) -> None:
        super().__init__(app_icon(running=False))
        self.desk = desk
        self.menu = QMenu()
        # each loaded model's submenu, held here: some PySide6 releases let Python own a submenu made
        # by addMenu(title), so it vanished when rebuild() returned; the old ones go at each rebuild
        self.submenus: list[QMenu] = []
        self.setContextMenu(self.menu)
        self.activated.connect(self._activated)
        desk.bridge.received.connect(self._on_event)
        self.rebuild()
        if QSystemTrayIcon.isSystemTrayAvailable():
            self.show()

    def _on_event(self, kind: str, data: Any) -> None:
        if kind == "server.state" or kind.startswith("lane."):
            self.rebuild()
        elif said := tray_message(kind, data):  # job ends and updates (the server publishes each once)
            self.desk.notify(said[0], said[1], warn=said[2])

    def _activated(self, reason: QSystemTrayIcon.ActivationReason) -> None:
        if reason in (QSystemTrayIcon.ActivationReason.Trigger, QSystemTrayIcon.ActivationReason.DoubleClick):
            self.desk.bring_forward()

    def rebuild(self) -> None:
        srv = self.desk.server
        self.setIcon(app_icon(running=srv.running))
        self.setToolTip(f"Switchyard: {'serving at ' + str(srv.url) if srv.running else 'server stopped'}")
        m = self.menu
        m.clear()
        for old in self.submenus:
            old.deleteLater()
        self.submenus = []
        state = m.addAction(f"Server running at {srv.url}" if srv.running else "Server stopped")
        state.setEnabled(False)
        if srv.running:
            m.addAction("Stop server", lambda: self.desk.spawn(srv.stop()))
            m.addAction("Copy address", self.copy_address)
        else:
            m.addAction("Start server", lambda: self.desk.spawn(srv.start(), report=self._report))
        m.addSeparator()
        loaded = self.desk.runtime.live_lanes()
        if loaded:
            for lane in loaded:
                sub = QMenu(f"{lane.model_id} ({lane.state})", m)
                sub.addAction("Unload", functools.partial(self.unload, lane.model_id))
                m.addMenu(sub)
                self.submenus.append(sub)
        else:
            m.addAction("No model loaded").setEnabled(False)
        m.addSeparator()
        m.addAction("Open window", self.desk.bring_forward)
        quit_action = QAction("Quit", m)
        quit_action.triggered.connect(self.desk.quit)
        m.addAction(quit_action)

    def unload(self, model_id: str) -> None:
        self.desk.spawn(self.desk.runtime.unload(model_id))

    def copy_address(self) -> None:
        if self.desk.server.url:
            QGuiApplication.clipboard().setText(self.desk.server.url + "/v1")

    def _report(self, msg: str) -> None:
        self.desk.notify("Server not started", msg, warn=True)
