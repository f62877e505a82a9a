"""Line graphs over time: the Hardware page's graphs (axes with units, a legend) and the Lanes page's
sparklines, plus the bounded histories they draw (fed from bus events, never polled)."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from PySide6.QtCore import QPointF, QRect, QSize, Qt
from PySide6.QtGui import QColor, QPainter, QPalette, QPen, QPolygonF
from PySide6.QtWidgets import QSizePolicy, QWidget

GIB = 1 << 30


def nice_top(value: float) -> float:
    """The scale's top for a largest value: 1, 2 or 5 times a power of ten, at or above it (1 for none)."""
    if value <= 0 or not math.isfinite(value):
        return 1.0
    mag = 10 ** math.floor(math.log10(value))
    return next(m * mag for m in (1, 2, 5, 10) if m * mag >= value * 0.999)


def number(value: float) -> str:
    """A scale label: no decimals from 10 up, one below (12, 2.5, 0.5)."""
    return f"{value:.0f}" if value >= 10 or value == int(value) else f"{value:.1f}"


def time_labels(span: int) -> list[str]:
    """The time axis, left to right, in one unit: minutes for a span of two minutes or more, else seconds."""
    if span >= 120:
        return [f"{number(span / 60)} min ago", f"{number(span / 120)} min ago", "now"]
    return [f"{span} s ago", f"{span // 2} s ago", "now"]


def shade(color: str, palette: QPalette) -> QColor:
    """A series colour made lighter on a dark window, so the line stays legible in both themes."""
    c = QColor(color)
    return c.lighter(140) if palette.color(QPalette.ColorRole.Base).lightness() < 100 else c


