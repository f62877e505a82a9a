"""A gated repository's fit, and the downloads and jobs panels (issue 32, items 9 and 12).

Each drives the real widgets offscreen, with a real Desktop over a models folder of tiny generated models
(tests/support/desks.py); one file a Desktop or two, as each Qt file runs in a process of its own."""

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
from tests.support.tinymodels import CHAT, write_tiny_gguf


# ---- 12. a gated repository's page does not say "no file fits" when nothing could be read ----------------
def test_gated_repository_says_fit_unknown_not_none_fits(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path, fake_hub: Any
) -> None:
    from app.ui.pages.discover import NONE_FITS

    repo = "acme/Gated-Tiny-GGUF"
    gguf = write_tiny_gguf(tmp_path / "src" / "gated-Q8_0.gguf", CHAT).read_bytes()
    fake_hub.add_repo(
        repo, {"gated-Q8_0.gguf": gguf, "gated-Q4_K_M.gguf": gguf}, tags=["gguf"], gated="manual"
    )

    async def body(desk: Any) -> None:
        disc = desk.window.show_page("Discover")
        disc.query.setText("Gated")
        disc.search()
        await desk.tasks.settle()
        disc.results.selectRow(0)
        await desk.tasks.settle()
        assert disc.detail is not None and disc.detail["id"] == repo
        verdicts = {disc.quants.item(r, 2).text() for r in range(disc.quants.rowCount())}
        assert verdicts == {"unknown"}, verdicts
        meta = disc.model_meta.text()
        assert NONE_FITS not in meta, meta
        assert "unknown" in meta and "gated" in meta, meta

    run_desk(qloop, qapp, isolated_env, tmp_path / "models", body)


# ---- 9. the newest download on top, jobs in the downloads' units, no jump when a job comes and goes -------
def test_downloads_newest_on_top_and_the_jobs_panel_does_not_move_the_page(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path, fake_hub: Any
) -> None:
    gguf = write_tiny_gguf(tmp_path / "src" / "one-Q8_0.gguf", CHAT).read_bytes()
    for repo in ("acme/First-GGUF", "acme/Second-GGUF"):
        fake_hub.add_repo(repo, {"m-Q8_0.gguf": gguf}, tags=["gguf"])

    async def body(desk: Any) -> None:
        disc = desk.window.show_page("Discover")
        for repo in ("acme/First-GGUF", "acme/Second-GGUF"):
            done = asyncio.get_running_loop().create_future()

            def seen(kind: str, _d: Any, fut: asyncio.Future[None] = done) -> None:
                if kind == "download.completed" and not fut.done():
                    fut.set_result(None)

            desk.bridge.received.connect(seen)
            disc.query.setText(repo.split("/")[1])
            disc.search()
            await desk.tasks.settle()
            disc.results.selectRow(0)
            await desk.tasks.settle()
            disc.download("Q8_0")
            await asyncio.wait_for(done, 30)
            desk.bridge.received.disconnect(seen)
        await desk.tasks.settle()
        top = disc.downloads.item(0, 0).text()
        assert "Second" in top, [disc.downloads.item(r, 0).text() for r in range(disc.downloads.rowCount())]
        # a job appears and goes: the page above keeps its place and height
        jobs = disc.panel.jobs_panel
        await asyncio.sleep(0.05)
        before = disc.views.geometry()
        job = {
            "id": "job-1",
            "kind": "download",
            "title": "acme/Third-GGUF",
            "state": "running",
            "steps": [{"name": "download", "done": 4608, "total": 3 * 1024 * 1024}],
            "progress": 0.001,
        }
        jobs.update_job(job)
        await asyncio.sleep(0.05)
        assert jobs.table.item(0, 2).text() == "download 4.5 KiB of 3.0 MiB"
        assert disc.views.geometry() == before
        jobs.on_event("job.completed", {**job, "state": "completed"})
        await asyncio.sleep(0.05)
        assert disc.views.geometry() == before

    run_desk(qloop, qapp, isolated_env, tmp_path / "models", body)
