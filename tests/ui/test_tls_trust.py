"""The desktop's server with TLS, offscreen: the Server page shows the https URL and the certificate's
fingerprint (copyable), the server answers a client that trusts that certificate, and server.json names it."""

from __future__ import annotations

import asyncio
import json
import os
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
pytest.importorskip("PySide6")
pytest.importorskip("qasync")

from PySide6.QtGui import QGuiApplication

from app.core.paths import Paths
from app.core.settings import Settings
from app.server import tls
from tests.support.asyncwait import until


def test_server_page_shows_the_fingerprint_of_the_tls_server(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path
) -> None:
    from app.ui.desktop import Desktop

    # a pair named in settings turns TLS on in the window too (no --tls flag there)
    pair = tls.self_signed(Paths(home=tmp_path / "elsewhere"), host="127.0.0.1")
    paths = Paths(home=isolated_env)
    settings = Settings.flat(
        port=0,
        models_dirs=(tmp_path / "models",),
        monitor_interval_s=0,
        tls_cert=str(pair.cert),
        tls_key=str(pair.key),
    )

    async def scenario() -> None:
        async with Desktop(paths, settings, qapp=qapp) as desk:
            assert desk.server.running, desk.server.error
            page = desk.window.show_page("Server")
            assert page.address.text().startswith("https://127.0.0.1:")
            assert page.fingerprint.text() == pair.fingerprint and page.copy_fp.isEnabled()
            page.copy_fp.click()
            assert QGuiApplication.clipboard().text() == pair.fingerprint
            assert pair.fingerprint in page.snippet.toPlainText()
            doc = json.loads(paths.server_file.read_text())
            assert doc["scheme"] == "https" and doc["fingerprint"] == pair.fingerprint
            ctx = ssl.create_default_context(cafile=str(pair.cert))
            async with aiohttp.ClientSession() as s, s.get(f"{desk.server.url}/health", ssl=ctx) as r:
                assert r.status == 200
            await desk.server.stop()
            await until(lambda: not page.copy_fp.isEnabled(), limit=10, what="the page to see the stop")
            assert pair.fingerprint not in page.fingerprint.text()

    qloop.run_until_complete(scenario())