class Graph(QWidget):
    """One or more lines over the last `span` samples (1 Hz): a scale with its unit on the left (fixed
    `maximum`, else rounded up from the largest value shown), time on the bottom, a legend on top."""

    def __init__(
        self,
        title: str,
        *,
        unit: str,
        series: Sequence[tuple[str, str]],
        maximum: float | None = None,
        span: int = 120,
    ) -> None:
        super().__init__()
        self.title, self.unit, self.maximum, self.span = title, unit, maximum, span
        self.names = [name for name, _ in series]
        self.colors = [color for _, color in series]
        self.values: list[deque[float]] = [deque(maxlen=span) for _ in series]
        self.latest: list[str] = ["" for _ in series]
        self.caption = ""
        self.setMinimumHeight(140)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)

    def sizeHint(self) -> QSize:
        return QSize(400, 180)

    def add(self, *values: float | None, caption: str = "", latest: Sequence[str] = ()) -> None:
        """One sample per series (None: not measured this time, the line keeps its last value)."""
        for i, v in enumerate(values):
            line = self.values[i]
            if v is not None:
                line.append(max(0.0, float(v)))
            elif line:
                line.append(line[-1])
        for i, text in enumerate(latest):
            self.latest[i] = text
        self.caption = caption
        self.update()

    def set_line(self, index: int, values: Sequence[float]) -> None:
        """Replace one line whole (a history that revises its past seconds, like tokens per second)."""
        self.values[index] = deque((max(0.0, v) for v in values), maxlen=self.span)
        self.update()

    def top(self) -> float:
        if self.maximum:
            return float(self.maximum)
        return nice_top(max((max(v) for v in self.values if v), default=0.0))

    def axes(self) -> tuple[list[str], list[str]]:
        """The labels drawn: the scale with its unit (top to bottom) and the time axis (left to right)."""
        top = self.top()
        scale = [f"{number(top * f)} {self.unit}" for f in (1.0, 0.5, 0.0)]
        return scale, time_labels(self.span)

    def legend(self) -> list[str]:
        """One entry per line: its name and its latest value."""
        return [f"{n} {v}".strip() for n, v in zip(self.names, self.latest, strict=True)]

    def plot_rect(self) -> QRect:
        fm = self.fontMetrics()
        scale, _ = self.axes()
        left = max(fm.horizontalAdvance(s) for s in scale) + 8
        return self.rect().adjusted(left, 2 * fm.height() + 6, -6, -(fm.height() + 4))

    def paintEvent(self, _: Any) -> None:
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        fm, pal = self.fontMetrics(), self.palette()
        r = self.plot_rect()
        p.fillRect(r, pal.base())
        grid = QPen(pal.mid().color())
        grid.setStyle(Qt.PenStyle.DotLine)
        p.setPen(grid)
        for frac in (0.25, 0.5, 0.75):
            y = int(r.bottom() - r.height() * frac)
            p.drawLine(r.left(), y, r.right(), y)
        p.setPen(pal.text().color())
        scale, times = self.axes()
        right = Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter
        for label, frac in zip(scale, (1.0, 0.5, 0.0), strict=True):
            y = int(r.bottom() - r.height() * frac)
            p.drawText(0, y - fm.height() // 2, r.left() - 6, fm.height(), right, label)
        below = r.bottom() + 3
        for label, align in zip(
            times,
            (Qt.AlignmentFlag.AlignLeft, Qt.AlignmentFlag.AlignHCenter, Qt.AlignmentFlag.AlignRight),
            strict=True,
        ):
            p.drawText(r.left(), below, r.width(), fm.height(), align, label)
        bold = p.font()
        bold.setBold(True)
        p.setFont(bold)
        p.drawText(r.left(), 2, r.width(), fm.height(), Qt.AlignmentFlag.AlignLeft, self.title)
        p.setFont(self.font())
        if self.caption:
            p.drawText(r.left(), 2, r.width(), fm.height(), Qt.AlignmentFlag.AlignRight, self.caption)
        x = r.left()
        for text, color in zip(self.legend(), self.colors, strict=True):
            y = fm.height() + 4
            p.fillRect(x, y + fm.height() // 2 - 2, 14, 4, shade(color, pal))
            p.drawText(x + 18, y, fm.horizontalAdvance(text) + 2, fm.height(), 0, text)
            x += 18 + fm.horizontalAdvance(text) + 16
        top = self.top()
        step = r.width() / max(self.span - 1, 1)
        for line, color in zip(self.values, self.colors, strict=True):
            if len(line) < 2:
                continue
            x0 = r.right() - step * (len(line) - 1)
            pts = [
                QPointF(x0 + i * step, r.bottom() - r.height() * min(v / top, 1.0))
                for i, v in enumerate(line)
            ]
            p.setPen(QPen(shade(color, pal), 2))
            p.drawPolyline(QPolygonF(pts))
        if not any(self.values):
            p.setPen(pal.text().color())
            p.drawText(r, Qt.AlignmentFlag.AlignCenter, "waiting for the first sample…")
        p.setPen(pal.mid().color())
        p.drawRect(r)
        p.end()


class Sparkline(QWidget):
    """A small line without axes for a table cell: `points()` (oldest first) scaled to its own peak, with
    the latest value written beside it by `label` (the peak in the tooltip)."""

    def __init__(
        self, points: Callable[[], list[float]], *, color: str, label: Callable[[float], str]
    ) -> None:
        super().__init__()
        self.points, self.color, self.label = points, color, label
        self.setMinimumSize(150, 24)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)

    def sizeHint(self) -> QSize:
        return QSize(170, 26)

    def text(self) -> str:
        pts = self.points()
        return self.label(pts[-1]) if pts else "-"

    def paintEvent(self, _: Any) -> None:
        pts, pal = self.points(), self.palette()
        fm = self.fontMetrics()
        room = fm.horizontalAdvance("000.0 tok/s") + 6
        r = self.rect().adjusted(2, 4, -room, -4)
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        p.setPen(pal.mid().color())
        p.drawLine(r.left(), r.bottom(), r.right(), r.bottom())
        peak = max(pts, default=0.0) or 1.0
        if len(pts) >= 2:
            step = r.width() / (len(pts) - 1)
            line = [
                QPointF(r.left() + i * step, r.bottom() - r.height() * v / peak) for i, v in enumerate(pts)
            ]
            p.setPen(QPen(shade(self.color, pal), 1.5))
            p.drawPolyline(QPolygonF(line))
        p.setPen(pal.text().color())
        align = Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter
        p.drawText(self.rect().adjusted(0, 0, -2, 0), align, self.text())
        self.setToolTip(f"peak {self.label(peak)} over the last {len(pts)} s" if pts else "")
        p.end()


class LaneHistory:
    """Per model, the last `span` seconds: tokens per second (each finished request's output tokens
    spread over the seconds it ran, from `request.done`) and memory (one reading per hardware tick)."""

    def __init__(self, span: int = 300) -> None:
        self.span = span
        self._rates: dict[str, dict[int, float]] = {}
        self._memory: dict[str, deque[tuple[int, int]]] = {}

    def add_request(self, model: str, *, tokens: int, seconds: float, now: float | None = None) -> None:
        if tokens <= 0 or seconds <= 0:
            return
        end = time.time() if now is None else now
        rate, buckets = tokens / seconds, self._rates.setdefault(model, {})
        first = int(end - seconds)
        for sec in range(max(first, int(end) - self.span), int(end) + 1):
            # the share of this second the request ran, so a 0.3 s answer is not drawn as a whole second
            part = min(end, sec + 1) - max(end - seconds, sec)
            if part > 0:
                buckets[sec] = buckets.get(sec, 0.0) + rate * part
        self._trim(buckets, end)

    def add_memory(self, model: str, used: int, *, now: float | None = None) -> None:
        line = self._memory.setdefault(model, deque(maxlen=self.span))
        line.append((int(time.time() if now is None else now), int(used)))

    def rates(self, model: str, *, now: float | None = None) -> list[float]:
        """Tokens per second for each of the last `span` seconds up to `now`, oldest first (0 when idle);
        empty until the model has seen a request or a memory reading."""
        end = int(time.time() if now is None else now)
        buckets = self._rates.get(model)
        if buckets is None and model not in self._memory:
            return []
        got = buckets or {}
        start = min([*got, *(t for t, _ in self._memory.get(model, ()))], default=end)
        return [got.get(s, 0.0) for s in range(max(start, end - self.span + 1), end + 1)]

    def memory(self, model: str) -> list[float]:
        return [float(b) for _, b in self._memory.get(model, ())]

    def forget(self, keep: set[str]) -> None:
        """Drop the models no longer shown (a lane that has gone)."""
        for d in (self._rates, self._memory):
            for m in [m for m in d if m not in keep]:
                del d[m]

    def _trim(self, buckets: dict[int, float], now: float) -> None:
        for s in [s for s in buckets if s < now - self.span]:
            del buckets[s]
