"""The "Why" of a fit verdict: memory bars per device, placements, largest context, lanes and reasons.

Takes either a local explanation (app.advice.explain) or a hub quantization verdict (app.advice.hub_fit);
both carry the same memory plan.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QRectF, QSize, Qt
from PySide6.QtGui import QColor, QPainter
from PySide6.QtWidgets import (
    QDialog,
    QLabel,
    QScrollArea,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from app.ui.fmt import size

SEGMENTS = (
    ("used", "in use by others", QColor("#9e9e9e")),
    ("weights", "weights", QColor("#1e88e5")),
    ("kv_cache", "KV cache", QColor("#fb8c00")),
    ("compute", "compute + overhead", QColor("#8e24aa")),
)


class MemoryBar(QWidget):
    def __init__(self, parts: dict[str, int], capacity: int) -> None:
        super().__init__()
        self.parts, self.capacity = parts, max(capacity, 1)
        self.setMinimumHeight(22)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def sizeHint(self) -> QSize:
        return QSize(420, 22)

    def paintEvent(self, _: Any) -> None:
        p = QPainter(self)
        r = QRectF(self.rect()).adjusted(0.5, 0.5, -0.5, -0.5)
        p.fillRect(r, self.palette().base())
        x = r.left()
        for key, _label, color in SEGMENTS:
            w = r.width() * self.parts.get(key, 0) / self.capacity
            w = min(w, r.right() - x)
            if w > 0:
                p.fillRect(QRectF(x, r.top(), w, r.height()), color)
                x += w
        p.setPen(self.palette().text().color())
        p.drawRect(r)
        p.end()


def normalize(doc: dict[str, Any]) -> dict[str, Any]:
    """One shape for both sources: summary, plan (fit), lane, reasons, rejections, hardware."""
    if "decision" in doc:  # app.advice.explain
        d = doc["decision"]
        return {
            "title": doc.get("model"),
            "summary": (doc.get("fit") or {}).get("summary") or doc.get("fit_problem") or "not estimated",
            "plan": doc.get("fit"),
            "lane": d.get("lane"),
            "reasons": d.get("reasons", []),
            "rejections": d.get("rejections", []),
            "hardware": doc.get("hardware") or {},
        }
    return {
        "title": doc.get("title"),
        "summary": doc.get("summary") or "not estimated",
        "plan": doc.get("plan"),
        "lane": doc.get("lane"),
        "reasons": doc.get("reasons", []),
        "rejections": doc.get("rejections", []),
        "hardware": doc.get("hardware") or {},
    }


def _capacity(device: str, hw: dict[str, Any]) -> int:
    if device.upper() == "CPU":
        return int(hw.get("ram_total") or 0)
    for i, g in enumerate(hw.get("gpus") or []):
        names = {str(g.get("name")), f"GPU{i}", f"CUDA{i}", str(g.get("id"))}
        if device in names:
            return int(g.get("memory_total") or g.get("vram_total") or 0)
    return 0


class ExplainView(QWidget):
    def __init__(self, doc: dict[str, Any]) -> None:
        super().__init__()
        n = normalize(doc)
        lay = QVBoxLayout(self)
        head = QLabel(f"<b>{n['summary']}</b>")
        head.setWordWrap(True)
        lay.addWidget(head)
        plan = n["plan"] or {}
        chosen = plan.get("chosen") or {}
        budget = plan.get("budget") or {}
        for d in chosen.get("devices", []):
            dev = d["device"]
            cap = _capacity(dev, n["hardware"]) or int(d["total"] + budget.get(dev, 0))
            used = max(cap - int(budget.get(dev, cap)), 0)
            other = int(d.get("compute", 0) + d.get("overhead", 0) + d.get("prompt_cache", 0))
            other += int(d.get("projector", 0))
            parts = {"used": used, "weights": d["weights"], "kv_cache": d["kv_cache"], "compute": other}
            lay.addWidget(QLabel(f"<b>{dev}</b>: {size(used + d['total'])} of {size(cap)}"))
            lay.addWidget(MemoryBar(parts, cap))
            legend = "   ".join(
                f"<span style='color:{c.name()}'>■</span> {label} {size(parts[k])}"
                for k, label, c in SEGMENTS
            )
            lab = QLabel(legend)
            lab.setWordWrap(True)
            lay.addWidget(lab)
        measured = _measured(doc)
        if measured:
            lay.addWidget(_html(measured))
        if plan.get("placements"):
            rows = []
            for p in plan["placements"]:
                speed = (
                    f"~{p['tokens_per_s']:.0f} tok/s" if p.get("tokens_per_s") else p.get("speed_note", "")
                )
                mark = "fits" if p["fits"] else "does not fit"
                rows.append(
                    f"<li><b>{p['name']}</b> ({p['gpu_layers']} GPU layers): {mark}; largest context "
                    f"{p.get('max_ctx') or '-'}; {speed}</li>"
                )
            lay.addWidget(_html("<b>Placements</b><ul>" + "".join(rows) + "</ul>"))
        for a in plan.get("advice") or []:
            lay.addWidget(_html(f"To make it fit: {a}"))
        lane = n["lane"] or "none"
        reasons = "".join(f"<li>{r}</li>" for r in n["reasons"])
        lay.addWidget(_html(f"<b>Lane chosen: {lane}</b><ul>{reasons}</ul>"))
        if n["rejections"]:
            rej = "".join(f"<li><b>{r['lane']}</b>: {r['message']}</li>" for r in n["rejections"])
            lay.addWidget(_html(f"<b>Lanes turned down</b><ul>{rej}</ul>"))
        lay.addStretch(1)


def _measured(doc: dict[str, Any]) -> str | None:
    """Predicted against measured memory, per device and component, for a loaded (or last loaded) lane."""
    loaded = doc.get("loaded") or {}
    title = "Loaded now: predicted / measured"
    if not loaded.get("measured"):
        loaded = doc.get("last_measured") or {}
        title = "Last load: predicted / measured"
    m = loaded.get("measured")
    if not m:
        return None
    pred = {d["device"]: d for d in (loaded.get("predicted") or {}).get("devices", [])}
    rows = []
    for dev, comps in (m.get("devices") or {}).items():
        p = pred.get(dev, {})
        cells = ", ".join(f"{c} {size(p.get(c))} / {size(v)}" for c, v in comps.items() if c != "output")
        rows.append(f"<li><b>{dev}</b>: {cells}</li>")
    if m.get("rss_bytes"):
        rows.append(f"<li>engine process: {size(m['rss_bytes'])} resident</li>")
    return f"<b>{title}</b><ul>{''.join(rows)}</ul>"


def _html(text: str) -> QLabel:
    lab = QLabel(text)
    lab.setWordWrap(True)
    lab.setTextFormat(Qt.TextFormat.RichText)
    return lab


class ExplainDialog(QDialog):
    """Non-modal: shown with show(), never exec() (the event loop keeps running)."""

    def __init__(self, title: str, doc: dict[str, Any], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle(f"Why: {title}")
        self.resize(640, 560)
        area = QScrollArea()
        area.setWidgetResizable(True)
        self.view = ExplainView(doc)
        area.setWidget(self.view)
        lay = QVBoxLayout(self)
        lay.addWidget(area)
