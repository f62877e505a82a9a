"""The window's pages. Each takes the Desk (ui/context.py), reads core state off the UI thread, follows
bus events."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QEvent, Qt
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QLabel, QTableWidget, QVBoxLayout, QWidget

from app.ui.theme import ToneLabel, is_dark, palette_event
from app.ui.wording import for_window

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
        # parented now: a page that does not lay it out still owns it; its red follows the theme
        self.status = ToneLabel("", "error", self)
        self.status.setWordWrap(True)
        # its line is kept while empty, so an error appearing does not push the page down
        policy = self.status.sizePolicy()
        policy.setRetainSizeWhenHidden(True)
        self.status.setSizePolicy(policy)
        self.status.hide()
        self._dark = is_dark()

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if palette_event(event) and self._dark != is_dark():  # rich text made under the other theme
            self._dark = is_dark()
            self.theme_changed()

    def theme_changed(self) -> None:
        """Redraw what carries colours of its own (rich text made under the other theme); pages override."""

    def hideEvent(self, event: Any) -> None:
        """Leaving the page drops its error: one from an earlier visit does not linger."""
        super().hideEvent(event)
        self.clear_report()

    def report(self, msg: str) -> None:
        """An error stated plainly, with what to do (the core's messages say it; the window's wording
        names its own buttons where the core names a command)."""
        self.status.setText(for_window(msg))
        self.status.setVisible(bool(msg))

    def clear_report(self) -> None:
        self.report("")


def table(headers: list[str], *, stretch: int = 0, wrap: bool = False) -> QTableWidget:
    """A read-only table of rows. `stretch` names the column that takes the room left (the name); with
    `wrap`, its long texts wrap onto a second line instead of being cut (rows fit their contents)."""
    t = QTableWidget(0, len(headers))
    t.setHorizontalHeaderLabels(headers)
    t.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    t.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
    t.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
    t.verticalHeader().setVisible(False)
    t.setAlternatingRowColors(True)
    t.setWordWrap(wrap)  # else one line per row; the full text is in the tooltip
    # names are cut at the end ("acme/Llama-70B-…" stays apart from "acme/Llama-8B-…"); only the `stretch`
    # column (the name) gives up room, the others keep their whole text and the table scrolls sideways
    t.setTextElideMode(Qt.TextElideMode.ElideRight)
    t.setHorizontalScrollMode(QAbstractItemView.ScrollMode.ScrollPerPixel)
    h = t.horizontalHeader()
    h.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    h.setSectionResizeMode(stretch, QHeaderView.ResizeMode.Stretch)
    h.setMinimumSectionSize(48)
    # Tab moves on to the next widget instead of walking every cell; arrows move inside the table
    t.setTabKeyNavigation(False)
    if wrap:
        t.verticalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    return t
