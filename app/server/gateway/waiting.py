"""A stream that waits for its lane: the one start-and-wait of the pass-through (proxy.py) and the runner.

A streamed request whose model is not loaded yet gets its answer's head at once, then hears a loading line
each tick while its lane starts (SSE comments, Ollama's empty pieces), so the client neither times out nor
wonders; a start that fails is said in the stream, which has answered 200 already.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import aiohttp
from aiohttp import web

from app.core.errors import SwitchyardError
from app.server.gateway.core import Gateway, Route

_RESETS = (ConnectionResetError, aiohttp.ClientConnectionResetError)


async def wait_in_stream(
    request: web.Request,
    resp: web.StreamResponse,
    *,
    gw: Gateway,
    route: Route,
    waiting: Callable[[str, float], bytes],
    failed: Callable[[SwitchyardError], bytes],
) -> bool:
    """Send `resp`'s head, then start `route`'s lane, writing `waiting(phase, seconds)` each tick.

    True once the lane is ready (the answer goes on in `resp`); False when the answer is over: the client
    went away (the start goes on for the next request) or the start failed (`failed(error)` written)."""
    if request.version == aiohttp.HttpVersion11:
        resp.enable_chunked_encoding()  # what the byte relay and the runner's raw stream write under
    await resp.prepare(request)

    async def tick(phase: str, seconds: float) -> None:
        await resp.write(waiting(phase, seconds))

    try:
        await gw.wait_ready(route, tick=tick)
    except _RESETS:
        return False
    except SwitchyardError as exc:
        with contextlib.suppress(*_RESETS):
            await resp.write(failed(exc))
        return False
    return True
