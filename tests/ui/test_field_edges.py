"""Field and check-box edges drawn at 3:1 in both themes (issue 32; WCAG 1.4.11).

The real widgets offscreen, with a real Desktop where a page needs one (tests/support/desks.py)."""

from __future__ import annotations

import os
from typing import Any

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
pytest.importorskip("PySide6")
pytest.importorskip("qasync")


# ---- dark theme: the edges of fields and check boxes at 3:1 (WCAG 1.4.11), as drawn ---------------------
@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_field_and_check_box_edges_are_drawn_at_three_to_one(qapp: Any, scheme: str) -> None:
    """The pixels on each control's outer edge, as the style draws them (no focus: the focus ring is
    another colour), against the window outside and the field's fill inside."""
    from PySide6.QtGui import QColor, QPalette
    from PySide6.QtWidgets import (
        QApplication,
        QCheckBox,
        QComboBox,
        QLineEdit,
        QPlainTextEdit,
        QPushButton,
        QRadioButton,
        QSpinBox,
        QVBoxLayout,
        QWidget,
    )

    from app.ui import theme
    from tests.ui.test_contrast import NON_TEXT, contrast

    t = theme.apply(qapp)
    holder = QWidget()
    try:
        t.set(scheme)
        pal = QApplication.palette()
        window, base = pal.color(QPalette.ColorRole.Window), pal.color(QPalette.ColorRole.Base)
        controls = [QLineEdit("text"), QSpinBox(), QPlainTextEdit(), QComboBox()]
        controls += [QCheckBox("unticked"), QRadioButton("unpicked")]
        lay = QVBoxLayout(holder)
        for c in controls:
            lay.addWidget(c)
        elsewhere = QPushButton("focus here")
        lay.addWidget(elsewhere)
        holder.resize(320, 360)
        holder.show()
        elsewhere.setFocus()
        QApplication.processEvents()
        low = []
        for c in controls:
            img = c.grab().toImage()
            y = img.height() // 2
            # the edge: the strongest of the outermost pixels on the left, at mid-height
            best = max(
                min(contrast(QColor(img.pixel(x, y)), window), contrast(QColor(img.pixel(x, y)), base))
                for x in range(3)
            )
            if best < NON_TEXT:
                low.append(f"{type(c).__name__} {best:.2f}:1")
        assert not low, f"{scheme}: edges under 3:1: " + ", ".join(low)
    finally:
        # deleted here, not by a garbage collection that may come in the middle of a later test's Qt call
        from shiboken6 import delete

        holder.close()
        delete(holder)
        t.set("system")
