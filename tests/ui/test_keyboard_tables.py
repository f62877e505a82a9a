"""Tab reaches the actions inside the Downloads and Jobs tables, each named for a screen reader, and Space
works them (issue 32, last round: Pause, Resume and Cancel could be reached only with the arrow keys). The
keys go to the focused widget, as a person's would; no method of the pages is called to act."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
pytest.importorskip("PySide6")
pytest.importorskip("qasync")

from PySide6.QtCore import Qt

from tests.support.asyncwait import until
from tests.support.desks import run_desk
from tests.support.fakehub import FakeHub

REPO = "acme/Keys-GGUF"
MIB = 1 << 20


def test_tab_and_space_work_the_downloads_and_jobs_tables(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path, fake_hub: FakeHub
) -> None:
    from PySide6.QtTest import QTest
    from PySide6.QtWidgets import QApplication, QPushButton

    blob = bytes(range(256)) * (6 * MIB // 256)
    fake_hub.add_repo(REPO, {"k-Q4_0.gguf": blob}, tags=["gguf"])
    fake_hub.faults.delay_per_chunk = 0.05  # slow: it is still running while the keys are pressed

    async def tab_to(match: Callable[[Any], bool], what: str) -> Any:
        reached = []
        for _ in range(80):
            QTest.keyClick(QApplication.focusWidget(), Qt.Key.Key_Tab)
            await asyncio.sleep(0)
            w = QApplication.focusWidget()
            if isinstance(w, QPushButton):
                assert (w.accessibleName() or w.text()).strip(), f"a button with no name: {w!r}"
                reached.append(w.accessibleName() or w.text())
                if match(w):
                    return w
        raise AssertionError(f"Tab never reached {what}; buttons reached: {reached}")

    async def body(desk: Any) -> None:
        w = desk.window
        w.activateWindow()
        disc = w.show_page("Discover")
        await disc.open_model(REPO)
        await disc.download("Q4_0")
        await until(lambda: len(disc.panel.rows) == 1 and len(disc.panel.jobs_panel.rows) == 1, what="rows")
        (jid,) = disc.panel.rows
        label = f"{REPO}:Q4_0"
        disc.query.setFocus()
        pause = await tab_to(lambda b: b.accessibleName() == f"Pause {label}", "Pause")
        QTest.keyClick(pause, Qt.Key.Key_Space)
        await until(lambda: disc.job_state(jid) == "paused", what="paused by Space")
        assert pause.accessibleName() == f"Resume {label}" and pause.hasFocus()
        QTest.keyClick(pause, Qt.Key.Key_Space)
        await until(lambda: disc.job_state(jid) in ("queued", "running"), what="resumed by Space")
        cancel = await tab_to(lambda b: b.accessibleName() == f"Cancel {label}", "Cancel in Downloads")
        assert disc.panel.table.isAncestorOf(cancel)
        job_cancel = await tab_to(
            lambda b: b.text() == "Cancel" and disc.panel.jobs_panel.table.isAncestorOf(b), "Cancel in Jobs"
        )
        assert REPO in job_cancel.accessibleName(), job_cancel.accessibleName()
        QTest.keyClick(cancel, Qt.Key.Key_Space)
        await until(lambda: disc.job_state(jid) == "cancelled", what="cancelled by Space")
        fake_hub.faults.delay_per_chunk = 0

    run_desk(qloop, qapp, isolated_env, tmp_path / "models", body)
