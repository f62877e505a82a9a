"""The prompt counts' connections to a local engine (gateway/core.py `counts_http`): kept alive from one
call to the next (a connect and close per call cost several times the call's own CPU), and closed once
idle, so nothing stays open to the engine after the requests that used them."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from urllib.parse import urlsplit

import psutil

from app.core.paths import Paths
from app.core.settings import Settings
from app.runtime import Runtime
from app.server.gateway.core import COUNT_IDLE_S, Gateway
from tests.conftest import link_models

CHAT = {"messages": [{"role": "user", "content": "Say one letter."}]}


def _to(port: int, *, besides: frozenset[int] = frozenset()) -> list[int]:
    """The local ports of this process's established connections to `port`, but those in `besides`."""
    return [
        c.laddr.port
        for c in psutil.Process().net_connections("tcp")
        if c.raddr
        and c.raddr.port == port
        and c.status == psutil.CONN_ESTABLISHED
        and c.laddr.port not in besides
    ]


async def test_counts_reuse_one_connection_and_close_it_when_idle(tmp_path: Path, model_store: Path) -> None:
    models = link_models(tmp_path / "m", model_store / "tiny.gguf")
    paths = Paths.from_env()
    paths.ensure()
    async with Runtime(
        settings=Settings.flat(models_dirs=(models,), monitor_interval_s=0), paths=paths
    ) as rt:
        gw = Gateway(rt)
        try:
            route = await gw.resolve("tiny", "chat")
            async with gw.hold(route) as lane:
                port = urlsplit(lane.base_url).port
                assert port is not None
                lanes_own = frozenset(_to(port))  # the lane's own, whatever it keeps open
                first = await gw.count_prompt(lane, CHAT)  # a render and a tokenize, one connection
                kept = _to(port, besides=lanes_own)  # read before the loop runs again: no idle timer fired
                assert first > 0
                assert len(kept) == 1, f"the count's connection was not kept for the next: {kept}"
                assert await gw.count_prompt(lane, CHAT) == first
                assert _to(port, besides=lanes_own) == kept, "the second count opened a connection of its own"
                deadline = time.monotonic() + 4 * COUNT_IDLE_S + 1.0
                while _to(port, besides=lanes_own) and time.monotonic() < deadline:  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
                assert _to(port, besides=lanes_own) == [], "an idle count connection stayed open"
        finally:
            await gw.close()
