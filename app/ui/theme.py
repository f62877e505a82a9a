"""Follow the system light/dark scheme (Qt 6.5+ reports it; Fusion draws both well on every OS)."""

from __future__ import annotations

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
        (QPalette.ColorRole.Button, window),
        (QPalette.ColorRole.ButtonText, text),
        (QPalette.ColorRole.Highlight, QColor("#3574f0")),
        (QPalette.ColorRole.HighlightedText, QColor("#ffffff")),
        (QPalette.ColorRole.ToolTipBase, base),
        (QPalette.ColorRole.ToolTipText, text),
        (QPalette.ColorRole.PlaceholderText, QColor("#8c8f94")),
        (QPalette.ColorRole.Link, QColor("#6ea8fe")),
    ):
        p.setColor(role, color)
    p.setColor(QPalette.ColorGroup.Disabled, QPalette.ColorRole.Text, QColor("#6f7378"))
    p.setColor(QPalette.ColorGroup.Disabled, QPalette.ColorRole.ButtonText, QColor("#6f7378"))
    return p


def apply(app: QApplication) -> None:
    app.setStyle("Fusion")
    hints = QGuiApplication.styleHints()

    def update() -> None:
        dark = hints.colorScheme() == Qt.ColorScheme.Dark
        app.setPalette(dark_palette() if dark else app.style().standardPalette())

    update()
    hints.colorSchemeChanged.connect(lambda _=None: update())
