"""The window's pages. Each takes the Desk (ui/context.py), reads core state off the UI thread, follows
bus events."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QLabel, QTableWidget, QVBoxLayout, QWidget

if TYPE_CHECKING:
    from app.ui.context import Desk


class Page(QWidget):
    title = ""
    hint = ""

    def __init__(self, desk: Desk) -> None:
        super().__init__()
        self.desk = desk
        self.root = QVBoxLayout(self)
        self.root.setContentsMargins(16, 12, 16, 12)
        head = QLabel(f"<h2 style='margin:0'>{self.title}</h2>")
        self.root.addWidget(head)
        if self.hint:
            h = QLabel(self.hint)
            h.setWordWrap(True)
            self.root.addWidget(h)
        self.status = QLabel("")
        self.status.setWordWrap(True)
        self.status.setStyleSheet("color: #c62828")
        self.status.hide()

    def report(self, msg: str) -> None:
        """An error stated plainly, with what to do (the core's messages already say it)."""
        self.status.setText(msg)
        self.status.setVisible(bool(msg))

    def clear_report(self) -> None:
        self.report("")


def table(headers: list[str], *, stretch: int = 0) -> QTableWidget:
    t = QTableWidget(0, len(headers))
    t.setHorizontalHeaderLabels(headers)
    t.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    t.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
    t.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
    t.verticalHeader().setVisible(False)
    t.setAlternatingRowColors(True)
    t.setWordWrap(False)  # one line per row; long names are elided in the middle, full text in the tooltip
    t.setTextElideMode(Qt.TextElideMode.ElideMiddle)
    h = t.horizontalHeader()
    h.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    h.setSectionResizeMode(stretch, QHeaderView.ResizeMode.Stretch)
    return t
