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

from app.core import tracing
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
    routes_audit,
    routes_bank,
    routes_downloads,
    routes_engines,
    routes_evals,
    routes_hub,
    routes_images,
    routes_jobs,
    routes_library,
    routes_ollama,
    routes_ollama_manage,
    routes_openai,
    routes_realtime,
    routes_remotes,
    routes_rerank,
    routes_responses,
    routes_settings,
    tls,
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
            middleware.traced,  # one server span per request (docs/tracing.md); nothing while tracing is off
            middleware.access_log,
            middleware.errors,
            middleware.host_guard(allowed_hosts(runtime.settings), origins=origins),
            auth.cors_preflight,
            auth.require_key,
            limits.middleware(runtime.settings),  # innermost: it needs the client the auth middleware names
        ],
        client_max_size=runtime.settings.max_body_mib * limits.MIB,
        handler_args=limits.HANDLER_ARGS,
    )
    app[RUNTIME] = runtime
    app[GATEWAY] = Gateway(runtime)
    app[metrics.METRICS] = stats
    auth.setup(app, runtime.settings, runtime.paths)

    async def runtime_ctx(_: web.Application) -> AsyncIterator[None]:
        async with runtime:
            yield

    async def tracing_ctx(_: web.Application) -> AsyncIterator[None]:
        async with tracing.exporting(runtime.settings.tracing_otlp_endpoint):
            yield

    app.cleanup_ctx.append(tracing_ctx)
    app.cleanup_ctx.append(runtime_ctx)
    app.cleanup_ctx.append(metrics.download_counter(stats, runtime.bus))
    app.add_routes(routes_admin.routes)
    app.add_routes(routes_settings.routes)
    app.add_routes(routes_downloads.routes)
    app.add_routes(routes_engines.routes)
    routes_hub.setup(app)
    app.add_routes(routes_library.routes)
    app.add_routes(routes_remotes.routes)
    app.add_routes(routes_bank.routes)
    app.add_routes(routes_evals.routes)
    app.add_routes(routes_audit.routes)
    routes_jobs.setup(app)  # jobs, update checks, webhooks: started after the Runtime, stopped before it
    app.add_routes(routes_openai.routes)
    app.add_routes(routes_audio.routes)
    routes_realtime.setup(app)
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


def stop_signals() -> tuple[signal.Signals, ...]:
    """The signals that end the server cleanly: SIGHUP too (a closed terminal, or a service manager's
    reload), which would otherwise end the process without stopping its lanes."""
    names = ("SIGTERM", "SIGINT", "SIGHUP")
    return tuple(getattr(signal, n) for n in names if hasattr(signal, n))


def server_urls(host: str, port: int, *, scheme: str) -> tuple[str, str]:
    """(the bound address as a URL, the URL to dial): a wildcard bind is not an address to connect to
    (nor an allowed Host), so clients dial loopback."""
    shown = f"[{host}]" if ":" in host else host
    url = f"{scheme}://{shown}:{port}"
    return url, {"0.0.0.0": f"{scheme}://127.0.0.1:{port}", "::": f"{scheme}://[::1]:{port}"}.get(host, url)


def record_server(paths: Paths, *, dial: str, host: str, port: int, material: tls.TlsMaterial | None) -> None:
    """Write server.json: how the CLI finds this server, and the one certificate it is to trust."""
    doc: dict[str, object] = {"url": dial, "host": host, "port": port, "pid": os.getpid()}
    doc["scheme"] = "https" if material is not None else "http"
    if material is not None:
        doc |= {"fingerprint": material.fingerprint, "cert": str(material.cert)}
    paths.server_file.write_text(json.dumps(doc))


def forget_server(paths: Paths) -> None:
    """Remove server.json if this process wrote it (another server may have replaced it since)."""
    with contextlib.suppress(FileNotFoundError, ValueError):
        if json.loads(paths.server_file.read_text()).get("pid") == os.getpid():
            paths.server_file.unlink()


async def serve(
    settings: Settings, paths: Paths, *, stop: asyncio.Event | None = None, use_tls: bool = False
) -> None:
    """Bind, announce, and run until `stop` or SIGTERM/SIGINT/SIGHUP; then stop every lane and remove
    server.json. `use_tls` (`serve --tls`) serves HTTPS; a non-loopback bind refuses plain HTTP unless
    `allow_plain_lan` is set."""
    if not auth.is_loopback(settings.host) and not KeyStore.at(paths):
        raise SettingsError(
            f"refusing to bind {settings.host}: a non-loopback address exposes the API to the network, and "
            "no API key exists yet; create one with `switchyard keys create NAME` (give it to each client), "
            "or bind 127.0.0.1 (the default)"
        )
    material = tls.material_for(settings, paths, use_tls=tls.wanted(settings, asked=use_tls))
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in stop_signals():  # before the Runtime starts: a signal during start-up still cleans up
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
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
    ssl_ctx = tls.server_context(material) if material is not None else None
    site = web.TCPSite(runner, settings.host, settings.port, reuse_address=False, ssl_context=ssl_ctx)
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
    url, dial = server_urls(settings.host, port, scheme="https" if material else "http")
    record_server(paths, dial=dial, host=settings.host, port=port, material=material)
    try:
        _log_catalog(runtime)
        if material is not None:
            log.info("TLS certificate %s, SHA-256 fingerprint %s", material.cert, material.fingerprint)
            print(f"TLS certificate {material.cert}", flush=True)
            print(f"TLS fingerprint (SHA-256) {material.fingerprint}", flush=True)
        print(f"listening on {url}", flush=True)
        await stop.wait()
    finally:
        log.info("shutting down: stopping lanes")
        forget_server(paths)
        await runner.cleanup()


def _log_catalog(runtime: Runtime) -> None:
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
