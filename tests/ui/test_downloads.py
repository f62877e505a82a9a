"""The downloads panel on the Discover page, fed by `download.*` events: progress, pause/resume, cancel,
and a failure stated plainly (with a notification)."""

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

REPO = "acme/blobs-GGUF"
MIB = 1 << 20


def test_pause_resume_cancel_and_failure(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, fake_hub: FakeHub, isolated_env: Path
) -> None:
    from app.ui.desktop import Desktop

    blob = bytes(range(256)) * (8 * MIB // 256)
    fake_hub.add_repo(
        REPO,
        {"m-Q4_0.gguf": blob, "m-Q8_0.gguf": blob[: 4 * MIB], "m-Q6_K.gguf": blob[: 6 * MIB]},
        tags=["gguf"],
    )
    fake_hub.faults.delay_per_chunk = 0.01  # about 6 MiB/s: slow enough to pause mid-file
    paths = Paths(home=isolated_env)
    settings = Settings.flat(
        port=0, models_dirs=(tmp_path / "models",), monitor_interval_s=0, download_parts=1
    )

    async def scenario() -> None:
        async with Desktop(paths, settings, qapp=qapp) as desk:
            disc = desk.window.show_page("Discover")
            await disc.open_model(REPO)
            job = await disc.download("Q4_0")
            jid = job.id
            await until(lambda: disc._jobs.get(jid, {}).get("bytes_done", 0) > 0, what="progress")
            bar, pause, cancel = disc._widgets[jid]
            assert pause.text() == "Pause" and 0 <= bar.value() < 1000
            assert disc.downloads.item(0, 2).text().endswith("/s")  # a rate while running
            pause.click()
            await until(lambda: disc.job_state(jid) == "paused", what="paused")
            assert pause.text() == "Resume" and disc.downloads.item(0, 2).text() == "-"
            pause.click()
            await until(lambda: disc.job_state(jid) == "completed", what="completed", limit=60)
            assert bar.value() == 1000 and not cancel.isEnabled()
            # cancel: the row says so and the partial bytes go
            job2 = await disc.download("Q8_0")
            await until(lambda: disc._jobs.get(job2.id, {}).get("bytes_done", 0) > 0, what="progress 2")
            disc._widgets[job2.id][2].click()
            await until(lambda: disc.job_state(job2.id) == "cancelled", what="cancelled")
            # a corrupted file: the job fails, the row states the error, a notification says so
            fake_hub.faults.delay_per_chunk = 0.0
            fake_hub.faults.corrupt = {"m-Q6_K.gguf"}
            job3 = await disc.download("Q6_K")
            await until(lambda: disc.job_state(job3.id) == "failed", what="failed", limit=60)
            row = disc._rows[job3.id]
            assert disc.downloads.item(row, 4).text() == "failed"  # the words below, the column narrow
            assert disc.downloads.item(row, 4).toolTip().startswith("failed: ")
            assert len(disc.panel.problem.text()) > len("failed: ") + 10
            assert any(t == "Download failed" for t, _ in desk.notices)
            assert disc._widgets[job3.id][1].text() == "Resume"  # a failed job can be retried
            # a bad repository id is refused on the page, plainly
            await disc.open_model("not a repo")
            assert "not a Hugging Face repository id" in disc.status.text()
            desk.quit()
            await desk.run()

    qloop.run_until_complete(asyncio.wait_for(scenario(), 100))
