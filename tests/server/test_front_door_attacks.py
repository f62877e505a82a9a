"""The front door attacked on purpose (issue 33): an absolute-form request target naming a foreign host is
refused like a foreign Host, and a state-changing admin route takes a JSON body only, an empty body of
another declared type included. A real app on a real socket."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from app.core.paths import Paths
from app.core.settings import Settings
from app.runtime import Runtime
from app.server.app import make_app


async def _raw(port: int, target: str) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    answer = await reader.read()
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


@pytest.fixture
async def client(tmp_path: Path) -> TestClient:  # type: ignore[misc]
    rt = Runtime(
        settings=Settings.flat(plan_memory=False, monitor_interval_s=0), paths=Paths(home=tmp_path / "h")
    )
    async with TestClient(TestServer(make_app(rt))) as c:
        yield c


async def test_an_absolute_form_target_for_another_host_is_refused(client: TestClient) -> None:
    port = client.port
    assert port is not None
    status, body = await _raw(port, "http://evil.example/v1/models")
    assert status == 403 and b"host_not_allowed" in body and b"evil.example" in body
    status, _ = await _raw(port, f"http://127.0.0.1:{port}/v1/models")  # absolute-form for this server
    assert status == 200
    status, _ = await _raw(port, "/v1/models")
    assert status == 200


@pytest.mark.parametrize("media", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"])
async def test_an_empty_simple_post_changes_nothing(client: TestClient, media: str) -> None:
    r = await client.post("/api/notify/test", data=b"", headers={"Content-Type": media})
    assert r.status == 415, await r.text()
    assert (await r.json())["error"]["code"] == "unsupported_media_type"
    r = await client.post("/api/notify/test", json={})
    assert r.status == 200
