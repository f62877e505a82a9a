"""Follow the system light/dark scheme (Qt 6.5+ reports it; Fusion draws both well on every OS)."""

from __future__ import annotations

import contextlib
from typing import Any

from PySide6.QtCore import QEvent, QRectF, Qt
from PySide6.QtGui import QColor, QGuiApplication, QPainter, QPalette, QPen
from PySide6.QtWidgets import (
    QApplication,
    QLabel,
    QPlainTextEdit,
    QProxyStyle,
    QStyle,
    QStyleOption,
    QTextEdit,
    QWidget,
)

# words in colour (errors, "Running", "Fits", a tag) per scheme, each at least 4.5:1 on the window and on
# a text field in its scheme (WCAG AA; tests/ui/test_contrast.py measures every pair), and the keyboard
# focus ring, at least 3:1 beside a button and the window (WCAG's non-text contrast), and the edge of a
# field or check box, at least 3:1 against the window outside it and the field's own fill inside
TONES = {
    "error": ("#b3261e", "#ff8a80"),
    "ok": ("#1b5e20", "#81c995"),
    "accent": ("#0d47a1", "#8ab4f8"),
    "muted": ("#5f6368", "#9aa0a6"),
    "focus": ("#1d64a8", "#8ab4f8"),
    "border": ("#767676", "#8a8e94"),
}


def is_dark(palette: QPalette | None = None) -> bool:
    pal = palette if palette is not None else QGuiApplication.palette()
    return pal.color(QPalette.ColorRole.Window).lightness() < 128


def tone(name: str, palette: QPalette | None = None) -> str:
    """The colour for `name` (TONES) in the scheme of `palette` (the application's when None)."""
    light, dark = TONES[name]
    return dark if is_dark(palette) else light


def palette_event(event: QEvent) -> bool:
    return event.type() in (QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange)


class ToneLabel(QLabel):
    """A label whose text is drawn in a TONES colour that follows a theme switch (an error line in the
    light theme's red stays legible once the window turns dark)."""

    def __init__(self, text: str, name: str, parent: QWidget | None = None) -> None:
        super().__init__(text, parent)
        self.tone_name = name
        self._follow()

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if palette_event(event):
            self._follow()

    def colour(self) -> QColor:
        return self.palette().color(QPalette.ColorRole.WindowText)

    def _follow(self) -> None:
        # the palette, not a style sheet: a widget with a style sheet is no longer told of palette changes
        want = QColor(tone(self.tone_name, self.palette()))
        if self.colour() != want:
            pal = self.palette()
            pal.setColor(QPalette.ColorRole.WindowText, want)
            self.setPalette(pal)


def light_palette(style: Any) -> QPalette:
    """Fusion's own light palette with the pairs it leaves under 4.5:1 raised: selected text, placeholder
    text and visited links."""
    p = QPalette(style.standardPalette())
    for role, color in (
        (QPalette.ColorRole.Highlight, QColor("#1d64a8")),
        (QPalette.ColorRole.HighlightedText, QColor("#ffffff")),
        (QPalette.ColorRole.PlaceholderText, QColor("#6b6b6b")),
        (QPalette.ColorRole.Link, QColor("#0b57d0")),
        (QPalette.ColorRole.LinkVisited, QColor("#7b1fa2")),
    ):
        for group in (QPalette.ColorGroup.Active, QPalette.ColorGroup.Inactive):
            p.setColor(group, role, color)
    return p


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
        (QPalette.ColorRole.Highlight, QColor("#2f65d1")),  # white on it: 5.4:1
        (QPalette.ColorRole.HighlightedText, QColor("#ffffff")),
        (QPalette.ColorRole.ToolTipBase, base),
        (QPalette.ColorRole.ToolTipText, text),
        (QPalette.ColorRole.PlaceholderText, QColor("#8c8f94")),
        (QPalette.ColorRole.Link, QColor("#6ea8fe")),
        (QPalette.ColorRole.LinkVisited, QColor("#ce93d8")),
    ):
        p.setColor(role, color)
    # greyed but legible: Fusion lightens a disabled button's face, so its text needs to stand well above it
    p.setColor(QPalette.ColorGroup.Disabled, QPalette.ColorRole.Text, QColor("#8a8e94"))
    p.setColor(QPalette.ColorGroup.Disabled, QPalette.ColorRole.WindowText, QColor("#8a8e94"))
    p.setColor(QPalette.ColorGroup.Disabled, QPalette.ColorRole.Button, QColor("#313337"))
    p.setColor(QPalette.ColorGroup.Disabled, QPalette.ColorRole.ButtonText, QColor("#8a8e94"))
    return p


