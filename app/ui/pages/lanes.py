"""Lanes: every lane's state (generating while it serves requests), model, pid, port, memory (measured and
predicted) and uptime, its live log, Restart/Stop; remote endpoints, with a form to add one; and the
engines, with their versions and Install / Update / Rollback (app/ui/engines_view.py)."""

from __future__ import annotations

import html
import time
from functools import partial
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QTimer
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import (
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QTableWidgetItem,
    QWidget,
)

from app.ui import fmt
from app.ui.charts import LaneHistory, Sparkline
from app.ui.engines_view import EnginesPanel
from app.ui.pages import Page, table

if TYPE_CHECKING:
    from app.ui.context import Desk

STRIP_SECONDS = 300  # the lanes' strips show the last five minutes
TICK_MS = 500  # while the page is shown: a request starting or ending sends no event, so look this often


class LanesPage(Page):
    title = "Lanes"
    hint = (
        "Each loaded model runs in its own engine process (a lane). A lane starts when a model is first used."
    )

    def __init__(self, desk: Desk) -> None:
        super().__init__(desk)
        self.table = table(
            ["Model", "State", "Engine", "PID", "Port", "Memory", "Context", "Uptime", "Error"], stretch=8
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
        # per lane: tokens per second and memory over the last minutes (history fed by events below)
        self.history = LaneHistory(span=STRIP_SECONDS)
        self.strips = QWidget()
        self.strips_grid = QGridLayout(self.strips)
        self.strips_grid.setContentsMargins(0, 0, 0, 0)
        self.strips_grid.setVerticalSpacing(2)
        self.strip_models: list[str] = []
        self.root.addWidget(self.strips)
        self.empty = QLabel("No lanes yet: load a model on the Library page, or send a chat message.")
        self.root.addWidget(self.empty)
        # remote endpoints are lanes too, run elsewhere: their state comes from `remote.*` events
        self.remotes = QLabel()
        self.remotes.setWordWrap(True)
        self.root.addWidget(self.remotes)
        add = QHBoxLayout()
        self.remote_name = QLineEdit()
        self.remote_name.setPlaceholderText("Name (e.g. desktop)")
        self.remote_url = QLineEdit()
        self.remote_url.setPlaceholderText("Address (e.g. http://192.168.1.20:8080/v1)")
        self.remote_key = QLineEdit()
        self.remote_key.setPlaceholderText("API key, if it asks for one")
        self.remote_key.setEchoMode(QLineEdit.EchoMode.Password)
        self.remote_add = QPushButton("Add remote")
        self.remote_add.clicked.connect(self.add_remote)
        for w in (self.remote_name, self.remote_url, self.remote_key):
            add.addWidget(w, 1)
        add.addWidget(self.remote_add)
        self.root.addLayout(add)
        # conversations saved when llama.cpp lanes stopped (lanes/bank/sessions.py), restored when they return
        self.bank = QLabel()
        self.bank.setWordWrap(True)
        self.root.addWidget(self.bank)
        self.engines = EnginesPanel(desk, report=self.report)
        self.root.addWidget(self.engines, 2)
        self.root.addWidget(QLabel("<b>Log of the selected lane</b>"))
        self.log = QPlainTextEdit()
        self.log.setReadOnly(True)
        self.log.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.log.setPlaceholderText("Select a lane to see its engine's output.")
        self.root.addWidget(self.log, 1)
        self.ids: list[str] = []
        self.ticker = QTimer(self)
        self.ticker.setInterval(TICK_MS)
        self.ticker.timeout.connect(self.tick)
        desk.bridge.received.connect(self._on_event)
        self.refresh()
        self.show_remotes()
        self.show_bank()

    def _on_event(self, kind: str, data: Any) -> None:
        if kind == "request.done" and data.get("output_tokens") and data.get("model"):
            self.history.add_request(
                str(data["model"]), tokens=int(data["output_tokens"]), seconds=float(data["seconds"])
            )
        elif kind == "hardware.sample":
            self.record_memory()
        if kind.startswith("lane."):
            self.refresh()
            if kind == "lane.state":
                self.show_bank()  # a stopping lane has just saved its conversations
        elif kind.startswith("remote."):
            self.show_remotes()

    def showEvent(self, event: Any) -> None:
        super().showEvent(event)
        self.tick()
        self.ticker.start()

    def hideEvent(self, event: Any) -> None:
        super().hideEvent(event)
        self.ticker.stop()  # nothing while hidden

    def tick(self) -> None:
        """The table and the selected lane's log, as they are now (a lane's requests come and go unseen)."""
        self.refresh()
        self.show_log()

    def refresh(self) -> None:
        snaps = self.desk.runtime.lanes_snapshot()
        keep = self.selected()
        self.ids = [str(s["id"]) for s in snaps]
        self.table.setRowCount(len(snaps))
        for i, s in enumerate(snaps):
            up = (
                time.time() - float(str(s["started_at"]))
                if s.get("started_at") and s["state"] == "ready"
                else None
            )
            busy = int(str(s.get("in_flight") or 0))
            state = f"generating ({busy})" if s["state"] == "ready" and busy else str(s["state"])
            cells = [
                s["model"],
                state,
                str(s.get("runtime") or s.get("engine")),
                str(s.get("pid") or "-"),
                str(s.get("port") or "-"),
                _memory(s),
                _context(s),
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
        self.show_strips([str(s["model"]) for s in snaps if s["state"] == "ready"])

    def record_memory(self) -> None:
        """One memory reading per ready lane per hardware tick (visible or not: the strip keeps its past)."""
        ready = [s for s in self.desk.runtime.lanes_snapshot() if s["state"] == "ready"]
        for s in ready:
            used = _memory_bytes(s)
            if used:
                self.history.add_memory(str(s["model"]), used)
        self.history.forget({str(s["model"]) for s in ready})

    def show_strips(self, models: list[str]) -> None:
        """A row per ready lane; rebuilt only when the set of lanes changes (the lines repaint each tick)."""
        if models == self.strip_models:
            for line in self.strips.findChildren(Sparkline):
                line.update()
            return
        self.strip_models = models
        while (item := self.strips_grid.takeAt(0)) is not None:
            if (w := item.widget()) is not None:
                w.deleteLater()
        if models:
            head = QLabel(f"<b>Last {STRIP_SECONDS // 60} minutes</b>: generation speed and memory per lane")
            self.strips_grid.addWidget(head, 0, 0, 1, 3)
        for row, model in enumerate(models, start=1):
            self.strips_grid.addWidget(QLabel(model), row, 0)
            speed = Sparkline(partial(self.history.rates, model), color="#e53935", label=_rate)
            memory = Sparkline(partial(self.history.memory, model), color="#fb8c00", label=_bytes)
            self.strips_grid.addWidget(speed, row, 1)
            self.strips_grid.addWidget(memory, row, 2)
        self.strips_grid.setColumnStretch(1, 1)
        self.strips_grid.setColumnStretch(2, 1)
        self.strips.setVisible(bool(models))

    def show_bank(self) -> None:
        from app.lanes.bank.sessions import MIB, bank_summary

        settings = self.desk.runtime.settings
        if not settings.models.session_bank:
            self.bank.setText("Session bank: off (Settings: session_bank).")
            return
        summary = bank_summary(
            self.desk.runtime.paths.home, budget_bytes=settings.models.session_bank_budget_mib * MIB
        )
        n = len(summary["checkpoints"])
        self.bank.setText(
            f"Session bank: {n} saved conversation{'s' if n != 1 else ''}, "
            f"{fmt.size(summary['bytes'])} of {fmt.size(summary['budget_bytes'])}: a model swapped back in "
            "picks its conversations up where they were."
        )

    def show_remotes(self) -> None:
        remotes = getattr(self.desk.runtime, "remotes", None)
        rows = remotes.public() if remotes is not None else []
        if not rows:
            self.remotes.setText(
                "Remote endpoints: none. To use the models of a server on another computer, enter a name "
                "and its address below and press Add remote; its models then appear here as "
                "<tt>NAME/MODEL</tt>."
            )
            return
        parts = []
        for r in rows:
            models = len(r.get("models") or [])
            why = f": {r['error']}" if r.get("error") else ""
            text = f"({r['url']}) {r['state']}{why}, {models} model(s)"
            parts.append(f"<b>{html.escape(str(r['name']))}</b> {html.escape(text)}")
        self.remotes.setText("Remote endpoints: " + "; ".join(parts))

    def add_remote(self) -> None:
        """Register the remote in the form (checked at once; its state shows above)."""
        from app.core.secrets import Secret

        name, url, key = (w.text().strip() for w in (self.remote_name, self.remote_url, self.remote_key))
        if not name or not url:
            self.report(
                "Enter a name and the address of the other server (e.g. http://192.168.1.20:8080/v1)."
            )
            return
        remotes = getattr(self.desk.runtime, "remotes", None)
        if remotes is None:
            self.report("Remote endpoints are not available in this window.")
            return

        async def add() -> None:
            await remotes.add(name, url, key=Secret(key) if key else None, models=())
            for w in (self.remote_name, self.remote_url, self.remote_key):
                w.clear()
            self.clear_report()
            self.show_remotes()

        self.desk.spawn(add(), disable=[self.remote_add], report=self.report)

    def selected(self) -> str | None:
        rows = self.table.selectionModel().selectedRows()
        return self.ids[rows[0].row()] if rows and rows[0].row() < len(self.ids) else None

    def show_log(self) -> None:
        lid = self.selected()
        lane = self.desk.runtime.lane_of(lid) if lid else None
        if lane is None:
            return
        text = "\n".join(lane.ring.tail(300))
        if text != self.log.toPlainText():
            self.log.setPlainText(text)
            self.log.verticalScrollBar().setValue(self.log.verticalScrollBar().maximum())

    def _model(self) -> str | None:
        lid = self.selected()
        lane = self.desk.runtime.lane_of(lid) if lid else None
        if lane is None:
            self.report("Select a lane first.")
            return None
        return str(lane.model_id)

    def stop(self) -> None:
        mid = self._model()
        if mid:
            self.desk.spawn(self.desk.runtime.unload(mid), disable=[self.stop_btn], report=self.report)

    def restart(self) -> None:
        mid = self._model()
        if mid:

            async def again() -> None:
                await self.desk.runtime.unload(mid)
                await self.desk.runtime.load(mid)

            self.desk.spawn(again(), disable=[self.restart_btn], report=self.report)


def _memory(row: dict[str, Any]) -> str:
    """Both footprints: measured when the last load settled (what residency plans with, once there is
    one) and the plan's prediction; else the engine's resident memory now."""
    parts = []
    for source in ("measured", "predicted"):
        fp = row.get(f"footprint_{source}")
        if isinstance(fp, dict) and fp.get("total"):
            parts.append(f"{fmt.size(int(fp['total']))} {source}")
    if parts:
        return ", ".join(parts)
    measured = row.get("measured")
    rss = measured.get("rss_bytes") if isinstance(measured, dict) else None
    return fmt.size(rss) if rss else "-"


def _rate(v: float) -> str:
    return f"{v:.1f} tok/s"


def _bytes(v: float) -> str:
    return fmt.size(int(v))


def _memory_bytes(row: dict[str, Any]) -> int:
    """What the lane holds now: its resident memory, else the footprint residency plans with."""
    measured = row.get("measured")
    rss = measured.get("rss_bytes") if isinstance(measured, dict) else None
    if rss:
        return int(rss)
    fp = row.get("footprint")
    return int(fp.get("total") or 0) if isinstance(fp, dict) else 0


def _context(row: dict[str, Any]) -> str:
    """The window and how the engine's context memory is known ("runtime-managed" for MLX)."""
    ctx, capacity = row.get("ctx"), row.get("capacity")
    window = f"{ctx} tokens" if ctx else "default"
    return f"{window}, {capacity}" if capacity else window
