"""The server-sent event endpoints (/api/events, /api/downloads/events, /api/engines/events): one loop.

Each stream subscribes to the bus first, then sends a `snapshot` event (so nothing published in between
is missed), then every event its filter keeps, as `event: KIND` / `data: {"ts": ..., **data}`. A comment
line every KEEP_ALIVE_S keeps proxies and clients from closing an idle stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from app.core.events import Event, EventBus

KEEP_ALIVE_S = 15.0
_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


def frame(kind: str, data: dict[str, Any]) -> bytes:
    """One event as SSE bytes."""
    return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()


def _everything(ev: Event) -> bool:
    return True


async def event_stream(
    request: web.Request,
    *,
    bus: EventBus,
    snapshot: Callable[[], Awaitable[dict[str, Any]]],
    keep: Callable[[Event], bool] = _everything,
    keep_alive_s: float = KEEP_ALIVE_S,
) -> web.StreamResponse:
    """Answer `request` with the snapshot, then the bus's events that `keep` accepts, until the client
    goes away (its reset or the server's cancel ends the loop quietly)."""
    resp = web.StreamResponse(headers=_HEADERS)
    await resp.prepare(request)
    async with bus.subscribe() as q:
        await resp.write(frame("snapshot", await snapshot()))
        with contextlib.suppress(ConnectionResetError, asyncio.CancelledError):
            while True:
                try:
                    ev = await asyncio.wait_for(q.get(), keep_alive_s)
                except TimeoutError:
                    await resp.write(b": keep-alive\n\n")
                    continue
                if keep(ev):
                    await resp.write(frame(ev.kind, {"ts": ev.ts, **ev.data}))
    return resp
