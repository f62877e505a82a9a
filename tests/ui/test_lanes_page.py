"""The Lanes page on a real llama.cpp lane (issue 20's wording, issue 14's footprints): a lane serving a
request shows as generating, not "ready", without any event telling the page; the memory column shows the
measured and the predicted footprint; a remote endpoint is added with the page's own form, not a command."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import aiohttp
import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
pytest.importorskip("PySide6")
qasync = pytest.importorskip("qasync")

from app.core.paths import Paths  # noqa: E402
from app.core.settings import Settings  # noqa: E402
from tests.conftest import link_models  # noqa: E402
from tests.support.asyncwait import until  # noqa: E402

STATE, MEMORY = 1, 5


def test_a_serving_lane_shows_as_generating_and_remotes_are_added_in_the_window(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, model_store: Path, isolated_env: Path
) -> None:
    from app.ui.desktop import Desktop

    models = link_models(tmp_path / "models", model_store / "tiny.gguf")
    # no hardware samples: nothing but the page itself can notice a request starting
    settings = Settings.flat(port=0, models_dirs=(models,), monitor_interval_s=0)

    async def scenario() -> None:
        async with Desktop(Paths(home=isolated_env), settings, qapp=qapp) as desk:
            page: Any = desk.window.show_page("Lanes")
            assert "switchyard" not in page.remotes.text() and "Add remote" in page.remotes.text()
            sup = desk.runtime.supervisor
            await sup.load("tiny")
            cell = lambda col: page.table.item(0, col).text() if page.table.rowCount() else ""  # noqa: E731
            await until(lambda: cell(STATE) == "ready", what="the lane shown ready")
            await until(lambda: "tiny" in sup.settled, what="the settle footprint")
            page.refresh()
            assert "measured" in cell(MEMORY) and "predicted" in cell(MEMORY), cell(MEMORY)

            async with sup.use("tiny") as lane, aiohttp.ClientSession() as http:
                body = {"messages": [{"role": "user", "content": "Count."}], "max_tokens": 16}
                async with http.post(f"http://127.0.0.1:{lane.port}/v1/chat/completions", json=body) as r:
                    assert r.status == 200 and (await r.json())["choices"]
                await until(lambda: cell(STATE) == "generating (1)", limit=5, what="the lane shown busy")
            await until(lambda: cell(STATE) == "ready", limit=5, what="the lane shown ready again")

            page.remote_name.setText("elsewhere")
            page.remote_url.setText("http://127.0.0.1:9/v1")  # nobody answers there: it shows as such
            page.remote_add.click()
            await until(lambda: "elsewhere" in page.remotes.text(), limit=30, what="the remote listed")
            assert page.remote_name.text() == "" and not page.status.isVisible()
            page.remote_add.click()  # an empty form says what to enter
            assert "Enter a name and the address" in page.status.text()

    qloop.run_until_complete(scenario())
