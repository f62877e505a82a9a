"""The "Why" of a fit verdict: memory bars per device, placements, largest context, lanes and reasons.

Takes either a local explanation (app.advice.explain) or a hub quantization verdict (app.advice.hub_fit);
both carry the same memory plan.
"""

from __future__ import annotations

from html import escape
from typing import Any

from PySide6.QtCore import QEvent, QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QBrush, QColor, QPainter, QPen
from PySide6.QtWidgets import (
    QDialog,
    QLabel,
    QScrollArea,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from app.ui import fmt
from app.ui.fmt import size
from app.ui.theme import is_dark, palette_event, tone
from app.ui.wording import for_window

SEGMENTS = (
    ("used", "in use by others", QColor("#9e9e9e")),
    ("weights", "weights", QColor("#1e88e5")),
    ("kv_cache", "KV cache", QColor("#fb8c00")),
    ("compute", "compute + overhead", QColor("#8e24aa")),
    ("projector", "vision projector", QColor("#00897b")),
    ("projector_compute", "projector compute", QColor("#80cbc4")),
)
# parts shown only when the model has them (a text model's legend names no projector)
OPTIONAL = frozenset({"projector", "projector_compute"})


OVER = QColor("#e53935")  # the part past the device's limit


class MemoryBar(QWidget):
    """The device's memory as a bar: what is in use, then the model's parts. The limit is a line; where
    the total goes past it, the bar grows beyond the line and the overflow is hatched in red."""

    def __init__(self, parts: dict[str, int], capacity: int) -> None:
        super().__init__()
        self.parts, self.capacity = parts, max(capacity, 1)
        self.setMinimumHeight(26)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def sizeHint(self) -> QSize:
        return QSize(420, 26)

    @property
    def total(self) -> int:
        return sum(int(self.parts.get(k, 0)) for k, _l, _c in SEGMENTS)

    @property
    def over(self) -> int:
        """Bytes past the limit (0 when it fits)."""
        return max(self.total - self.capacity, 0)

    def bar_layout(self, width: float) -> dict[str, Any]:
        """Where each part lies in a bar `width` wide: the scale is the larger of the limit and the total,
        so an overflow is drawn to size past the limit line instead of being cut at the edge."""
        scale = width / max(self.capacity, self.total, 1)
        x, segments = 0.0, []
        for key, _label, _color in SEGMENTS:
            w = self.parts.get(key, 0) * scale
            if w > 0:
                segments.append((key, x, w))
                x += w
        limit = self.capacity * scale
        return {"segments": segments, "limit_x": limit, "overflow": (limit, max(x - limit, 0.0))}

    def paintEvent(self, _: Any) -> None:
        p = QPainter(self)
        r = QRectF(self.rect()).adjusted(0.5, 3.5, -0.5, -3.5)
        g = self.bar_layout(r.width())
        p.fillRect(r, self.palette().base())
        colors = {k: c for k, _l, c in SEGMENTS}
        for key, x, w in g["segments"]:
            p.fillRect(QRectF(r.left() + x, r.top(), w, r.height()), colors[key])
        ox, ow = g["overflow"]
        if ow > 0:
            past = QRectF(r.left() + ox, r.top(), ow, r.height())
            p.fillRect(past, QColor(255, 255, 255, 110))  # washed out: the parts past the line stay legible
            p.fillRect(past, QBrush(OVER, Qt.BrushStyle.BDiagPattern))
            p.setPen(QPen(OVER, 2))
            p.drawRect(past)
            text = f"+{size(self.over)}"
            room = self.fontMetrics().horizontalAdvance(text) + 8
            if room < ow:  # the overflow's size on a small plate in its middle, the hatching around it
                plate = QRectF(past.center().x() - room / 2, past.top() + 1, room, past.height() - 2)
                p.fillRect(plate, QColor(255, 255, 255, 220))
                p.setPen(QColor("#b71c1c"))
                p.drawText(plate, Qt.AlignmentFlag.AlignCenter, text)
        p.setPen(self.palette().text().color())
        p.drawRect(r)
        # the device's limit: a line standing out above and below the bar
        lx = r.left() + g["limit_x"]
        p.setPen(QPen(self.palette().text().color(), 2))
        p.drawLine(QPointF(lx, 0), QPointF(lx, self.height()))
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


def device_parts(d: dict[str, Any], used: int) -> dict[str, int]:
    """One device's bar: what others use, then the model's parts. The vision projector's weights and its
    encoder's compute buffer are parts of their own; a draft model and LoRA adapters are weights too."""
    weights = int(d.get("weights", 0)) + int(d.get("draft", 0)) + int(d.get("lora", 0))
    other = int(d.get("compute", 0)) + int(d.get("overhead", 0)) + int(d.get("prompt_cache", 0))
    return {
        "used": used,
        "weights": weights,
        "kv_cache": int(d.get("kv_cache", 0)),
        "compute": other,
        "projector": int(d.get("projector", 0)),
        "projector_compute": int(d.get("projector_compute", 0)),
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
        head = QLabel(f"<b>{escape(for_window(n['summary']), quote=False)}</b>")
        head.setWordWrap(True)
        lay.addWidget(head)
        plan = n["plan"] or {}
        chosen = plan.get("chosen") or _nearest(plan)
        budget = plan.get("budget") or {}
        if not plan.get("chosen") and chosen:  # nothing fits: the bars show the closest try, over the top
            lay.addWidget(_html(f"<i>Closest try: {chosen.get('name')}, which does not fit.</i>"))
        for d in chosen.get("devices", []):
            dev = d["device"]
            cap = _capacity(dev, n["hardware"]) or int(d["total"] + budget.get(dev, 0))
            used = max(cap - int(budget.get(dev, cap)), 0)
            parts = device_parts(d, used)
            bar = MemoryBar(parts, cap)
            if bar.over:
                fill = f", <span style='color:{tone('error')}'><b>{size(bar.over)} over the limit</b></span>"
            else:
                fill = f", {size(cap - bar.total)} free"
            lay.addWidget(_html(f"<b>{dev}</b>: {size(bar.total)} of {size(cap)}{fill}"))
            lay.addWidget(bar)
            legend = "   ".join(
                f"<span style='color:{c.name()}'>■</span> {label} {size(parts[k])}"
                for k, label, c in SEGMENTS
                if k not in OPTIONAL or parts[k]
            )
            legend += "   ┃ the device's limit" + (
                f"   <span style='color:{OVER.name()}'>▨</span> past it" if bar.over else ""
            )
            lab = QLabel(legend)
            lab.setWordWrap(True)
            lay.addWidget(lab)
        if "decision" in doc:  # a local model: its speed predicted, and measured once it has run here
            lay.addWidget(_html(_speed(chosen, doc.get("measured_tokens_per_s"), bool(plan.get("chosen")))))
        measured = _measured(doc)
        if measured:
            lay.addWidget(_html(measured))
        if plan.get("placements"):
            rows = []
            for p in plan["placements"]:
                rows.append(f"<li><b>{p['name']}</b> ({p['gpu_layers']} GPU layers): {_placement(p)}</li>")
            lay.addWidget(_html("<b>Placements</b><ul>" + "".join(rows) + "</ul>"))
        for a in plan.get("advice") or []:  # the planner's words, with the window's controls and numbers
            lay.addWidget(_html(f"To make it fit: {for_window(a)}"))
        if doc.get("alternatives"):  # other files of the same repository that do fit (Discover)
            alt = ", ".join(doc["alternatives"])
            lay.addWidget(_html(f"<b>Fits here instead:</b> {alt} (a smaller quantization)"))
        lane = n["lane"] or "none"
        reasons = "".join(f"<li>{_words(r, n['summary'])}</li>" for r in n["reasons"])
        lay.addWidget(_html(f"<b>Lane chosen: {lane}</b><ul>{reasons}</ul>"))
        if n["rejections"]:
            rej = "".join(
                f"<li><b>{r['lane']}</b>: {_words(r['message'], n['summary'])}</li>" for r in n["rejections"]
            )
            lay.addWidget(_html(f"<b>Lanes turned down</b><ul>{rej}</ul>"))
        lay.addStretch(1)


def _nearest(plan: dict[str, Any]) -> dict[str, Any]:
    """The placement that misses by the least (nothing fits): what the bars show."""
    tries = [p for p in plan.get("placements") or [] if p.get("devices")]
    if not tries:
        return {}
    return min(tries, key=lambda p: sum(int(v) for v in (p.get("short_by") or {}).values()) or 1 << 62)


def _placement(p: dict[str, Any]) -> str:
    """One placement in words; what is unknown or does not apply is left out, never printed as - or 0."""
    if not p.get("fits"):
        short = ", ".join(f"{dev} {size(int(n))}" for dev, n in (p.get("short_by") or {}).items() if n)
        return f"does not fit{f' ({short} short)' if short else ''}"
    words = ["fits"]
    if p.get("max_ctx"):
        words.append(f"largest context {p['max_ctx']:,}")
    guess = fmt.predicted(p.get("tokens_per_s"), p.get("tokens_per_s_range"))
    if guess and p.get("measured_tokens_per_s"):
        words.append(f"{guess} predicted, measured {fmt.tps(float(p['measured_tokens_per_s']))} tok/s here")
    elif guess:  # the planner's note has the same range in other figures ("1114-11135"): said once, alike
        words.append(guess + (" predicted from memory bandwidth" if not p.get("tokens_per_s") else ""))
    elif p.get("speed_note"):
        words.append(str(p["speed_note"]))
    return "; ".join(words)


def _speed(chosen: dict[str, Any], measured: Any, fits: bool) -> str:
    """Predicted beside measured generation speed. A measurement is shown only where the plan fits: one
    taken at another context says nothing about a plan that cannot run."""
    tps = chosen.get("tokens_per_s")
    band = chosen.get("tokens_per_s_range")
    predicted = fmt.predicted(tps, band)
    if tps:
        predicted = f"{predicted} (calibrated on this machine)" if chosen.get("calibrated") else predicted
    elif band and float(band[1]) < 0.01:  # not "0-0 tok/s": a figure that rounds away says nothing
        predicted = "under 0.01 tok/s (too slow to use)"
    elif band:
        predicted = f"{predicted} (a range until a model measured here calibrates it)"
    else:
        predicted = None  # nothing to predict from: said once, not as "predicted not estimated"
    said = (
        f"predicted {predicted}"
        if predicted
        else "no prediction (" + str(chosen.get("speed_note") or "nothing to estimate it from") + ")"
    )
    if not fits:  # a plan that cannot run has no speed: a figure for it ("0-0.4 tok/s") reads as one
        return "<b>Speed</b>: none as asked: it does not fit here (make it fit first, below)"
    if isinstance(measured, int | float):
        return f"<b>Speed</b>: {said}; measured {fmt.tps(float(measured))} tok/s"
    return f"<b>Speed</b>: {said}; not measured yet on this machine"


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


def _words(reason: str, summary: str) -> str:
    """A routing reason as the window says it: its commands as the window's controls, escaped for rich
    text. "It fits: ..." repeats the plan's summary from before this model's measured speed was added to
    it: the summary shown at the top stands in, so the two never disagree ("not measured yet")."""
    if reason.startswith("It fits: ") and summary:
        reason = f"It fits: {summary}"
    return escape(for_window(reason), quote=False)


def _html(text: str) -> QLabel:
    lab = QLabel(text)
    lab.setWordWrap(True)
    lab.setTextFormat(Qt.TextFormat.RichText)
    return lab


class ExplainDialog(QDialog):
    """Non-modal: shown with show(), never exec() (the event loop keeps running)."""

    def __init__(self, title: str, doc: dict[str, Any], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        # a window of its own, not a dialog kept above the main window (which it would cover and block)
        self.setWindowFlags(Qt.WindowType.Window)
        self.setWindowModality(Qt.WindowModality.NonModal)
        self.setWindowTitle(f"Why: {title}")
        self.resize(640, 560)
        area = QScrollArea()
        area.setWidgetResizable(True)
        self.doc = doc
        self.view = ExplainView(doc)
        area.setWidget(self.view)
        self.area = area
        self._dark = is_dark()
        lay = QVBoxLayout(self)
        lay.addWidget(area)

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if palette_event(event) and self._dark != is_dark():  # its coloured words, in the new theme
            self._dark = is_dark()
            self.view = ExplainView(self.doc)
            self.area.setWidget(self.view)  # the area deletes the old view
