"""Lanes: every lane's state, model, pid, port, memory and uptime, its live log, Restart/Stop; and the
engines, with their versions and Install / Update / Rollback (app/ui/engines_view.py)."""

from __future__ import annotations

import html
import time
from typing import Any

from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QTableWidgetItem

from app.ui import fmt
from app.ui.engines_view import EnginesPanel
from app.ui.pages import Page, table


class LanesPage(Page):
    title = "Lanes"
    hint = (
        "Each loaded model runs in its own engine process (a lane). A lane starts when a model is first used."
    )

    def __init__(self, desk: Any) -> None:
        super().__init__(desk)
        self.table = table(
            ["Model", "State", "Engine", "PID", "Port", "Memory", "Uptime", "Error"], stretch=7
        )
        self.table.itemSelectionChanged.connect(self.show_log)
        row = QHBoxLayout()
        self.restart_btn = QPushButton("Restart")
        self.restart_btn.clicked.connect(self.restart)
        self.stop_btn = QPushButton("Stop")
        self.stop_btn.clicked.connect(self.stop)
        row.addStretch(1)
        row.addWidget(self.restart_btn)
        row.addWidget(self.stop_btn)
        self.root.addLayout(row)
        self.root.addWidget(self.status)
        self.root.addWidget(self.table, 1)
        self.empty = QLabel("No lanes yet: load a model on the Library page, or send a chat message.")
        self.root.addWidget(self.empty)
        # remote endpoints are lanes too, run elsewhere: their state comes from `remote.*` events
        self.remotes = QLabel()
        self.remotes.setWordWrap(True)
        self.root.addWidget(self.remotes)
        self.engines = EnginesPanel(desk, report=self.report)
        self.root.addWidget(self.engines, 2)
        self.root.addWidget(QLabel("<b>Log of the selected lane</b>"))
        self.log = QPlainTextEdit()
        self.log.setReadOnly(True)
        self.log.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.log.setPlaceholderText("Select a lane to see its engine's output.")
        self.root.addWidget(self.log, 1)
        self.ids: list[str] = []
        desk.bridge.received.connect(self._on_event)
        self.refresh()
        self.show_remotes()

    def _on_event(self, kind: str, _data: Any) -> None:
        if kind.startswith("lane."):
            self.refresh()
        elif kind.startswith("remote."):
            self.show_remotes()
        elif kind == "hardware.sample" and self.isVisible():
            # the 1 Hz sample doubles as the log's tick: no timer of our own, nothing while hidden
            self.show_log()
            self.refresh()

    def refresh(self) -> None:
        snaps = self.desk.runtime.supervisor.snapshot()
        keep = self.selected()
        self.ids = [str(s["id"]) for s in snaps]
        self.table.setRowCount(len(snaps))
        for i, s in enumerate(snaps):
            measured: Any = s.get("measured") or {}
            mem = measured.get("rss_bytes") if isinstance(measured, dict) else None
            up = (
                time.time() - float(str(s["started_at"]))
                if s.get("started_at") and s["state"] == "ready"
                else None
            )
            cells = [
                s["model"],
                s["state"],
                str(s.get("runtime") or s.get("engine")),
                str(s.get("pid") or "-"),
                str(s.get("port") or "-"),
                fmt.size(mem) if mem else "-",
                fmt.duration(up),
                str(s.get("error") or ""),
            ]
            for j, c in enumerate(cells):
                item = QTableWidgetItem(str(c))
                item.setToolTip(str(c))
                self.table.setItem(i, j, item)
            if s["id"] == keep:
                self.table.selectRow(i)
        self.empty.setVisible(not snaps)

    def show_remotes(self) -> None:
        remotes = getattr(self.desk.runtime, "remotes", None)
        rows = remotes.public() if remotes is not None else []
        if not rows:
            self.remotes.setText(
                "Remote endpoints: none. Add one with <tt>switchyard remote add NAME URL</tt> "
                "to route <tt>NAME/MODEL</tt> to another machine."
            )
            return
        parts = []
        for r in rows:
            models = len(r.get("models") or [])
            why = f": {r['error']}" if r.get("error") else ""
            text = f"({r['url']}) {r['state']}{why}, {models} model(s)"
            parts.append(f"<b>{html.escape(str(r['name']))}</b> {html.escape(text)}")
        self.remotes.setText("Remote endpoints: " + "; ".join(parts))

    def selected(self) -> str | None:
        rows = self.table.selectionModel().selectedRows()
        return self.ids[rows[0].row()] if rows and rows[0].row() < len(self.ids) else None

    def show_log(self) -> None:
        lid = self.selected()
        lane = self.desk.runtime.supervisor.lanes.get(lid) if lid else None
        if lane is None:
            return
        text = "\n".join(lane.ring.tail(300))
        if text != self.log.toPlainText():
            self.log.setPlainText(text)
            self.log.verticalScrollBar().setValue(self.log.verticalScrollBar().maximum())

    def _model(self) -> str | None:
        lid = self.selected()
        lane = self.desk.runtime.supervisor.lanes.get(lid) if lid else None
        if lane is None:
            self.report("Select a lane first.")
            return None
        return str(lane.model_id)

    def stop(self) -> None:
        mid = self._model()
        if mid:
            self.desk.spawn(
                self.desk.runtime.supervisor.unload(mid), disable=[self.stop_btn], report=self.report
            )

    def restart(self) -> None:
        mid = self._model()
        if mid:

            async def again() -> None:
                await self.desk.runtime.supervisor.unload(mid)
                await self.desk.runtime.supervisor.load(mid)

            self.desk.spawn(again(), disable=[self.restart_btn], report=self.report)
