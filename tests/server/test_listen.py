"""Issue 31, defect 2: a server stopped and started again at once binds its port, though the last
connections still linger in TIME_WAIT; a port in use names its holder only when there is one."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from app.core.errors import PortInUseError
from app.core.paths import Paths
from app.core.settings import Settings
from app.runtime import Runtime
from app.server.listen import busy_message, open_site
from app.ui.server_ctl import ServerControl


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def close_from_server(url: str) -> None:
    """A request the server answers and then closes, read to its end before the client closes: the
    server's side is closed first, so it is the one left in TIME_WAIT on the listening port."""
    host, port = url.rsplit("//", 1)[1].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as c:
        c.sendall(f"GET /health HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode())
        got = b""
        while chunk := c.recv(65536):  # b"": the server closed its side
            got += chunk
    assert got.startswith(b"HTTP/1.1 200"), got[:200]


def test_serve_restarts_at_once_on_the_same_port(start_server: Any, tmp_path: Path) -> None:
    port = free_port()
    first = start_server(tmp_path / "m", port=port)
    close_from_server(first.url)
    assert first.stop() == 0
    again = start_server(tmp_path / "m", port=port, wait=False)
    again.wait_ready(30)  # before: "port N ... already in use by another process", exit 2
    assert again.url.endswith(f":{port}")
    close_from_server(again.url)


async def test_window_stop_start_rebinds_the_same_port(tmp_path: Path) -> None:
    paths = Paths(home=tmp_path / "home")
    port = free_port()
    settings = Settings.flat(port=port, models_dirs=(tmp_path / "m",), monitor_interval_s=0)
    ctl = ServerControl(Runtime(settings=settings, paths=paths), paths)
    await ctl.setup()
    try:
        url = await ctl.start()
        await asyncio.to_thread(close_from_server, url)
        await ctl.stop()
        assert await ctl.start() == url  # before: PortInUseError
        await asyncio.to_thread(close_from_server, url)
    finally:
        await ctl.stop()
        await ctl.runner.cleanup()


async def test_a_real_holder_is_refused_and_named() -> None:
    app = web.Application()
    runner = web.AppRunner(app)
    await runner.setup()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        try:
            with pytest.raises(PortInUseError) as got:
                await open_site(runner, host="127.0.0.1", port=port, ssl_context=None, change="use --port N")
        finally:
            await runner.cleanup()
    assert "already in use by pid" in str(got.value) and "use --port N" in str(got.value)


def test_no_holder_is_not_called_another_process() -> None:
    port = free_port()  # nobody listens on it now
    text = busy_message("127.0.0.1", port, change="start with --port N")
    assert "another process" not in text and "no process visible to this user listens" in text
