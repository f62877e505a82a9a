"""The Machines page: pairing from the window with a real `serve --tls` machine (its code typed into the
page), the peer's own hardware and models listed, a check, and unpairing; and the page saying what pairing
needs while the window's server serves plain HTTP. Screenshots at 1024x640 and 1600x1000 in both themes."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from app.core.settings import Settings
from tests.conftest import ServerProcess, link_models
from tests.support.machines_window import invite, machines_page, tls_machine, tls_window

__all__ = ["tls_machine", "tls_window"]  # the shared fixtures of the Machines page's tests


@pytest.mark.timeout(300)
def test_pair_list_check_and_unpair_from_the_window(
    qloop: asyncio.AbstractEventLoop,
    qapp: Any,
    tmp_path: Path,
    isolated_env: Path,
    model_store: Path,
    tls_machine: Callable[..., ServerProcess],
    tls_window: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("qasync")
    from PySide6.QtWidgets import QMessageBox

    bee = tls_machine("bee", link_models(tmp_path / "bee-models", model_store / "tiny.gguf"))
    shots = Path(os.environ.get("SWITCHYARD_SCREENSHOT_DIR") or tmp_path)
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.Yes)
    seen: dict[str, Any] = {}

    async def scenario() -> None:
        async with machines_page(qapp, isolated_env, tls_window) as (desk, page):
            desk.window.resize(1024, 640)
            assert page.invite_btn.isEnabled() and "127.0.0.1" in page.here.text()
            page.invite_btn.click()  # the window's own code, for another machine to type
            seen["own code"] = page.code.text()
            code = await asyncio.to_thread(invite, bee.home)
            page.address.setText(bee.url.split("//", 1)[1])
            page.pair_code.setText(code["code"])
            page.name.setText("bee")
            page.pair_btn.click()
            await desk.tasks.settle()
            assert page.status.text() == "", page.status.text()
            rows = [
                [page.table.item(r, c).text() for c in range(page.table.columnCount())]
                for r in range(page.table.rowCount())
            ]
            seen["rows"] = rows
            page.table.selectRow(0)
            page.check_btn.click()
            await desk.tasks.settle()
            seen["checked"] = page.table.item(0, 2).text()
            for width, height in ((1024, 640), (1600, 1000)):
                desk.window.resize(width, height)
                for theme in ("light", "dark"):
                    desk.theme.set(theme)
                    await asyncio.sleep(0.2)
                    desk.window.grab().save(str(shots / f"machines-paired-{width}-{theme}.png"))
            desk.theme.set("light")
            page.table.selectRow(0)
            page.remove_btn.click()
            await desk.tasks.settle()
            seen["after"] = page.table.rowCount()
            await desk.server.stop()
            page.refresh()
            seen["stopped"] = (page.invite_btn.isEnabled(), page.here.text())

    qloop.run_until_complete(asyncio.wait_for(scenario(), 240))
    assert "once" in seen["own code"]
    (row,) = seen["rows"]
    assert row[0] == "bee" and row[2].startswith("ready") and "bee/tiny" in row[4], row
    assert row[1].startswith("127.0.0.1:") and "/" not in row[1], row
    assert row[3] != "-", "the peer's own memory was not shown"
    assert seen["checked"].startswith("ready")
    assert seen["after"] == 0
    enabled, text = seen["stopped"]
    assert not enabled and "Allow access from the local network" in text
