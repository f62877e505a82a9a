"""The aiohttp application and the `serve` loop (bind, announce, shut down cleanly)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from collections.abc import AsyncIterator

from aiohttp import web

from app.core import tracing
from app.core.errors import SettingsError
from app.core.paths import Paths
from app.core.platform import signals
from app.core.secrets import KeyStore
from app.core.settings import Settings
from app.runtime import Runtime
from app.server import auth, dashboard, limits, listen, metrics, middleware, openapi, tls
from app.server.admin import audit as routes_audit
from app.server.admin import bank as routes_bank
from app.server.admin import downloads as routes_downloads
from app.server.admin import engines as routes_engines
from app.server.admin import evals as routes_evals
from app.server.admin import hub as routes_hub
from app.server.admin import jobs as routes_jobs
from app.server.admin import lanes as routes_admin
from app.server.admin import library as routes_library
from app.server.admin import mcp as routes_mcp
from app.server.admin import peers as routes_peers
from app.server.admin import remotes as routes_remotes
from app.server.admin import settings as routes_settings
from app.server.gateway import response_notes
from app.server.gateway.core import Gateway
from app.server.keys import GATEWAY, RUNTIME
from app.server.realtime import routes as routes_realtime
from app.server.surfaces.registry import SURFACES

log = logging.getLogger("switchyard")


def make_app(runtime: Runtime) -> web.Application:
    stats = metrics.Metrics()
    app = web.Application(
        # few layers, each doing several things in order: every middleware is a coroutine per request
        middlewares=[
            # outermost: /metrics counts every answer (refusals too) and request.done publishes it, one
            # server span (docs/tracing.md; nothing while tracing is off), the access log, error shapes
            middleware.front(stats, runtime.bus),
            auth.front_door,  # Host and Origin (DNS rebinding), CORS preflights, API keys: auth.arm's Guard
            limits.middleware(runtime.settings),  # innermost: it needs the client the auth middleware names
        ],
        client_max_size=runtime.settings.limits.max_body_mib * limits.MIB,
        handler_args=limits.HANDLER_ARGS,
    )
    app[RUNTIME] = runtime
    app[GATEWAY] = Gateway(runtime)
    app[metrics.METRICS] = stats
    auth.setup(app, runtime.settings, runtime.paths, surfaces=SURFACES)

    async def runtime_ctx(_: web.Application) -> AsyncIterator[None]:
        async with runtime:
            yield

    async def tracing_ctx(_: web.Application) -> AsyncIterator[None]:
        async with tracing.exporting(runtime.settings.server.tracing_otlp_endpoint):
            yield

    async def gateway_ctx(_: web.Application) -> AsyncIterator[None]:
        yield
        await app[GATEWAY].close()  # its own connections to engines (the counts' pool)

    app.cleanup_ctx.append(tracing_ctx)
    app.cleanup_ctx.append(runtime_ctx)
    app.cleanup_ctx.append(gateway_ctx)
    app.cleanup_ctx.append(metrics.download_counter(stats, runtime.bus))
    app.add_routes(routes_admin.routes)
    app.add_routes(routes_settings.routes)
    app.add_routes(routes_downloads.routes)
    app.add_routes(routes_engines.routes)
    routes_hub.setup(app)
    app.add_routes(routes_library.routes)
    app.add_routes(routes_remotes.routes)
    routes_peers.setup(app)  # paired peers (docs/peers.md): after the Runtime, whose remotes serve them
    app.add_routes(routes_bank.routes)
    app.add_routes(routes_evals.routes)
    app.add_routes(routes_audit.routes)
    app.add_routes(routes_mcp.routes)  # MCP tool servers (docs/mcp.md)
    routes_jobs.setup(app)  # jobs, update checks, webhooks: started after the Runtime, stopped before it
    for surface in SURFACES:  # the API front doors (app/server/surfaces/registry.py)
        surface.install(app)
    routes_realtime.setup(app)
    app.add_routes(metrics.routes)
    app.add_routes(openapi.routes)
    dashboard.setup(app)  # /, /ui and /docs (docs/dashboard.md)
    response_notes.install(app)  # headers a request earned on its way (gateway/response_notes.py)
    return app


def stop_signals() -> tuple[signal.Signals, ...]:
    """The signals that end the server cleanly (core/platform/signals.py): on POSIX SIGHUP too (a closed
    terminal, or a service manager's reload), which would otherwise end the process without stopping its
    lanes; on Windows Ctrl-C and Ctrl-Break."""
    return signals.stop_signals()


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
    host = settings.server.host
    if not auth.is_loopback(host) and not KeyStore.at(paths):
        raise SettingsError(
            f"refusing to bind {host}: a non-loopback address exposes the API to the network, and "
            "no API key exists yet; create one with `switchyard keys create NAME` (give it to each client), "
            "or bind 127.0.0.1 (the default)"
        )
    material = tls.material_for(settings, paths, use_tls=tls.wanted(settings, asked=use_tls))
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    # before the Runtime starts: a signal during start-up still cleans up
    signals.on_stop_signals(loop, stop.set)
    runtime = Runtime(settings=settings, paths=paths)
    app = make_app(runtime)
    runner = web.AppRunner(
        app,
        handler_cancellation=True,
        access_log=None,
        shutdown_timeout=5,
        # aiohttp arms this from the moment a connection opens, so it also ends request heads that never
        # complete (slow-loris), besides idle keep-alive connections
        keepalive_timeout=settings.limits.idle_timeout_s,
    )
    await runner.setup()
    ssl_ctx = tls.server_context(material) if material is not None else None
    try:
        bound = await listen.open_site(
            runner,
            host=settings.server.host,
            port=settings.server.port,
            ssl_context=ssl_ctx,
            change="start with --port N",
        )
    except OSError:
        await runner.cleanup()
        raise
    port = bound.port
    if material is not None and ssl_ctx is not None:  # peers pair and call over this TLS site
        routes_peers.arm(
            app, cert_pem=material.cert.read_text(), ctx=ssl_ctx, host=settings.server.host, port=port
        )
    url, dial = server_urls(settings.server.host, port, scheme="https" if material else "http")
    record_server(paths, dial=dial, host=settings.server.host, port=port, material=material)
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
    # an alias (Ollama's pull, copy, create) is another name for a model counted already, not a model
    models = [e for e in entries if e.source != "alias"]
    count = {status: sum(1 for e in models if e.status == status) for status in ("ok", "broken", "no_lane")}
    extra = ", ".join(
        f"{n} {what}"
        for n, what in (
            (sum(1 for e in models if e.status == "adapter"), "LoRA adapter(s)"),
            (len(entries) - len(models), "alias(es)"),
        )
        if n
    )
    log.info(
        "models: %d servable, %d broken, %d in formats no lane runs yet%s, from %s and the HF cache %s",
        count["ok"],
        count["broken"],
        count["no_lane"],
        f" ({extra})" if extra else "",
        ", ".join(map(str, runtime.catalog.dirs)),
        runtime.catalog.hf_cache,
    )
    starter = runtime.catalog.starter
    if starter is not None:
        log.info(
            "the starter model %s is ready to chat (from the package %s)", starter.model_id, starter.package
        )
    for e in entries:
        if e.problem is not None:
            log.warning("broken model %s (%s): %s", e.id, e.path, e.problem)
