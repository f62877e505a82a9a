"""The app and tray icon, drawn (no image files to ship): a rail switch, green while the server runs."""

from __future__ import annotations

from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QColor, QIcon, QPainter, QPen, QPixmap


def app_icon(*, running: bool) -> QIcon:
    icon = QIcon()
    for px in (16, 22, 32, 48, 64, 128):
        pm = QPixmap(px, px)
        pm.fill(Qt.GlobalColor.transparent)
        p = QPainter(pm)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        bg = QColor("#2e7d32") if running else QColor("#616161")
        p.setBrush(bg)
        p.setPen(Qt.PenStyle.NoPen)
        p.drawRoundedRect(QRectF(0, 0, px, px), px * 0.22, px * 0.22)
        pen = QPen(QColor("white"), max(px * 0.1, 1.5))
        pen.setCapStyle(Qt.PenCapStyle.RoundCap)
        p.setPen(pen)
        # one track splitting into two: the router picking a lane
        p.drawLine(QPointF(px * 0.2, px * 0.5), QPointF(px * 0.45, px * 0.5))
        p.drawLine(QPointF(px * 0.45, px * 0.5), QPointF(px * 0.8, px * 0.25))
        p.drawLine(QPointF(px * 0.45, px * 0.5), QPointF(px * 0.8, px * 0.75))
        p.end()
        icon.addPixmap(pm)
    return icon
