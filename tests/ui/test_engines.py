"""The engines table of the Lanes page: versions and where each engine comes from; Rollback swaps at once;
an Update to a version pip cannot find fails with pip's words on the page, shows pip's progress on the way,
and leaves the installed version as it was. The table follows `engine.*` events; nothing polls."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
pytest.importorskip("PySide6")
qasync = pytest.importorskip("qasync")

from app.core.paths import Paths  # noqa: E402
from app.core.settings import Settings  # noqa: E402
from app.lanes.install import engine as engine_install  # noqa: E402
from app.lanes.install.store import EngineState, EngineStore, InstalledVersion  # noqa: E402
from tests.support.asyncwait import until  # noqa: E402


def bare(store: EngineStore, version: str) -> InstalledVersion:
    folder = store.lane_dir("piper") / version
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    return InstalledVersion(version, version, time.time())


def test_engine_table_rollback_and_a_failed_update(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path
) -> None:
    from app.ui.desktop import Desktop

    paths = Paths(home=isolated_env)
    store = EngineStore(paths.engines)
    store.write("piper", EngineState(current=bare(store, "1.8.0"), previous=bare(store, "1.7.0")))
    settings = Settings.flat(
        port=0, models_dirs=(tmp_path / "models",), monitor_interval_s=0, plan_memory=False
    )

    async def scenario() -> None:
        async with Desktop(paths, settings, qapp=qapp) as desk:
            page = desk.window.show_page("Lanes")
            panel = page.engines
            names = [panel.table.item(i, 0).text() for i in range(panel.table.rowCount())]
            assert {"llama.cpp", "piper", "whisper.cpp", "vllm"} <= set(names)
            row = names.index("piper")

            def cells() -> list[str]:
                return [panel.table.item(row, j).text() for j in range(panel.table.columnCount())]

            assert cells()[1:5] == ["1.8.0", "own environment", "1.8.0", "1.7.0"]
            # the build this machine calls for, with the reason in its tooltip (no GPU here: cpu)
            llama = names.index("llama.cpp")
            build = panel.table.item(llama, 6)
            assert build.text() == "cpu" and "CPU" in build.toolTip(), build.toolTip()
            panel.table.selectRow(row)
            assert panel.rollback_btn.isEnabled() and panel.update_btn.isEnabled()
            assert not panel.install_btn.isEnabled()  # installed already: Update, not Install
            panel.rollback_btn.click()
            await until(lambda: cells()[1] == "1.7.0", what="the rollback in the table")
            assert cells()[4] == "1.8.0"

            # pinned to a version no index has: Update fails in pip, says so, and changes nothing
            engine_install.pin("piper", "0.0.0.dev0", store=store, bus=desk.runtime.bus)
            await until(lambda: cells()[3] == "0.0.0.dev0 (you)", what="the pin in the table")
            before = store.state_file("piper").read_bytes()
            panel.update_btn.click()
            await until(lambda: "installing" in cells()[1], what="the running install")
            await until(lambda: page.status.isVisible(), what="the failure", limit=90)
            assert "0.0.0.dev0" in page.status.text() and "still installed" in page.status.text()
            assert panel.progress.text()  # pip's lines went by
            assert store.state_file("piper").read_bytes() == before
            await until(lambda: cells()[1] == "1.7.0", what="the table back to the installed version")
            desk.quit()
            await desk.run()

    qloop.run_until_complete(asyncio.wait_for(scenario(), 150))


def test_lanes_page_lists_remote_endpoints_from_their_events(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path
) -> None:
    from app.ui.desktop import Desktop

    paths = Paths(home=isolated_env)
    settings = Settings.flat(
        port=0, models_dirs=(tmp_path / "models",), monitor_interval_s=0, plan_memory=False
    )

    async def scenario() -> None:
        async with Desktop(paths, settings, qapp=qapp) as desk:
            page = desk.window.show_page("Lanes")
            # the window names its own form (issue 20: no command lines in the window's words)
            empty = page.remotes.text()
            assert "none" in empty and "press Add remote" in empty and "switchyard" not in empty, empty
            # nothing listens on the discard port: the check fails fast and the page says so
            await desk.runtime.remotes.add("far", "http://127.0.0.1:9/v1", key=None)
            text = await until(lambda: "far" in page.remotes.text() and page.remotes.text(), what="remote")
            assert "<b>far</b>" in text and "unreachable" in text and "127.0.0.1:9" in text
            await desk.runtime.remotes.remove("far")
            await until(lambda: "none" in page.remotes.text(), what="remote removed")

    qloop.run_until_complete(scenario())
