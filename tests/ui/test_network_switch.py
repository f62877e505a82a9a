"""The Server page's network switch applied by Stop and Start, with the address to use (issue 32, item 6).

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


async def _get(url: str, *, key: str | None = None, origin: str | None = None) -> tuple[int, dict[str, str]]:
    import aiohttp

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if origin:
        headers["Origin"] = origin
    async with aiohttp.ClientSession() as s, s.get(url, headers=headers, ssl=False) as r:
        await r.read()
        return r.status, dict(r.headers)


# ---- 6. the network switch applies without quitting; Stop and Start take the guards as they are now ------
def test_network_switch_applies_now_and_stop_start_rebuilds_the_guards(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path
) -> None:
    from app.ui.pages.server import lan_addresses

    async def body(desk: Any) -> None:
        srv = desk.window.show_page("Server")
        ctl = desk.server
        assert ctl.running and ctl.host == "127.0.0.1"
        key = srv.create_key("laptop")
        assert key
        srv.lan.click()  # as a person ticks it: the clicked signal runs set_lan
        await desk.tasks.settle()
        assert srv.lan.isChecked() and srv.lan.isEnabled()
        # applied now, no restart of Switchyard: listening on every address, over HTTPS, keys required
        assert ctl.running and ctl.host == "0.0.0.0" and ctl.tls is not None, (ctl.host, ctl.error)
        port = int(ctl.url.rsplit(":", 1)[1])
        note = srv.lan_note.text()
        lan = lan_addresses()
        if lan:  # a machine on a network: the note names the address, and that address answers
            assert note.startswith("Other computers use: ") and f"https://{lan[0]}:{port}/v1" in note, note
            status, _ = await _get(f"https://{lan[0]}:{port}/v1/models", key=key)
            assert status == 200, status
            status, _ = await _get(f"https://{lan[0]}:{port}/v1/models")
            assert status == 401, status
        else:
            assert "No network address" in note, note
        # Stop and Start (the button, twice) keep it, and say the address again
        srv.toggle.click()
        await desk.tasks.settle()
        assert not ctl.running and "once the server is started" in srv.lan_note.text()
        srv.toggle.click()
        await desk.tasks.settle()
        assert ctl.running and ctl.host == "0.0.0.0"
        # unticked: back to this computer only, plain HTTP, at once
        srv.lan.click()
        await desk.tasks.settle()
        assert ctl.host == "127.0.0.1" and ctl.tls is None and srv.lan_note.text() == ""
        # a guard setting changed while listening (the admin API, settings.json): the next Start applies it
        site = "http://localhost:3000"
        status, _ = await _get(f"{ctl.url}/v1/models", origin=site)
        assert status == 403  # not listed
        await desk.runtime.change_settings({"cors_origins": [site], "require_api_key": True})
        srv.toggle.click()
        await desk.tasks.settle()
        srv.toggle.click()
        await desk.tasks.settle()
        status, headers = await _get(f"{ctl.url}/v1/models", origin=site, key=key)
        assert status == 200 and headers.get("Access-Control-Allow-Origin") == site, (status, headers)
        status, _ = await _get(f"{ctl.url}/v1/models")
        assert status == 401, "require_api_key was not applied by Stop and Start"

    run_desk(qloop, qapp, isolated_env, tmp_path / "models", body)
