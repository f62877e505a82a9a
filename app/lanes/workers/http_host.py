"""The small HTTP server our own engine workers run (piper, whisper.cpp): loopback, a free port, one
JSON line `{"switchyard": "listening", "port": P, "ready": true}` on stdout when it serves (the model is
loaded before that, so the lane needs no health polling), exit 0 on SIGTERM, and exit
on its own when the server that started it is gone. Errors use the gateway's OpenAI error shape."""

from __future__ import annotations

import asyncio
import json
import sys

from aiohttp import web

from app.core.platform.signals import on_stop_signals
from app.lanes.parentwatch import tie_to_server


def error(
    status: int, message: str, *, param: str | None = None, code: str = "invalid_request"
) -> web.Response:
    kind = "invalid_request_error" if status < 500 else "engine_error"
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return web.json_response(body, status=status)


def log(message: str) -> None:
    print(f"switchyard-worker: {message}", file=sys.stderr, flush=True)


def guard_parent(ppid: int) -> bool:
    """Die with the server (pid `ppid`) whatever the engine is doing; False when it is already gone.
    Called before the engine is imported: its load is where a server's death used to be missed."""
    return tie_to_server(ppid)


async def _serve(app: web.Application) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    on_stop_signals(loop, stop.set)  # Windows' loop has no add_signal_handler: core/platform/signals.py
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = int(runner.addresses[0][1])
    print(json.dumps({"switchyard": "listening", "port": port, "ready": True}), flush=True)
    await stop.wait()
    await runner.cleanup()


async def _health(_request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})  # the model is loaded before the server listens


def serve(app: web.Application) -> int:
    app.router.add_get("/health", _health)
    asyncio.run(_serve(app))
    sys.stdout.flush()
    return 0
