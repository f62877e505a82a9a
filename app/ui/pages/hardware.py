"""Hardware: the probed snapshot and live CPU / RAM / GPU-memory graphs from `hardware.sample` events,
with each loaded lane's share listed."""

from __future__ import annotations

from collections import deque
from typing import Any

from PySide6.QtCore import QPointF, QSize, Qt
from PySide6.QtGui import QColor, QPainter, QPen, QPolygonF
from PySide6.QtWidgets import QGridLayout, QLabel, QSizePolicy, QWidget

from app.ui import fmt
from app.ui.pages import Page

HISTORY = 120  # samples (two minutes at 1 Hz)


class Graph(QWidget):
    """A 0-100 % line over the last HISTORY samples."""

    def __init__(self, title: str, color: str) -> None:
        super().__init__()
        self.title, self.color = title, QColor(color)
        self.values: deque[float] = deque(maxlen=HISTORY)
        self.caption = ""
        self.setMinimumHeight(130)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)

    def sizeHint(self) -> QSize:
        return QSize(400, 160)

    def add(self, percent: float, caption: str) -> None:
        self.values.append(max(0.0, min(100.0, percent)))
        self.caption = caption
        self.update()

    def paintEvent(self, _: Any) -> None:
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        r = self.rect().adjusted(1, 20, -1, -1)
        p.fillRect(r, self.palette().base())
        grid = QPen(self.palette().mid().color())
        grid.setStyle(Qt.PenStyle.DotLine)
        p.setPen(grid)
        for frac in (0.25, 0.5, 0.75):
            y = r.bottom() - r.height() * frac
            p.drawLine(r.left(), int(y), r.right(), int(y))
        p.setPen(self.palette().text().color())
        p.drawText(
            self.rect().adjusted(2, 0, -2, 0),
            Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop,
            f"{self.title}  {self.caption}",
        )
        if len(self.values) >= 2:
            step = r.width() / (HISTORY - 1)
            x0 = r.right() - step * (len(self.values) - 1)
            pts = [
                QPointF(x0 + i * step, r.bottom() - r.height() * v / 100) for i, v in enumerate(self.values)
            ]
            p.setPen(QPen(self.color, 2))
            p.drawPolyline(QPolygonF(pts))
        elif not self.values:
            p.drawText(r, Qt.AlignmentFlag.AlignCenter, "waiting for the first sample…")
        p.setPen(self.palette().mid().color())
        p.drawRect(r)
        p.end()


class HardwarePage(Page):
    title = "Hardware"
    hint = "What this machine has, and what is in use now (sampled every second)."

    def __init__(self, desk: Any) -> None:
        super().__init__(desk)
        self.summary = QLabel()
        self.summary.setWordWrap(True)
        self.summary.setTextFormat(Qt.TextFormat.RichText)
        self.root.addWidget(self.summary)
        self.grid = QGridLayout()
        self.cpu = Graph("CPU", "#1e88e5")
        self.ram = Graph("RAM", "#43a047")
        self.grid.addWidget(self.cpu, 0, 0)
        self.grid.addWidget(self.ram, 0, 1)
        self.gpus: dict[int, Graph] = {}
        self.root.addLayout(self.grid, 1)
        self.shares = QLabel()
        self.shares.setWordWrap(True)
        self.root.addWidget(self.shares)
        desk.bridge.received.connect(self._on_event)
        self.show_snapshot()

    def show_snapshot(self) -> None:
        hw = self.desk.runtime.hardware
        if hw is None:
            self.summary.setText("The hardware probe has not run (plan_memory is off in settings.json).")
            return
        doc = hw.public()
        cpu = doc.get("cpu") or {}
        gpus = doc.get("gpus") or []
        lines = [
            f"<b>CPU</b>: {cpu.get('model_name') or '?'} · {cpu.get('usable_cores') or '?'} cores usable",
            f"<b>RAM</b>: {fmt.size((doc.get('memory') or {}).get('total') or doc.get('ram_total'))}",
        ]
        for g in gpus:
            lines.append(
                f"<b>GPU</b>: {g.get('name', '?')} · {fmt.size(g.get('memory_total') or g.get('vram_total'))}"
            )
        if not gpus:
            lines.append("<b>GPU</b>: none found; models run on the CPU")
        self.summary.setText("<br>".join(lines))

    def _on_event(self, kind: str, d: dict[str, Any]) -> None:
        if kind != "hardware.sample":
            return
        if d.get("cpu_percent") is not None:
            self.cpu.add(float(d["cpu_percent"]), f"{d['cpu_percent']:.0f} %")
        total = d.get("ram_total") or 0
        if total:
            used = d.get("ram_used") or 0
            self.ram.add(100 * used / total, f"{fmt.size(used)} of {fmt.size(total)}")
        for i, g in enumerate(d.get("gpus") or []):
            idx = int(g.get("index", i))
            graph = self.gpus.get(idx)
            if graph is None:
                graph = self.gpus[idx] = Graph(f"GPU {idx} memory", "#8e24aa")
                n = len(self.gpus) + 1
                self.grid.addWidget(graph, n // 2, n % 2)
            mt = g.get("memory_total") or 0
            if mt:
                graph.add(
                    100 * (g.get("memory_used") or 0) / mt,
                    f"{fmt.size(g.get('memory_used'))} of {fmt.size(mt)}",
                )
        lanes = [s for s in self.desk.runtime.supervisor.snapshot() if s["state"] == "ready"]
        parts = []
        for s in lanes:
            m: Any = s.get("measured") or {}
            parts.append(
                f"{s['model']}: {fmt.size(m.get('rss_bytes')) if m.get('rss_bytes') else 'measuring'} RAM"
            )
        self.shares.setText("Loaded lanes: " + ("; ".join(parts) if parts else "none"))
