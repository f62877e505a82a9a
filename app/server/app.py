"""The aiohttp application and the `serve` loop (bind, announce, shut down cleanly)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import signal
from collections.abc import AsyncIterator

from aiohttp import web

from app.core.errors import PortInUseError, SettingsError
from app.core.paths import Paths
from app.core.secrets import KeyStore
from app.core.settings import Settings
from app.runtime import Runtime
from app.server import (
    auth,
    limits,
    metrics,
    middleware,
    openapi,
    routes_admin,
    routes_anthropic,
    routes_audio,
    routes_downloads,
    routes_engines,
    routes_hub,
    routes_images,
    routes_library,
    routes_ollama,
    routes_ollama_manage,
    routes_openai,
    routes_remotes,
    routes_rerank,
    routes_responses,
)
from app.server.gateway import Gateway
from app.server.keys import GATEWAY, RUNTIME

log = logging.getLogger("switchyard")


def allowed_hosts(settings: Settings) -> set[str]:
    hosts = set(middleware.LOOPBACK_NAMES)
    if settings.host not in ("0.0.0.0", "::"):
        hosts |= auth.host_names(settings.host)
    if not auth.is_loopback(settings.host):  # reachable from the network: by any of our addresses
        hosts |= auth.own_addresses()
    for name in settings.allowed_hosts:
        hosts |= auth.host_names(name)
    return hosts


def make_app(runtime: Runtime) -> web.Application:
    origins = auth.cors_origins(runtime.settings)
    stats = metrics.Metrics()
    app = web.Application(
        middlewares=[
            metrics.middleware(stats, runtime.bus),  # outermost: counts every answer, refusals too
            middleware.access_log,
            middleware.errors,
            middleware.host_guard(allowed_hosts(runtime.settings), origins=origins),
            auth.cors_preflight,
            auth.require_key,
            limits.middleware(runtime.settings),  # innermost: it needs the client the auth middleware names
        ],
        client_max_size=runtime.settings.max_body_mib * limits.MIB,
    )
    app[RUNTIME] = runtime
    app[GATEWAY] = Gateway(runtime)
    app[metrics.METRICS] = stats
    auth.setup(app, runtime.settings, runtime.paths)

    async def runtime_ctx(_: web.Application) -> AsyncIterator[None]:
        async with runtime:
            yield

    app.cleanup_ctx.append(runtime_ctx)
    app.cleanup_ctx.append(metrics.download_counter(stats, runtime.bus))
    app.add_routes(routes_admin.routes)
    app.add_routes(routes_downloads.routes)
    app.add_routes(routes_engines.routes)
    routes_hub.setup(app)
    app.add_routes(routes_library.routes)
    app.add_routes(routes_remotes.routes)
    app.add_routes(routes_openai.routes)
    app.add_routes(routes_audio.routes)
    app.add_routes(routes_images.routes)
    app.add_routes(routes_rerank.routes)
    app.add_routes(routes_responses.routes)
    app.add_routes(routes_anthropic.routes)
    app.add_routes(routes_ollama.routes)
    app.add_routes(routes_ollama_manage.routes)
    app.add_routes(metrics.routes)
    app.add_routes(openapi.routes)
    return app


def who_holds(port: int) -> str:
    """'pid N (name)' of the process listening on `port`, where the OS lets us see it."""
    try:
        import psutil

        for c in psutil.net_connections(kind="inet"):
            if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN and c.pid:
                return f"pid {c.pid} ({psutil.Process(c.pid).name()})"
    except Exception:  # psutil may be denied access; the message stays useful without it
        pass
    return "another process"


async def serve(settings: Settings, paths: Paths, *, stop: asyncio.Event | None = None) -> None:
    if not auth.is_loopback(settings.host) and not KeyStore.at(paths):
        raise SettingsError(
            f"refusing to bind {settings.host}: a non-loopback address exposes the API to the network, and "
            "no API key exists yet; create one with `switchyard keys create NAME` (give it to each client), "
            "or bind 127.0.0.1 (the default)"
        )
    runtime = Runtime(settings=settings, paths=paths)
    app = make_app(runtime)
    runner = web.AppRunner(
        app,
        handler_cancellation=True,
        access_log=None,
        shutdown_timeout=5,
        # aiohttp arms this from the moment a connection opens, so it also ends request heads that never
        # complete (slow-loris), besides idle keep-alive connections
        keepalive_timeout=settings.idle_timeout_s,
    )
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port, reuse_address=False)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        if exc.errno == errno.EADDRINUSE:
            raise PortInUseError(
                f"port {settings.port} on {settings.host} is already in use by {who_holds(settings.port)}; "
                f"stop it or start with --port N"
            ) from exc
        raise
    port = int(runner.addresses[0][1]) if runner.addresses else settings.port
    shown = f"[{settings.host}]" if ":" in settings.host else settings.host
    url = f"http://{shown}:{port}"
    # a wildcard bind is not an address to connect to (nor an allowed Host): the CLI dials loopback
    dial = {"0.0.0.0": f"http://127.0.0.1:{port}", "::": f"http://[::1]:{port}"}.get(settings.host, url)
    paths.server_file.write_text(
        json.dumps({"url": dial, "host": settings.host, "port": port, "pid": os.getpid()})
    )
    entries = runtime.catalog.entries()
    n_ok = len(runtime.catalog.ids())
    n_broken = sum(1 for e in entries if e.problem is not None)
    log.info(
        "models: %d servable, %d broken, %d in formats no lane runs yet, from %s and the HF cache %s",
        n_ok,
        n_broken,
        len(entries) - n_ok - n_broken,
        ", ".join(map(str, runtime.catalog.dirs)),
        runtime.catalog.hf_cache,
    )
    for e in entries:
        if e.problem is not None:
            log.warning("broken model %s (%s): %s", e.id, e.path, e.problem)
    print(f"listening on {url}", flush=True)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        log.info("shutting down: stopping lanes")
        with contextlib.suppress(FileNotFoundError):
            if json.loads(paths.server_file.read_text()).get("pid") == os.getpid():
                paths.server_file.unlink()
        await runner.cleanup()
