"""The small HTTP server our own engine workers run (piper, whisper.cpp): loopback, a free port, one
JSON line `{"switchyard": "listening", "port": P, "ready": true}` on stdout when it serves (the model is
loaded before that, so the lane needs no health polling), exit 0 on SIGTERM, and exit
on its own when the server that started it is gone. Errors use the gateway's OpenAI error shape."""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
from collections.abc import Callable
from types import ModuleType
from typing import TypeVar

from aiohttp import web

from app.core.platform.signals import on_stop_signals
from app.lanes.parentwatch import set_pdeathsig, tie_to_server
from app.lanes.workers.params import JsonParams, worker_command_line

P = TypeVar("P", bound=JsonParams)


def error(
    status: int, message: str, *, param: str | None = None, code: str = "invalid_request"
) -> web.Response:
    kind = "invalid_request_error" if status < 500 else "engine_error"
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return web.json_response(body, status=status)


def log(message: str) -> None:
    print(f"switchyard-worker: {message}", file=sys.stderr, flush=True)


def engine_module(name: str, *, dist: str) -> ModuleType | None:
    """The engine's module `name`, imported now; None, said on stderr, when its package `dist` is not
    installed in this environment."""
    try:
        return importlib.import_module(name)
    except ImportError:
        log(f"{dist} is not installed: pip install {dist}")
        return None


def started(prog: str, params: type[P], argv: list[str] | None) -> P | None:
    """A worker's first steps, before its engine is imported (its load is where a server's death used to be
    missed): die with the server whatever the engine does, then read the params it was started with (`prog`'s
    `--ppid N --params JSON`). None when the server is already gone."""
    set_pdeathsig()  # first of all: the kernel kills us with the server, even while the engine loads
    ppid, params_json = worker_command_line(prog, argv)
    if not tie_to_server(ppid):
        return None
    return params.from_json(params_json)


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


def run(
    prog: str,
    params: type[P],
    argv: list[str] | None,
    *,
    engine: tuple[str, str],
    load: Callable[[ModuleType, P], web.Application | None],
) -> int:
    """A worker's whole life: `started`, its engine's module imported (`engine`: module, distribution),
    `load` (the model loaded and the app made; None where it could not load, having said why), served.
    Exit 3: the server is gone; 5: the engine is not installed or the model did not load."""
    got = started(prog, params, argv)
    if got is None:
        return 3  # the server is gone
    module = engine_module(engine[0], dist=engine[1])
    if module is None:
        return 5
    app = load(module, got)
    return 5 if app is None else serve(app)
