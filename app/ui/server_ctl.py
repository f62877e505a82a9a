"""The local API inside the window's process: the same aiohttp app `switchyard serve` runs.

The runner is set up once (that enters the Runtime: lanes, downloads, monitor) and lives until Quit;
Start/Stop only open and close the listening socket, so stopping the server never stops a lane or a
download and the window keeps working.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os

from aiohttp import web

from app.core.errors import PortInUseError, SettingsError
from app.core.paths import Paths
from app.core.secrets import KeyStore
from app.runtime import Runtime
from app.server import auth
from app.server.app import make_app, who_holds


class ServerControl:
    def __init__(self, runtime: Runtime, paths: Paths) -> None:
        self.runtime = runtime
        self.paths = paths
        self.app = make_app(runtime)
        self.runner = web.AppRunner(
            self.app,
            handler_cancellation=True,
            access_log=None,
            shutdown_timeout=5,
            keepalive_timeout=runtime.settings.idle_timeout_s,
        )
        self._site: web.TCPSite | None = None
        self.url: str | None = None
        self.error: str | None = None
        self.port: int | None = None  # chosen on the Server page; None: the settings' port

    @property
    def running(self) -> bool:
        return self._site is not None

    async def setup(self) -> None:
        await self.runner.setup()  # enters the Runtime (cleanup_ctx)

    async def start(self) -> str:
        """Listen on the configured address; a busy port is an error, never shown as started."""
        if self._site is not None:
            return self.url or ""
        s = self.runtime.settings
        if not auth.is_loopback(s.host) and not KeyStore.at(self.paths):
            self.error = (
                f"refusing to listen on {s.host}: that exposes the API to the network and no API key "
                "exists; create one on the Server page first"
            )
            self._publish()
            raise SettingsError(self.error)
        want = s.port if self.port is None else self.port
        site = web.TCPSite(self.runner, s.host, want, reuse_address=False)
        try:
            await site.start()
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                self.error = (
                    f"port {want} on {s.host} is already in use by {who_holds(want)}; stop it, or "
                    "change the port on the Server page"
                )
            else:
                self.error = f"could not listen on {s.host}:{want}: {exc.strerror or exc}"
            self._publish()
            raise PortInUseError(self.error) from exc
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        port = int(sockets[0].getsockname()[1]) if sockets else want
        shown = f"[{s.host}]" if ":" in s.host else s.host
        dial = {"0.0.0.0": "127.0.0.1", "::": "[::1]"}.get(s.host, shown)
        self._site, self.url, self.error = site, f"http://{dial}:{port}", None
        self.paths.server_file.write_text(
            json.dumps({"url": self.url, "host": s.host, "port": port, "pid": os.getpid()})
        )
        self._publish()
        return self.url

    async def stop(self) -> None:
        site, self._site = self._site, None
        if site is None:
            return
        await site.stop()
        with contextlib.suppress(FileNotFoundError, ValueError):
            if json.loads(self.paths.server_file.read_text()).get("pid") == os.getpid():
                self.paths.server_file.unlink()
        self.url = None
        self._publish()

    async def close(self) -> None:
        """Quit: close the socket, then the Runtime (every lane stopped, downloads saved)."""
        await self.stop()
        await self.runner.cleanup()

    def _publish(self) -> None:
        self.runtime.bus.publish("server.state", running=self.running, url=self.url, error=self.error)
