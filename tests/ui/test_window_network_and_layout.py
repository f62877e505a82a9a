"""The window, round two (issue 32), what the first pass left: the network switch applied by Stop and Start,
the jobs panel agreeing with the download, the Library and Settings at 1024x640, dark-theme field borders.
Each drives the real widgets offscreen, with a real Desktop and its real local server."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
pytest.importorskip("PySide6")
pytest.importorskip("qasync")

from tests.ui.test_window_walk import run_desk


async def _get(url: str, *, key: str | None = None, origin: str | None = None) -> tuple[int, dict[str, str]]:
    import aiohttp

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if origin:
        headers["Origin"] = origin
    async with aiohttp.ClientSession() as s, s.get(url, headers=headers, ssl=False) as r:
        await r.read()
        return r.status, dict(r.headers)


# ---- 6. the network switch applies without quitting; Stop and Start take the guards as they are now ------
def test_network_switch_applies_now_and_stop_start_rebuilds_the_guards(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path
) -> None:
    from app.ui.pages.server import lan_addresses

    async def body(desk: Any) -> None:
        srv = desk.window.show_page("Server")
        ctl = desk.server
        assert ctl.running and ctl.host == "127.0.0.1"
        key = srv.create_key("laptop")
        assert key
        srv.lan.click()  # as a person ticks it: the clicked signal runs set_lan
        await desk.tasks.settle()
        assert srv.lan.isChecked() and srv.lan.isEnabled()
        # applied now, no restart of Switchyard: listening on every address, over HTTPS, keys required
        assert ctl.running and ctl.host == "0.0.0.0" and ctl.tls is not None, (ctl.host, ctl.error)
        port = int(ctl.url.rsplit(":", 1)[1])
        note = srv.lan_note.text()
        lan = lan_addresses()
        if lan:  # a machine on a network: the note names the address, and that address answers
            assert note.startswith("Other computers use: ") and f"https://{lan[0]}:{port}/v1" in note, note
            status, _ = await _get(f"https://{lan[0]}:{port}/v1/models", key=key)
            assert status == 200, status
            status, _ = await _get(f"https://{lan[0]}:{port}/v1/models")
            assert status == 401, status
        else:
            assert "No network address" in note, note
        # Stop and Start (the button, twice) keep it, and say the address again
        srv.toggle.click()
        await desk.tasks.settle()
        assert not ctl.running and "once the server is started" in srv.lan_note.text()
        srv.toggle.click()
        await desk.tasks.settle()
        assert ctl.running and ctl.host == "0.0.0.0"
        # unticked: back to this computer only, plain HTTP, at once
        srv.lan.click()
        await desk.tasks.settle()
        assert ctl.host == "127.0.0.1" and ctl.tls is None and srv.lan_note.text() == ""
        # a guard setting changed while listening (the admin API, settings.json): the next Start applies it
        site = "http://localhost:3000"
        status, _ = await _get(f"{ctl.url}/v1/models", origin=site)
        assert status == 403  # not listed
        await desk.runtime.change_settings({"cors_origins": [site], "require_api_key": True})
        srv.toggle.click()
        await desk.tasks.settle()
        srv.toggle.click()
        await desk.tasks.settle()
        status, headers = await _get(f"{ctl.url}/v1/models", origin=site, key=key)
        assert status == 200 and headers.get("Access-Control-Allow-Origin") == site, (status, headers)
        status, _ = await _get(f"{ctl.url}/v1/models")
        assert status == 401, "require_api_key was not applied by Stop and Start"

    run_desk(qloop, qapp, isolated_env, tmp_path / "models", body)


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


# ---- 9. the jobs panel says what the download says: paused, queued again, running, gone when done --------
def test_jobs_panel_follows_the_download_through_pause_and_resume(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path, fake_hub: Any
) -> None:
    from tests.support.tinymodels import CHAT, write_tiny_gguf

    gguf = write_tiny_gguf(tmp_path / "src" / "slow-Q8_0.gguf", CHAT).read_bytes()
    fake_hub.add_repo("acme/Slow-GGUF", {"slow-Q8_0.gguf": gguf}, tags=["gguf"])
    fake_hub.faults.rate_bps = 64 * 1024  # slow enough to pause half-way

    async def body(desk: Any) -> None:
        disc = desk.window.show_page("Discover")
        loop = asyncio.get_running_loop()
        seen: dict[str, asyncio.Future[None]] = {k: loop.create_future() for k in ("progress", "completed")}

        def on(kind: str, _d: Any) -> None:
            for name, fut in seen.items():
                if kind == f"download.{name}" and not fut.done():
                    fut.set_result(None)

        desk.bridge.received.connect(on)
        disc.query.setText("Slow")
        disc.search()
        await desk.tasks.settle()
        disc.results.selectRow(0)
        await desk.tasks.settle()
        disc.download("Q8_0")
        await asyncio.wait_for(seen["progress"], 30)
        downloads, jobs = disc.panel, disc.panel.jobs_panel
        (dl_id,) = list(downloads.jobs)
        (job_id,) = list(jobs.jobs)
        _bar, pause, _cancel = downloads.widgets[dl_id]
        pause.click()  # the downloads table's own Pause button
        for _ in range(100):
            await asyncio.sleep(0.05)
            if jobs.job_state(job_id) == "paused":
                break
        assert downloads.job_state(dl_id) == "paused"
        assert jobs.job_state(job_id) == "paused", jobs.job_state(job_id)
        step = jobs.table.item(jobs.rows[job_id], 2).text()
        assert step.startswith("paused: download "), step
        assert jobs.widgets[job_id][0].format().endswith("(paused)")
        fake_hub.faults.rate_bps = None
        pause.click()  # now Resume
        await asyncio.wait_for(seen["completed"], 30)
        for _ in range(100):
            await asyncio.sleep(0.05)
            if jobs.job_state(job_id) is None:
                break
        assert jobs.job_state(job_id) is None, "a finished download's job stayed in the panel"
        assert downloads.job_state(dl_id) == "completed"

    run_desk(qloop, qapp, isolated_env, tmp_path / "models", body)


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


# ---- last round: the misfit's explanation in the window's words ------------------------------------------
def test_misfit_explanation_reads_in_the_windows_words(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path
) -> None:
    """A plan that cannot run gives no speed figure; its advice names the Library's settings, not a
    command-line flag, and its token counts are grouped."""
    from PySide6.QtWidgets import QLabel

    from app.ui.explain_view import ExplainDialog
    from tests.support.tinymodels import CHAT, write_tiny_gguf

    models = tmp_path / "models"
    write_tiny_gguf(models / "tiny.gguf", CHAT)

    async def body(desk: Any) -> None:
        over = await desk.runtime.explain("tiny", overrides={"ctx_size": 200_000_000, "kv_type": "f32"})
        dlg = ExplainDialog("tiny", over.public(), desk.window)
        dlg.show()
        texts = [lab.text() for lab in dlg.findChildren(QLabel)]
        speed = next(t for t in texts if "<b>Speed</b>" in t)
        assert "tok/s" not in speed and "does not fit" in speed, speed
        advice = [t for t in texts if t.startswith("To make it fit")]
        assert advice, texts
        joined = " ".join(advice)
        assert "--" not in joined, joined  # no command-line flags
        assert "200,000,000" in joined and "200000000" not in joined, joined
        dlg.close()

    run_desk(qloop, qapp, isolated_env, models, body)
