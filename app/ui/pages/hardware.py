"""Hardware: the probed snapshot and live CPU / RAM / GPU-memory graphs from `hardware.sample` events,
with each loaded lane's share listed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QGridLayout, QLabel

from app.ui import fmt
from app.ui.charts import GIB, Graph, LaneHistory
from app.ui.pages import Page

if TYPE_CHECKING:
    from app.ui.context import Desk

HISTORY = 120  # samples (two minutes at 1 Hz)


class HardwarePage(Page):
    title = "Hardware"
    hint = "What this machine has, and what is in use now (sampled every second)."

    def __init__(self, desk: Desk) -> None:
        super().__init__(desk)
        self.summary = QLabel()
        self.summary.setWordWrap(True)
        self.summary.setTextFormat(Qt.TextFormat.RichText)
        self.root.addWidget(self.summary)
        self.grid = QGridLayout()
        self.cpu = Graph("CPU", unit="%", series=[("busy", "#1e88e5")], maximum=100, span=HISTORY)
        self.ram = Graph(
            "RAM", unit="GiB", series=[("in use", "#43a047"), ("by lanes", "#fb8c00")], span=HISTORY
        )
        # generation speed of every lane together, from the server's `request.done` events
        self.speed = Graph("Generation", unit="tok/s", series=[("all lanes", "#e53935")], span=HISTORY)
        self.history = LaneHistory(span=HISTORY)
        self.grid.addWidget(self.cpu, 0, 0)
        self.grid.addWidget(self.ram, 0, 1)
        self.grid.addWidget(self.speed, 1, 0)
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
            speed = f" · {bw / 1e9:.0f} GB/s" if (bw := g.get("memory_bandwidth")) else ""
            lines.append(
                f"<b>GPU</b>: {g.get('name', '?')} · "
                f"{fmt.size(g.get('memory_total') or g.get('vram_total'))}{speed}"
            )
        if not gpus:
            lines.append("<b>GPU</b>: none found; models run on the CPU")
        self.summary.setText("<br>".join(lines))

    def _on_event(self, kind: str, d: dict[str, Any]) -> None:
        if kind == "request.done" and d.get("output_tokens"):
            self.history.add_request("all", tokens=int(d["output_tokens"]), seconds=float(d["seconds"]))
        if kind != "hardware.sample":
            return
        if d.get("cpu_percent") is not None:
            self.cpu.add(float(d["cpu_percent"]), latest=[f"{d['cpu_percent']:.0f} %"])
        lanes = [s for s in self.desk.runtime.lanes_snapshot() if s["state"] == "ready"]
        held = sum(_rss(s) for s in lanes)
        total = d.get("ram_total") or 0
        if total:
            used = d.get("ram_used") or 0
            self.ram.maximum = total / GIB
            self.ram.add(
                used / GIB,
                held / GIB,
                caption=f"{fmt.size(used)} of {fmt.size(total)}",
                latest=[fmt.size(used), fmt.size(held) if held else "none"],
            )
        self._gpus(d.get("gpus") or [])
        self.speed.set_line(0, self.history.rates("all")[-HISTORY:] or [0.0])
        self.speed.latest[0] = f"{self.speed.values[0][-1]:.1f} tok/s" if self.speed.values[0] else ""
        parts = []
        for s in lanes:
            m: Any = s.get("measured") or {}
            parts.append(
                f"{s['model']}: {fmt.size(m.get('rss_bytes')) if m.get('rss_bytes') else 'measuring'} RAM"
            )
        self.shares.setText("Loaded lanes: " + ("; ".join(parts) if parts else "none"))

    def _gpus(self, samples: list[dict[str, Any]]) -> None:
        for i, g in enumerate(samples):
            idx = int(g.get("index", i))
            mt = g.get("memory_total") or 0
            graph = self.gpus.get(idx)
            if graph is None:
                name = f"GPU {idx} memory"
                graph = self.gpus[idx] = Graph(name, unit="GiB", series=[("in use", "#8e24aa")], span=HISTORY)
                n = len(self.gpus) + 2  # after CPU, RAM and Generation
                self.grid.addWidget(graph, n // 2, n % 2)
            if mt:
                graph.maximum = mt / GIB
                used = g.get("memory_used") or 0
                graph.add(used / GIB, caption=f"{fmt.size(used)} of {fmt.size(mt)}", latest=[fmt.size(used)])


def _rss(snap: dict[str, Any]) -> int:
    """The lane's resident memory now (engine and its children), 0 while not yet measured."""
    m = snap.get("measured")
    return int(m.get("rss_bytes") or 0) if isinstance(m, dict) else 0
