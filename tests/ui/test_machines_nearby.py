"""The Machines page's *Find machines nearby*: a real `serve --tls` announcing itself on mDNS and a spoofed
announcement of its address with another fingerprint; picking the spoof and typing the real code is
refused (the announced fingerprint is pinned), picking the real one pairs, and the list then says so."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before pytest-qt makes its QApplication

from tests.conftest import REPO, ServerProcess

FAKE = ":".join(["5A"] * 32)


def _code(home: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "app", "peers", "invite", "--json"],
        cwd=REPO,
        env=dict(os.environ, SWITCHYARD_HOME=str(home)),
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr
    return str(json.loads(done.stdout)["code"])


@pytest.mark.timeout(300)
def test_find_nearby_pick_and_pair_a_spoof_refused(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path
) -> None:
    pytest.importorskip("qasync")
    from PySide6.QtCore import Qt

    from app.core.paths import Paths
    from app.core.settings import Settings
    from app.lanes.peers import identity, nearby
    from app.server import tls
    from app.ui.desktop import Desktop

    (tmp_path / "empty").mkdir()
    home = tmp_path / "bee"
    home.mkdir()
    (home / "settings.json").write_text(json.dumps({"peers_announce": "on", "offline": True}))
    bee = ServerProcess(home, tmp_path / "empty", "--tls")
    material = tls.self_signed(Paths(home=tmp_path / "certs"), host="127.0.0.1")
    settings = Settings.flat(
        port=0,
        models_dirs=(tmp_path / "empty",),
        tls_cert=str(material.cert),
        tls_key=str(material.key),
        monitor_interval_s=0,
    )
    seen: dict[str, Any] = {}

    async def scenario() -> None:
        await asyncio.to_thread(bee.wait_ready, 60)
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
            async with Desktop(Paths(home=isolated_env), settings, qapp=qapp) as desk:
                page = desk.window.show_page("Machines")
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
                page.pair_code.setText(await asyncio.to_thread(_code, home))
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

    try:
        qloop.run_until_complete(asyncio.wait_for(scenario(), 240))
    finally:
        bee.stop()
    assert len(seen["listed"]) == 2  # the real one and the impostor, both at the same address
    assert "not paired" in seen["listed"][FAKE]
    assert seen["address"]
    status, rows = seen["spoof"]
    assert "presented the certificate" in status and rows == 0, status
    status, rows = seen["real"]
    assert status == "" and rows == 1, status
    (after,) = seen["after"]
    assert "paired as" in after
