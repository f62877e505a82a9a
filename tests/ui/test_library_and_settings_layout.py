"""The Library and Settings pages at 1024x640: rows in view, no scrollbar (issue 32, items 14, 16).

The real widgets offscreen, with a real Desktop where a page needs one (tests/support/desks.py)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
pytest.importorskip("PySide6")
pytest.importorskip("qasync")

from tests.support.desks import run_desk


def _visible_rows(table: Any) -> int:
    """How many rows can be seen whole, from the top, in the table's viewport."""
    view = table.viewport().height()
    n, y = 0, 0
    for r in range(table.rowCount()):
        y += table.rowHeight(r)
        if y > view:
            break
        n += 1
    return n


# ---- 14. the Library at 1024x640: the table keeps room for rows; the settings pane shares by a splitter ----
def test_library_table_and_settings_pane_share_the_height_at_1024x640(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path
) -> None:
    from PySide6.QtWidgets import QSplitter

    from tests.support.tinymodels import CHAT, write_tiny_gguf

    models = tmp_path / "models"
    for i in range(12):  # names long enough to wrap onto two lines, as real ones do at 1024 px
        write_tiny_gguf(models / f"Some-Long-Model-Name-8B-Instruct-{i:02d}-Q4_K_M.gguf", CHAT)

    async def body(desk: Any) -> None:
        w = desk.window
        lib = w.show_page("Library")
        await lib.refresh()
        await desk.tasks.settle()
        lib.select("Some-Long-Model-Name-8B-Instruct-03-Q4_K_M")
        await desk.tasks.settle()
        await asyncio.sleep(0.1)
        assert w.height() == 640
        shown = _visible_rows(lib.table)
        assert shown >= 7, f"only {shown} rows of the Library show at 1024x640"
        # the pane is still all there: below the table, behind a splitter a person can drag, scrolling
        split = lib.table.parentWidget()
        assert isinstance(split, QSplitter) and split.orientation().name == "Vertical"
        assert split.isAncestorOf(lib.tune) and lib.tune.isVisible()
        table_h, pane_h = split.sizes()
        split.setSizes([table_h - 150, pane_h + 150])  # dragged down: the pane grows, the table keeps rows
        await asyncio.sleep(0.05)
        assert _visible_rows(lib.table) >= 3
        assert w.height() == 640 and w.minimumSizeHint().height() <= 640, w.minimumSizeHint()

    run_desk(qloop, qapp, isolated_env, models, body)


# ---- 16. Settings at 1024x640: everything fits, no scrollbar (its long handle read as a second bar) -----
def test_settings_fit_1024x640_without_a_scrollbar(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path
) -> None:
    from PySide6.QtWidgets import QAbstractScrollArea

    async def body(desk: Any) -> None:
        w = desk.window
        page = w.show_page("Settings")
        await asyncio.sleep(0.1)
        areas = [a for a in page.findChildren(QAbstractScrollArea) if a.isVisible()]
        bars = [a for a in areas if a.verticalScrollBar().isVisible() or a.horizontalScrollBar().isVisible()]
        inner = page.body.parentWidget()
        assert not bars, f"scrollbars at 1024x640: content {inner.sizeHint().height()} px, " + ", ".join(
            f"{type(a).__name__} {a.viewport().height()} px" for a in bars
        )
        # a smaller window scrolls, with one scrollbar: the page's own
        w.resize(1024, 520)
        await asyncio.sleep(0.1)
        bars = [a for a in areas if a.verticalScrollBar().isVisible()]
        assert len(bars) == 1, bars

    run_desk(qloop, qapp, isolated_env, tmp_path / "models", body)
