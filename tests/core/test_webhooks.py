"""Webhooks attacked on purpose (issue 33): a hook never reaches this machine unless it opts in, a
notification never re-enters notification, one hanging receiver delays no other hook and is cut at its
deadline, hook URLs and secrets are masked where shown and logged, and an alert is used up only by a
message queued for a hook."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from app.core.errors import SettingsError
from app.core.netguard import own_addresses
from app.core.notify import Message, Notifier
from app.core.paths import Paths
from app.core.settings import Settings, settings_from_mapping
from app.runtime import Runtime
from app.server.app import make_app


class Receiver:
    def __init__(self, *, hang: bool = False, status: int = 200) -> None:
        self.got: list[bytes] = []
        self.hang, self.status = hang, status

    async def handle(self, request: web.Request) -> web.Response:
        self.got.append(await request.read())
        if self.hang:
            await asyncio.sleep(3600)
        return web.Response(status=self.status)


@pytest.fixture
async def receivers() -> AsyncIterator[tuple[str, dict[str, Receiver]]]:
    kinds = {"ok": Receiver(), "hang": Receiver(hang=True), "down": Receiver(status=500)}
    app = web.Application()
    for name, r in kinds.items():
        app.router.add_post(f"/{name}/T0123/SECRET-TOKEN", r.handle)
    async with TestServer(app) as server:
        yield f"http://127.0.0.1:{server.port}", kinds


async def _until(check: Any, within: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


def test_a_hook_at_this_machine_is_refused_unless_it_opts_in() -> None:
    others = sorted(str(a) for a in own_addresses() if not a.is_loopback)
    for host in ["127.0.0.1", "127.1", "[::1]", "[::ffff:127.0.0.1]", "0.0.0.0", *others[:1]]:
        with pytest.raises(SettingsError, match="allow_local"):
            settings_from_mapping({"notify": {"webhooks": [{"url": f"http://{host}:9/x"}]}})
        hook = {"url": f"http://{host}:9/x", "allow_local": True}
        settings_from_mapping({"notify": {"webhooks": [hook]}})


async def test_a_name_that_resolves_here_is_refused_when_it_connects(
    receivers: tuple[str, dict[str, Receiver]],
) -> None:
    base, got = receivers
    by_name = base.replace("127.0.0.1", "localhost") + "/ok/T0123/SECRET-TOKEN"
    config = {"webhooks": [{"url": by_name}]}
    async with Notifier(config=lambda: config) as notifier:
        [outcome] = await notifier.test()
    assert outcome["ok"] is False and outcome["refused"] is True and "this machine" in outcome["error"]
    assert got["ok"].got == []


async def test_a_notification_never_re_enters_notification(tmp_path: Path) -> None:
    rt = Runtime(
        settings=Settings.flat(plan_memory=False, monitor_interval_s=0), paths=Paths(home=tmp_path / "h")
    )
    async with TestClient(TestServer(make_app(rt))) as client:
        own = f"http://127.0.0.1:{client.port}/api/notify/test"
        hook = {"url": own, "kind": "json", "allow_local": True}  # opted in: it may reach this server
        r = await client.put("/api/settings", json={"notify": {"webhooks": [hook]}})
        assert r.status == 200, await r.text()
        r = await asyncio.wait_for(client.post("/api/notify/test", json={}), 20)
        answer = await r.json()
    assert r.status == 200 and [h["status"] for h in answer["hooks"]] == [409], answer


async def test_a_hanging_receiver_delays_no_other_hook(receivers: tuple[str, dict[str, Receiver]]) -> None:
    base, got = receivers
    config = {
        "webhooks": [
            {"url": f"{base}/hang/T0123/SECRET-TOKEN", "allow_local": True},
            {"url": f"{base}/ok/T0123/SECRET-TOKEN", "allow_local": True},
        ]
    }
    async with Notifier(config=lambda: config, deadline_s=1.0, backoff_s=0.01) as notifier:
        for n in range(3):
            assert notifier.notify(Message("lane.failed", f"m{n}", "the engine failed"))
        await _until(lambda: len(got["ok"].got) == 3, within=2.0)  # not behind the hanging one
        await _until(lambda: any("within 1 s" in str(o.get("error")) for o in notifier.sent), within=3.0)


async def test_hook_urls_and_secrets_are_masked(
    receivers: tuple[str, dict[str, Receiver]], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    base, _ = receivers
    down = {"url": f"{base}/down/T0123/SECRET-TOKEN", "kind": "slack", "allow_local": True}
    config = {"webhooks": [down]}
    caplog.set_level(logging.DEBUG)
    async with Notifier(config=lambda: config, retries=1, backoff_s=0.01) as notifier:
        notifier.notify(Message("lane.failed", "m", "the engine failed"))
        await _until(lambda: bool(notifier.sent))
    ours = "\n".join(r.getMessage() for r in caplog.records if not r.name.startswith("aiohttp"))
    assert "not delivered: HTTP 500" in ours and "SECRET-TOKEN" not in ours  # (the receiver's own log aside)
    signed = {"url": "https://hooks.example.com/services/T0/B0/SECRET-TOKEN", "secret": "hunter2"}
    rt = Runtime(
        settings=Settings.flat(plan_memory=False, monitor_interval_s=0), paths=Paths(home=tmp_path / "h")
    )
    async with TestClient(TestServer(make_app(rt))) as client:
        assert (await client.put("/api/settings", json={"notify": {"webhooks": [signed]}})).status == 200
        shown = await (await client.get("/api/settings")).json()
    text = str(shown)
    assert "SECRET-TOKEN" not in text and "hunter2" not in text
    assert shown["settings"]["notify"]["webhooks"][0]["url"] == "https://hooks.example.com/****"


async def test_an_alert_is_used_up_only_by_a_message_a_hook_took(
    receivers: tuple[str, dict[str, Receiver]],
) -> None:
    base, got = receivers
    config: dict[str, Any] = {"webhooks": []}
    async with Notifier(config=lambda: config, retries=0, backoff_s=0.01) as notifier:
        crash = Message("lane.failed", "tiny", "the engine of tiny failed")
        assert notifier.notify(crash) is False  # no hook yet: nothing used up
        config["webhooks"] = [{"url": f"{base}/down/T0123/SECRET-TOKEN", "allow_local": True}]
        assert notifier.notify(crash) is True
        await _until(lambda: bool(notifier.sent))
        config["webhooks"] = [{"url": f"{base}/ok/T0123/SECRET-TOKEN", "allow_local": True}]
        assert notifier.notify(crash) is True  # the failed delivery used nothing up either
        await _until(lambda: len(got["ok"].got) == 1)
        assert notifier.notify(crash) is False  # delivered: once an hour
