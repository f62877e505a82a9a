"""The jobs panel says what the download says: paused, queued again, running, gone (issue 32, item 9).

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
