"""The window as a new user meets it, at 1024×640 on a local hub (issue 20): a second search does not keep
the old model, nothing numeric is elided, names keep what tells them
apart, the downloads panel stays usable."""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
pytest.importorskip("PySide6")
qasync = pytest.importorskip("qasync")

from PySide6.QtCore import QRect, Qt  # noqa: E402
from PySide6.QtTest import QTest  # noqa: E402
from PySide6.QtWidgets import QLabel, QStyle, QTableWidget  # noqa: E402

from app.core.paths import Paths  # noqa: E402
from app.core.settings import Settings  # noqa: E402
from tests.support.asyncwait import until  # noqa: E402
from tests.support.fakehub import FakeHub  # noqa: E402
from tests.support.tinymodels import CHAT, MEDIUM, write_tiny_gguf  # noqa: E402

BIG = "acme/Tiny-Llama-70B-Instruct-GGUF"
SMALL = "acme/Tiny-Llama-8B-Instruct-GGUF"
OTHER = "zeta/other-GGUF"
SHOTS = os.environ.get("SWITCHYARD_DESKTOP_SHOTS")  # a folder: save what the test sees, to look at
FIGURE = re.compile(r"\d")


def shot(widget: Any, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        widget.grab().save(str(Path(SHOTS) / name))


def shown(table: QTableWidget, row: int, col: int) -> str:
    """The text the cell paints: the whole text where it fits (on its lines, for a wrapping table), else
    elided as the view elides it in the column's width."""
    item = table.item(row, col)
    assert item is not None
    text, fm = item.text(), table.fontMetrics()
    margin = table.style().pixelMetric(QStyle.PixelMetric.PM_FocusFrameHMargin) + 1
    room = table.columnWidth(col) - 2 * margin
    if table.wordWrap():
        flags = Qt.TextFlag.TextWordWrap | Qt.TextFlag.TextWrapAnywhere
        need = fm.boundingRect(QRect(0, 0, room, 10_000), int(flags), text).height()
        return text if need <= table.rowHeight(row) else text[: len(text) // 2] + "…"
    return fm.elidedText(text, table.textElideMode(), room)


def figures_whole(table: QTableWidget, *, names: int = 0) -> list[str]:
    """Every cell (but the name column) whose text carries a figure and is not painted whole."""
    cut = []
    for r in range(table.rowCount()):
        for c in range(table.columnCount()):
            item = table.item(r, c)
            if c == names or item is None or not FIGURE.search(item.text()):
                continue
            if shown(table, r, c) != item.text():
                cut.append(item.text())
    return cut


@pytest.fixture
def hub_repos(fake_hub: FakeHub, tmp_path: Path) -> FakeHub:
    gguf = write_tiny_gguf(tmp_path / "src" / "tiny-Q8_0.gguf", CHAT)
    for repo in (BIG, SMALL, OTHER):
        fake_hub.add_repo(repo, {"tiny-Q8_0.gguf": gguf, "tiny-Q4_K_M.gguf": gguf}, tags=["gguf"])
    return fake_hub


def test_discover_at_1024_by_640(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, hub_repos: FakeHub, isolated_env: Path
) -> None:
    from app.ui.desktop import Desktop

    paths = Paths(home=isolated_env)
    settings = Settings.flat(port=0, models_dirs=(tmp_path / "models",), monitor_interval_s=0)

    async def scenario() -> None:
        async with Desktop(paths, settings, qapp=qapp) as desk:
            w = desk.window
            w.resize(1024, 640)
            disc = w.show_page("Discover")
            # defect 3: the window fits a 1024-px screen
            assert w.minimumSizeHint().width() <= 1024, w.minimumSizeHint()
            # defect 1: a second search drops the previous model; its first row opens on a click
            disc.query.setText("Tiny-Llama")
            disc.search()
            await desk.tasks.settle()
            disc.results.selectRow(0)
            await desk.tasks.settle()
            first = disc.detail["id"] if disc.detail else None
            assert first in (BIG, SMALL)
            disc.query.setText("other")
            disc.search()
            await desk.tasks.settle()
            assert disc.results.item(0, 0).text().startswith(OTHER)
            assert disc.detail is None and disc.quants.rowCount() == 0, "the old model is still shown"
            assert not disc.results.selectionModel().selectedRows()
            rect = disc.results.visualRect(disc.results.model().index(0, 0))
            QTest.mouseClick(disc.results.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
            await desk.tasks.settle()
            assert disc.detail is not None and disc.detail["id"] == OTHER
            # defect 5: names are cut at the end, so 70B and 8B stay apart
            disc.query.setText("Tiny-Llama")
            disc.search()
            await desk.tasks.settle()
            await asyncio.sleep(0.05)
            shot(w, "discover-names.png")
            names = {shown(disc.results, r, 0) for r in range(disc.results.rowCount())}
            assert names == {BIG, SMALL}, names  # whole: wrapped, not cut
            disc.results.selectRow(0)
            await desk.tasks.settle()
            await asyncio.sleep(0.05)
            # defect 9: the context shown is one request's, the total in the detail
            v = disc.detail["fit"]["quantizations"]["Q8_0"]
            parallel = v["plan"]["chosen"]["parallel"]
            r8 = next(r for r in range(disc.quants.rowCount()) if disc.quants.item(r, 0).text() == "Q8_0")
            assert parallel > 1 and disc.quants.item(r8, 3).text() == str(v["max_ctx"] // parallel)
            assert f"{v['max_ctx']} in all, {parallel} requests at once" in disc.quants.item(r8, 3).toolTip()
            # defect 3: no figure elided in the results, the files or the downloads
            assert figures_whole(disc.results) == []
            assert figures_whole(disc.quants) == []
            shot(w, "discover-1024.png")
            # defect 4: Tab walks out of the tables and reaches the buttons inside them
            w.activateWindow()
            disc.query.setFocus()
            seen = []
            for _ in range(40):
                QTest.keyClick(qapp.focusWidget(), Qt.Key.Key_Tab)
                seen.append(qapp.focusWidget())
            assert disc.results in seen and disc.quants in seen
            cells = {disc.quants.cellWidget(r, c) for r in range(disc.quants.rowCount()) for c in (4, 5)}
            assert cells <= set(seen), [type(x).__name__ for x in seen]
            assert disc.query in seen[1:], "Tab never came back round"
            if SHOTS:  # what the focus marker looks like, reached with Tab as a user does
                for want, name in ((disc.quants.cellWidget(0, 5), "download"), (disc.results, "results")):
                    for _ in range(40):
                        if qapp.focusWidget() is want:
                            break
                        QTest.keyClick(qapp.focusWidget(), Qt.Key.Key_Tab)
                    shot(w, f"focus-{name}.png")
            assert "Ctrl+Q" in w.about_text() and "Tab" in w.about_text()

    qloop.run_until_complete(asyncio.wait_for(scenario(), 90))


MIXED = "acme/Mixed-GGUF"


def test_downloads_panel_and_a_model_that_does_not_fit(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, fake_hub: FakeHub, isolated_env: Path
) -> None:
    """Defects 6 and 7: one row per model, a failure that keeps the buttons in view, "In Library", finished
    rows kept over a restart and cleared; a file that does not fit warns, names one that fits, shows bars."""
    from app.ui.desktop import Desktop

    small = write_tiny_gguf(tmp_path / "src" / "m-Q4_K_M.gguf", CHAT)
    big = write_tiny_gguf(tmp_path / "src" / "m-Q8_0.gguf", MEDIUM)
    fake_hub.add_repo(MIXED, {"m-Q4_K_M.gguf": small, "m-Q8_0.gguf": big}, tags=["gguf"])
    paths = Paths(home=isolated_env)
    # a context so long that the larger file's KV cache (24 GiB) cannot fit, the smaller's (3 GiB) can
    settings = Settings.flat(
        port=0, models_dirs=(tmp_path / "models",), monitor_interval_s=0, ctx_size=12 << 20, parallel=1
    )

    async def first() -> None:
        async with Desktop(paths, settings, qapp=qapp) as desk:
            w = desk.window
            w.resize(1024, 640)
            disc = w.show_page("Discover")
            await disc.open_model(MIXED)
            row = {disc.quants.item(r, 0).text(): r for r in range(disc.quants.rowCount())}
            assert disc.quants.item(row["Q8_0"], 2).text() == "does not fit"
            assert disc.quants.item(row["Q4_K_M"], 2).text().startswith("CPU only")
            # defect 7: the Why of a file that does not fit has bars, no placeholders, and a way out
            dlg = disc.why("Q8_0")
            assert dlg is not None and dlg.windowType() == Qt.WindowType.Window and not dlg.isModal()
            from app.ui.explain_view import MemoryBar

            assert dlg.view.findChildren(MemoryBar), "no memory bar for a model that does not fit"
            text = " ".join(lab.text() for lab in dlg.view.findChildren(QLabel))
            assert "largest context -" not in text and "~0 tok/s" not in text, text
            assert "Fits here instead:</b> Q4_K_M" in text
            shot(dlg, "why-too-large.png")
            dlg.close()
            # ... and Download warns first, naming the one that fits
            dl = disc.quants.cellWidget(row["Q8_0"], 5)
            assert dl.text() == "Download anyway"
            dl.click()
            await desk.tasks.settle()
            assert (
                not disc._jobs
                and "does not fit" in disc.status.text()
                and "Q4_K_M fits" in disc.status.text()
            )
            # defect 6: a failure keeps its words out of the State column, the buttons stay in view
            fake_hub.faults.corrupt = {"m-Q8_0.gguf"}
            job = await disc.download("Q8_0")
            await until(lambda: disc.job_state(job.id) == "failed", what="failed", limit=60)
            r = disc._rows[job.id]
            assert disc.downloads.item(r, 4).text() == "failed"
            problem = disc.panel.problem.text()
            assert disc.panel.problem.isVisible() and "Q8_0 failed:" in problem
            # defect 8: the window names its button, not the command line
            assert "press Resume in the Downloads list" in problem and "pull" not in problem, problem
            view = disc.downloads.viewport().width()
            for col in (5, 6):
                assert disc.downloads.columnViewportPosition(col) + disc.downloads.columnWidth(col) <= view
            # a finished download asked again replaces its row; the file shows as in the Library
            fake_hub.faults.corrupt = set()
            done = await disc.download("Q4_K_M")
            await until(lambda: disc.job_state(done.id) == "completed", what="completed", limit=60)
            again = await disc.download("Q4_K_M")
            await until(lambda: disc.job_state(again.id) == "completed", what="completed again", limit=60)
            labels = [disc.downloads.item(r, 0).text() for r in range(disc.downloads.rowCount())]
            assert labels.count(f"{MIXED}:Q4_K_M") == 1, labels
            await until(
                lambda: disc.quants.cellWidget(row["Q4_K_M"], 5).text() == "In Library", what="In Library"
            )
            assert not disc.quants.cellWidget(row["Q4_K_M"], 5).isEnabled()
            assert figures_whole(disc.downloads) == []
            shot(w, "downloads-1024.png")

    async def second() -> None:
        async with Desktop(paths, settings, qapp=qapp) as desk:
            disc = desk.window.show_page("Discover")
            states = sorted(j["state"] for j in disc._jobs.values())
            assert states == ["completed", "failed"], states  # both come back, not only the failure
            assert disc.panel.clear_btn.isEnabled()
            assert disc.panel.clear_finished() == 1
            assert [j["state"] for j in disc._jobs.values()] == ["failed"]

    async def third() -> None:
        async with Desktop(paths, settings, qapp=qapp) as desk:
            disc = desk.window.show_page("Discover")
            assert [j["state"] for j in disc._jobs.values()] == ["failed"]  # cleared stays cleared

    for step in (first, second, third):
        qloop.run_until_complete(asyncio.wait_for(step(), 90))
