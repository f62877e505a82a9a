"""A download that meets a full disk, as a person meets it in the window (issue 32, the disk-full message):
a real small filesystem (tmpfs) holds the Hugging Face cache; Download is pressed on the Discover page. Too
little room before the start, and a disk that fills midway, each say so once in sizes, name the disk, and
name the window's way on (Resume), never a setting key or a command; Resume then finishes the file."""

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

from tests.support.asyncwait import until  # noqa: E402
from tests.support.desks import run_desk  # noqa: E402
from tests.support.fakehub import FakeHub  # noqa: E402
from tests.support.smalldisk import fill, small_disk  # noqa: E402

REPO = "acme/Roomy-GGUF"
MIB = 1 << 20


def _plain(said: str) -> None:
    """What a window user can act on: sizes said once, no setting keys, commands or Python names."""
    assert not re.search(r"\d{4,} bytes|\bbytes\b", said), said
    assert not re.search(r"(\d[\d.]* [KMG]iB) \(\1\)", said), f"a size said twice: {said}"
    for word in ("hf_cache_dir", "switchyard", "pull", "settings.json", "Error"):
        assert word not in said, f"{word!r} in {said!r}"
    assert "Free some space" in said and "press Resume" in said, said


def _press(disc: Any, quant: str) -> None:
    row = next(r for r in range(disc.quants.rowCount()) if disc.quants.item(r, 0).text() == quant)
    disc.quants.cellWidget(row, 5).click()


def _job(disc: Any, quant: str) -> str | None:
    return next((j for j, job in disc._jobs.items() if job.get("selector") == quant), None)


def test_a_full_disk_before_and_during_a_download(
    qloop: asyncio.AbstractEventLoop,
    qapp: Any,
    tmp_path: Path,
    isolated_env: Path,
    fake_hub: FakeHub,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    blob = bytes(range(256)) * (6 * MIB // 256)
    fake_hub.add_repo(REPO, {"r-Q4_0.gguf": blob, "r-Q8_0.gguf": blob + blob}, tags=["gguf"])
    with small_disk(tmp_path / "small", "40m") as small:
        monkeypatch.setenv("HF_HUB_CACHE", str(small / "hub"))

        async def body(desk: Any) -> None:
            disc = desk.window.show_page("Discover")
            await disc.open_model(REPO)
            # before: 12 MiB and the 32 MiB margin cannot fit in 40 MiB
            _press(disc, "Q8_0")
            await until(lambda: "failed" in disc.panel.problem.text(), what="refused for room", limit=30)
            said = disc.panel.problem.text()
            _plain(said)
            assert str(small / "hub") in said and "12.0 MiB" in said, said
            # during: started with room, then someone else fills the disk
            fake_hub.faults.delay_per_chunk = 0.01
            _press(disc, "Q4_0")
            await until(lambda: _job(disc, "Q4_0") is not None, what="queued")
            jid = str(_job(disc, "Q4_0"))
            await until(lambda: disc._jobs[jid].get("bytes_done", 0) > 256 * 1024, what="progress")
            filler = fill(small, leave=64 * 1024)
            await until(lambda: disc.job_state(jid) == "failed", what="failed midway", limit=60)
            said = disc.panel.problem.text()
            _plain(said)
            assert "is full" in said and "MiB of 6.0 MiB" in said, said
            resume = disc._widgets[jid][1]
            assert resume.text() == "Resume" and resume.isEnabled()
            filler.unlink()
            fake_hub.faults.delay_per_chunk = 0
            resume.click()
            await until(lambda: disc.job_state(jid) == "completed", what="completed", limit=60)
            assert "Q4_0" not in disc.panel.problem.text()  # the resumed file's failure is gone

        run_desk(qloop, qapp, isolated_env, tmp_path / "models", body)
