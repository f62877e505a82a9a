"""The Server and Library pages as a new user meets them (issue 20): "Use this port" leaves a stopped
server stopped and the button true; Copy says it copied; the editor snippet's context is one request's;
Show in folder without a file manager shows the path; buttons that cannot apply are off."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
pytest.importorskip("PySide6")
qasync = pytest.importorskip("qasync")

from PySide6.QtGui import QGuiApplication  # noqa: E402

from app.core.paths import Paths  # noqa: E402
from app.core.settings import Settings  # noqa: E402
from tests.conftest import link_models  # noqa: E402
from tests.ui.test_new_user_window import shot, shown  # noqa: E402


def test_server_port_copy_snippet_and_library_buttons(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, model_store: Path, isolated_env: Path
) -> None:
    from app.ui.desktop import Desktop

    models = link_models(tmp_path / "models", model_store / "tiny.gguf")
    paths = Paths(home=isolated_env)
    settings = Settings.flat(port=0, models_dirs=(models,), monitor_interval_s=0)

    async def scenario() -> None:
        async with Desktop(paths, settings, qapp=qapp) as desk:
            srv = desk.window.show_page("Server")
            assert desk.server.running
            # defect 12: Copy base URL says it copied
            url = srv.copy_url()
            assert url and QGuiApplication.clipboard().text() == url and srv.copy.text() == "Copied"
            # defect 11: the user stops the server, then picks a port: it stays stopped, and says so
            await srv.start_stop()
            assert not desk.server.running and srv.toggle.text() == "Start server"
            await srv.apply_port(0)
            assert not desk.server.running, "Use this port started a server the user had stopped"
            assert srv.toggle.text() == "Start server" and "Stopped" in srv.state.text()
            assert any(t == "Port saved" for t, _ in desk.notices)
            await srv.start_stop()
            assert desk.server.running and srv.toggle.text() == "Stop server"
            # defect 9: the editor snippet's context is what one request gets, as Chat and Discover say
            mid = desk.runtime.catalog.ids()[0]
            found = desk.runtime.explain_brief(mid)
            assert found is not None
            chosen = found.public()["fit"]["chosen"]
            per = chosen["ctx_size"] // chosen["parallel"]
            assert chosen["parallel"] > 1 and f'"max_tokens": {per}}}' in srv.snippet.toPlainText()
            # defect 12: Library buttons that need a model are off until one is picked
            lib = desk.window.show_page("Library")
            await desk.tasks.settle()
            assert not lib.buttons["Load"].isEnabled() and lib.buttons["Import…"].isEnabled()
            assert lib.select(mid)
            assert lib.buttons["Load"].isEnabled() and lib.buttons["Show in folder"].isEnabled()
            # Show in folder with no file manager (offscreen): the path is shown and copied
            folder = lib.show_in_folder()
            assert folder is not None and str(folder) in lib.status.text()
            assert QGuiApplication.clipboard().text() == str(folder)
            # defect 12: an error line does not shift the page, and does not outlive a visit to the page
            top = lib.table.y()
            lib.report("Select a model in the table first.")
            await asyncio.sleep(0.02)
            assert lib.status.isVisible() and lib.table.y() == top
            desk.window.show_page("Chat")
            assert desk.window.show_page("Library") is lib and not lib.status.text()
            # defect 5: the engines' health cells are painted whole at 1024 px (first clause; all in the tip)
            desk.window.resize(1024, 640)
            lanes = desk.window.show_page("Lanes")
            await asyncio.sleep(0.05)
            assert lanes.bank.text().startswith("Session bank: 0 saved conversations, 0 B of 2.00 GiB")
            engines = lanes.engines.table
            health = [engines.item(r, 5).text() for r in range(engines.rowCount())]
            # a cell is the hint's first clause (issue 32: cells of pip and docker lines were paragraphs);
            # the whole hint, commands and all, is the cell's tooltip
            tips = [engines.item(r, 5).toolTip() for r in range(engines.rowCount())]
            assert any(len(t) > 60 for t in tips), tips
            assert all(t.startswith(h.rstrip("…")) for h, t in zip(health, tips, strict=True)), (health, tips)
            assert [shown(engines, r, 5) for r in range(engines.rowCount())] == health
            assert not any("switchyard engine" in h for h in health), health  # defect 8: the button
            for name in ("Library", "Chat", "Server", "Lanes", "Hardware", "Settings"):
                desk.window.show_page(name)
                await asyncio.sleep(0.02)
                shot(desk.window, f"{name.lower()}-1024.png")

    qloop.run_until_complete(asyncio.wait_for(scenario(), 60))
