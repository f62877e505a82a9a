"""The Machines page's *Find machines nearby*: a real `serve --tls` announcing itself on mDNS and a spoofed
announcement of its address with another fingerprint; picking the spoof and typing the real code is
refused (the announced fingerprint is pinned), picking the real one pairs, and the list then says so."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from app.core.settings import Settings
from tests.conftest import ServerProcess
from tests.support.machines_window import invite, machines_page, tls_machine, tls_window

__all__ = ["tls_machine", "tls_window"]  # the shared fixtures of the Machines page's tests
FAKE = ":".join(["5A"] * 32)


@pytest.mark.timeout(300)
def test_find_nearby_pick_and_pair_a_spoof_refused(
    qloop: asyncio.AbstractEventLoop,
    qapp: Any,
    tmp_path: Path,
    isolated_env: Path,
    tls_machine: Callable[..., ServerProcess],
    tls_window: Settings,
) -> None:
    pytest.importorskip("qasync")
    from PySide6.QtCore import Qt

    from app.lanes.peers import identity, nearby

    (tmp_path / "empty").mkdir()
    bee = tls_machine("bee", tmp_path / "empty", settings={"peers_announce": "on", "offline": True})
    home = bee.home
    seen: dict[str, Any] = {}

    async def scenario() -> None:
        address = bee.url.split("//", 1)[1]
        real_fp = identity.fingerprint((home / "tls" / "cert.pem").read_bytes())
        impostor = nearby.Announcer()
        impostor.announce(
            nearby.Announcement(
                machine="impostor",
                hosts=("127.0.0.1",),
                port=int(address.rsplit(":", 1)[1]),
                fingerprint=FAKE,
                everywhere=False,
            )
        )
        try:
            async with machines_page(qapp, isolated_env, tls_window) as (desk, page):
                await impostor.settle()
                page.find_btn.click()
                await desk.tasks.settle()
                items = {
                    page.nearby_list.item(i).data(Qt.ItemDataRole.UserRole)[
                        "fingerprint"
                    ]: page.nearby_list.item(i)
                    for i in range(page.nearby_list.count())
                }
                seen["listed"] = {fp: items[fp].text() for fp in (FAKE, real_fp) if fp in items}
                page.pick_nearby(items[FAKE])
                seen["address"] = page.address.text() == address
                page.pair_code.setText((await asyncio.to_thread(invite, home))["code"])
                page.pair_btn.click()
                await desk.tasks.settle()
                seen["spoof"] = (page.status.text(), page.table.rowCount())
                page.pick_nearby(items[real_fp])  # same address, the real fingerprint, the same unspent code
                page.pair_btn.click()
                await desk.tasks.settle()
                seen["real"] = (page.status.text(), page.table.rowCount())
                page.find_btn.click()
                await desk.tasks.settle()
                seen["after"] = [
                    page.nearby_list.item(i).text()
                    for i in range(page.nearby_list.count())
                    if page.nearby_list.item(i).data(Qt.ItemDataRole.UserRole)["fingerprint"] == real_fp
                ]
        finally:
            await impostor.aclose()

    qloop.run_until_complete(asyncio.wait_for(scenario(), 240))
    assert len(seen["listed"]) == 2  # the real one and the impostor, both at the same address
    assert "not paired" in seen["listed"][FAKE]
    assert seen["address"]
    status, rows = seen["spoof"]
    assert "presented the certificate" in status and rows == 0, status
    status, rows = seen["real"]
    assert status == "" and rows == 1, status
    (after,) = seen["after"]
    assert "paired as" in after