CHOICES = ("system", "light", "dark")
# what draws the focus ring: the widget's outer part (a check box's text gets Qt's own focus rectangle)
_RINGED_PRIMITIVES = (
    QStyle.PrimitiveElement.PE_PanelButtonCommand,
    QStyle.PrimitiveElement.PE_PanelLineEdit,
    QStyle.PrimitiveElement.PE_FrameFocusRect,
)
_RINGED_COMPLEX = (QStyle.ComplexControl.CC_ComboBox, QStyle.ComplexControl.CC_SpinBox)
# what gets an edge in TONES["border"]: Fusion draws these from the window colour darkened, about 1.1:1
# on the dark theme and under 2:1 on the light one, so a field or an unticked box could not be seen
_EDGED_PRIMITIVES = (
    QStyle.PrimitiveElement.PE_FrameLineEdit,
    QStyle.PrimitiveElement.PE_IndicatorCheckBox,
    QStyle.PrimitiveElement.PE_IndicatorRadioButton,
)


class FocusStyle(QProxyStyle):
    """Fusion, with a keyboard focus ring that can be seen: Fusion's own marker is its highlight colour
    darkened, under 2:1 beside a dark button. The ring is TONES["focus"], 2 px, round the focused widget."""

    def drawPrimitive(self, element: Any, option: Any, painter: Any, widget: Any = None) -> None:
        if element == QStyle.PrimitiveElement.PE_FrameFocusRect:  # ours instead of Fusion's faint one
            self._ring(option, painter, widget, inset=0)
            return
        super().drawPrimitive(element, option, painter, widget)
        if element in _EDGED_PRIMITIVES or (
            element == QStyle.PrimitiveElement.PE_Frame and _typed_in(widget)
        ):
            _edge(option, painter, round_=element == QStyle.PrimitiveElement.PE_IndicatorRadioButton)
        if element in _RINGED_PRIMITIVES and _focused(option, widget):
            self._ring(option, painter, widget)

    def drawComplexControl(self, control: Any, option: Any, painter: Any, widget: Any = None) -> None:
        super().drawComplexControl(control, option, painter, widget)
        if control in _RINGED_COMPLEX:
            if getattr(option, "frame", True):
                _edge(option, painter)
            if _focused(option, widget):
                self._ring(option, painter, widget)

    def _ring(
        self, option: QStyleOption, painter: QPainter, widget: QWidget | None, *, inset: float = 1
    ) -> None:
        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.setPen(QPen(QColor(tone("focus", option.palette)), 2))
        painter.setBrush(Qt.BrushStyle.NoBrush)
        painter.drawRoundedRect(QRectF(option.rect).adjusted(inset, inset, -inset, -inset), 3, 3)
        painter.restore()


def _edge(option: QStyleOption, painter: QPainter, *, round_: bool = False) -> None:
    """A 1-px edge in TONES["border"] on the outermost pixels of `option.rect` (crisp: on pixel centres)."""
    painter.save()
    painter.setRenderHint(QPainter.RenderHint.Antialiasing, round_)
    painter.setPen(QPen(QColor(tone("border", option.palette)), 1))
    painter.setBrush(Qt.BrushStyle.NoBrush)
    rect = QRectF(option.rect).adjusted(0.5, 0.5, -0.5, -0.5)
    if round_:
        painter.drawEllipse(rect)
    else:
        painter.drawRoundedRect(rect, 2, 2)
    painter.restore()


def _typed_in(widget: QWidget | None) -> bool:
    """A multi-line field a person types into (a chat input), not a read-only view or a table."""
    return isinstance(widget, QPlainTextEdit | QTextEdit) and not widget.isReadOnly()


def _focused(option: QStyleOption, widget: QWidget | None) -> bool:
    return bool(option.state & QStyle.StateFlag.State_HasFocus) and widget is not None


class Theme:
    """The palette for a choice of system (follow the OS, live), light or dark."""

    def __init__(self, app: QApplication) -> None:
        self.app = app
        self.choice = "system"
        self.style = FocusStyle("Fusion")  # the app owns it once set; kept here too for its Python side
        app.setStyle(self.style)
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
        self.app.setPalette(dark_palette() if dark else light_palette(self.app.style()))


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
