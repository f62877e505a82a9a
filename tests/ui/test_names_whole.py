"""Names are never cut (issue 32, last round: cut names; issue 20's "70B and 8B look the same"): at
1024x640 two downloads of one long-named repository, which differ only in their quantization at the end,
show their whole names in the Downloads list and in the Jobs list, as Qt lays the cells out."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
pytest.importorskip("PySide6")
pytest.importorskip("qasync")

from tests.support.asyncwait import until
from tests.support.desks import run_desk
from tests.support.fakehub import FakeHub

REPO = "acme-research-lab/Meta-Llama-3.1-70B-Instruct-abliterated-uncensored-GGUF"
MIB = 1 << 20


def shown_whole(table: Any, row: int, col: int) -> bool:
    """Whether the cell's text fits its cell as the style draws it: one line (or, where the table wraps,
    lines broken at word boundaries) within the column's width and the row's height; else Qt elides it."""
    from PySide6.QtGui import QFontMetrics, QTextLayout, QTextOption
    from PySide6.QtWidgets import QStyle

    text = table.item(row, col).text()
    style = table.style()
    margin = style.pixelMetric(QStyle.PixelMetric.PM_FocusFrameHMargin, None, table) + 1
    width = table.columnWidth(col) - 2 * margin
    fm = QFontMetrics(table.font())
    if not table.wordWrap():
        return fm.horizontalAdvance(text) <= width
    layout = QTextLayout(text, table.font())
    option = QTextOption()
    option.setWrapMode(QTextOption.WrapMode.WordWrap)
    layout.setTextOption(option)
    layout.beginLayout()
    lines, widest = 0, 0.0
    while (line := layout.createLine()).isValid():
        line.setLineWidth(width)
        widest = max(widest, line.naturalTextWidth())
        lines += 1
    layout.endLayout()
    return widest <= width and lines * fm.lineSpacing() <= table.rowHeight(row)


def test_long_names_are_shown_whole_at_1024(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path, fake_hub: FakeHub
) -> None:
    blob = bytes(range(256)) * (4 * MIB // 256)
    files = {"m-Q4_K_M.gguf": blob, "m-Q8_0.gguf": blob[: 3 * MIB]}
    fake_hub.add_repo(REPO, files, tags=["gguf"])
    fake_hub.faults.delay_per_chunk = 0.05  # slow: both stay running while the rows are read

    async def body(desk: Any) -> None:
        disc = desk.window.show_page("Discover")
        await disc.open_model(REPO)
        for quant in ("Q4_K_M", "Q8_0"):
            await disc.download(quant)
        panel, jobs = disc.panel, disc.panel.jobs_panel
        await until(lambda: len(panel.rows) == 2 and len(jobs.rows) == 2, what="two rows each", limit=30)
        await asyncio.sleep(0.3)  # laid out
        names = {panel.table.item(r, 0).text() for r in range(2)}
        assert names == {f"{REPO}:Q4_K_M", f"{REPO}:Q8_0"}, names
        for table, what in ((panel.table, "Downloads"), (jobs.table, "Jobs")):
            for r in range(table.rowCount()):
                assert shown_whole(table, r, 0), f"{what} cuts {table.item(r, 0).text()!r}"
        fake_hub.faults.delay_per_chunk = 0
        for jid in list(panel.rows):
            await desk.runtime.downloads.cancel(jid)

    run_desk(qloop, qapp, isolated_env, tmp_path / "models", body)
