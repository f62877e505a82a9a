"""Follow the system light/dark scheme (Qt 6.5+ reports it; Fusion draws both well on every OS)."""

from __future__ import annotations

import contextlib

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication


def dark_palette() -> QPalette:
    p = QPalette()
    base, window, text = QColor("#1e1f22"), QColor("#2b2d30"), QColor("#dfe1e5")
    for role, color in (
        (QPalette.ColorRole.Window, window),
        (QPalette.ColorRole.WindowText, text),
        (QPalette.ColorRole.Base, base),
        (QPalette.ColorRole.AlternateBase, window),
        (QPalette.ColorRole.Text, text),
        (QPalette.ColorRole.Button, QColor("#3c3f43")),
        # Fusion draws frames, bevels and grid lines from these: unset, edits and boxes vanish on dark
        (QPalette.ColorRole.Light, QColor("#5a5d62")),
        (QPalette.ColorRole.Midlight, QColor("#46494e")),
        (QPalette.ColorRole.Mid, QColor("#5f6369")),
        (QPalette.ColorRole.Dark, QColor("#151618")),
        (QPalette.ColorRole.Shadow, QColor("#0c0c0d")),
        (QPalette.ColorRole.ButtonText, text),
        (QPalette.ColorRole.Highlight, QColor("#3574f0")),
        (QPalette.ColorRole.HighlightedText, QColor("#ffffff")),
        (QPalette.ColorRole.ToolTipBase, base),
        (QPalette.ColorRole.ToolTipText, text),
        (QPalette.ColorRole.PlaceholderText, QColor("#8c8f94")),
        (QPalette.ColorRole.Link, QColor("#6ea8fe")),
    ):
        p.setColor(role, color)
    # greyed but legible: Fusion lightens a disabled button's face, so its text needs to stand well above it
    p.setColor(QPalette.ColorGroup.Disabled, QPalette.ColorRole.Text, QColor("#8a8e94"))
    p.setColor(QPalette.ColorGroup.Disabled, QPalette.ColorRole.WindowText, QColor("#8a8e94"))
    p.setColor(QPalette.ColorGroup.Disabled, QPalette.ColorRole.Button, QColor("#313337"))
    p.setColor(QPalette.ColorGroup.Disabled, QPalette.ColorRole.ButtonText, QColor("#8a8e94"))
    return p


CHOICES = ("system", "light", "dark")


class Theme:
    """The palette for a choice of system (follow the OS, live), light or dark."""

    def __init__(self, app: QApplication) -> None:
        self.app = app
        self.choice = "system"
        app.setStyle("Fusion")
        QGuiApplication.styleHints().colorSchemeChanged.connect(self._scheme_changed)
        self.update()

    def _scheme_changed(self, _scheme: Qt.ColorScheme) -> None:
        self.update()

    def close(self) -> None:
        """Disconnect from the style hints: no Python callback is left on Qt's side at exit."""
        with contextlib.suppress(RuntimeError, TypeError):
            QGuiApplication.styleHints().colorSchemeChanged.disconnect(self._scheme_changed)

    def set(self, choice: str) -> None:
        self.choice = choice if choice in CHOICES else "system"
        self.update()

    def update(self) -> None:
        if self.choice == "system":
            dark = QGuiApplication.styleHints().colorScheme() == Qt.ColorScheme.Dark
        else:
            dark = self.choice == "dark"
        self.app.setPalette(dark_palette() if dark else self.app.style().standardPalette())


def apply(app: QApplication) -> Theme:
    theme = getattr(app, "_switchyard_theme", None)
    if theme is None:
        theme = Theme(app)
        app._switchyard_theme = theme  # type: ignore[attr-defined]  # one per QApplication
    return theme


def release(app: QApplication) -> None:
    """The app's Theme disconnected and dropped (quit: before the interpreter finalizes)."""
    theme = getattr(app, "_switchyard_theme", None)
    if theme is not None:
        theme.close()
        del app._switchyard_theme  # type: ignore[attr-defined]
