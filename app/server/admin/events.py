"""The server-sent event endpoints (/api/events, /api/downloads/events, /api/engines/events,
/api/jobs/{id}/events): one loop.

Each stream subscribes to the bus first, then sends a `snapshot` event (so nothing published in between
is missed), then every event its filter keeps, as `event: KIND` / `data: {"ts": ..., **data}`. A comment
line every KEEP_ALIVE_S keeps proxies and clients from closing an idle stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, Coroutine
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
    until: Callable[[dict[str, Any] | Event], bool] | None = None,
) -> web.StreamResponse:
    """Answer `request` with the snapshot, then the bus's events that `keep` accepts, until the client
    goes away (its reset or the server's cancel ends the loop quietly), or until `until` is true of the
    snapshot or of an event sent (a job's end: /api/jobs/{id}/events)."""
    resp = web.StreamResponse(headers=_HEADERS)
    await resp.prepare(request)
    async with bus.subscribe() as q:
        first = await snapshot()
        await resp.write(frame("snapshot", first))
        if until is not None and until(first):
            return resp
        with contextlib.suppress(ConnectionResetError, asyncio.CancelledError):
            while True:
                try:
                    ev = await asyncio.wait_for(q.get(), keep_alive_s)
                except TimeoutError:
                    await resp.write(b": keep-alive\n\n")
                    continue
                if keep(ev):
                    await resp.write(frame(ev.kind, {"ts": ev.ts, **ev.data}))
                    if until is not None and until(ev):
                        break
    return resp


async def task_stream(
    request: web.Request,
    work: Callable[[Callable[[str, dict[str, Any]], None]], Coroutine[Any, Any, dict[str, Any]]],
    *,
    done: str = "done",
) -> web.StreamResponse:
    """Answer `request` with the events a long piece of work emits as it goes (`work(emit)`; emit never
    blocks), then its result as a `done` event, or an `error` event with the message if it raised. A
    client that leaves cancels the work."""
    resp = web.StreamResponse(headers=_HEADERS)
    await resp.prepare(request)
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    task = asyncio.create_task(work(lambda kind, data: queue.put_nowait(frame(kind, data))))
    try:
        while not task.done() or not queue.empty():
            getter = asyncio.ensure_future(queue.get())
            await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
            if getter.done():
                await resp.write(getter.result())
            else:
                getter.cancel()
        try:
            result = task.result()
        except Exception as e:  # the work's own error, in its words; the stream ends cleanly
            await resp.write(frame("error", {"message": getattr(e, "message", None) or str(e)}))
        else:
            await resp.write(frame(done, result))
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    finally:
        if not task.done():
            task.cancel()  # the client left
            with contextlib.suppress(BaseException):
                await task
    return resp
