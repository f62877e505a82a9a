"""The jobs panel beside the downloads on the Discover page: a real pull from the local test hub is a job of
the desktop's in-process server; the panel lists it with its step and progress from the registry and the
`job.*` events, a panel built later reads the running job from the registry, and its Cancel stops the job
(the download is cancelled, the job ends cancelled and leaves the list)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
pytest.importorskip("PySide6")
qasync = pytest.importorskip("qasync")

from app.core.paths import Paths  # noqa: E402
from app.core.settings import Settings  # noqa: E402
from tests.support.asyncwait import until  # noqa: E402
from tests.support.fakehub import FakeHub  # noqa: E402

REPO = "acme/jobs-GGUF"
MIB = 1 << 20


def test_running_jobs_are_listed_with_progress_and_cancel(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, fake_hub: FakeHub, isolated_env: Path
) -> None:
    from app.server.admin.jobs import registry
    from app.ui.desktop import Desktop
    from app.ui.jobs_view import JobsPanel

    blob = bytes(range(256)) * (8 * MIB // 256)
    fake_hub.add_repo(REPO, {"m-Q4_0.gguf": blob}, tags=["gguf"])
    fake_hub.faults.delay_per_chunk = 0.01  # slow enough to see progress and cancel mid-file
    paths = Paths(home=isolated_env)
    settings = Settings.flat(
        port=0, models_dirs=(tmp_path / "models",), monitor_interval_s=0, download_parts=1
    )

    async def scenario() -> None:
        async with Desktop(paths, settings, qapp=qapp) as desk:
            disc = desk.window.show_page("Discover")
            panel = disc.panel.jobs_panel  # type: ignore[attr-defined]
            assert panel.empty.isVisible() and panel.table.rowCount() == 0
            jobs = registry(desk.server.app)
            assert jobs is not None
            dl = await desk.runtime.downloads.submit(REPO, quant="Q4_0")
            await until(lambda: jobs.by_source(dl.id) is not None, what="the pull became a job")
            job = jobs.by_source(dl.id)
            assert job is not None
            jid = job.id
            await until(lambda: (panel.jobs.get(jid, {}).get("progress") or 0) > 0, what="progress")
            row = panel.rows[jid]
            assert panel.table.item(row, 0).text() == f"pull {REPO}:Q4_0"
            assert panel.table.item(row, 1).text() == "pull"
            assert panel.table.item(row, 2).text().startswith("download ")
            bar, cancel = panel.widgets[jid]
            assert 0 < bar.value() < 1000 and bar.format().endswith("%")
            assert cancel.isEnabled() and not panel.empty.isVisible()
            assert "1 running" in panel.title.text()
            # a panel built while the job runs reads it from the registry, before any event
            later = JobsPanel(desk, report=lambda msg: None)
            assert jid in later.rows and later.table.item(later.rows[jid], 1).text() == "pull"
            # Cancel: the registry stops the job, the download is cancelled, the row goes
            cancel.click()
            await until(lambda: jid not in panel.rows, what="the cancelled job left the list")
            assert jobs.get(jid).state.value == "cancelled"
            assert dl.state.value == "cancelled"  # the download itself stopped
            assert panel.empty.isVisible() and panel.job_state(jid) is None
            later.deleteLater()
            desk.quit()
            await desk.run()

    qloop.run_until_complete(asyncio.wait_for(scenario(), 100))
