"""The local API inside the window's process: the same aiohttp app `switchyard serve` runs.

The runner is set up once (that enters the Runtime: lanes, downloads, monitor) and lives until Quit;
Start/Stop only open and close the listening socket, so stopping the server never stops a lane or a
download and the window keeps working. Each Start reads the settings of that moment: the address, TLS,
and the request guards (keys, Host names, CORS origins), rebuilt by `auth.arm`.
"""

from __future__ import annotations

from aiohttp import web

from app.core.errors import PortInUseError, SettingsError
from app.core.events import EventKind
from app.core.paths import Paths
from app.core.secrets import KeyStore
from app.lanes.peers.registry import PeerRegistry
from app.runtime import Runtime
from app.server import auth, tls
from app.server.admin import peers
from app.server.app import forget_server, make_app, record_server, server_urls
from app.server.listen import open_site


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
            keepalive_timeout=runtime.settings.limits.idle_timeout_s,
        )
        self._site: web.TCPSite | None = None
        self.url: str | None = None
        self.host: str | None = None  # the address the socket is bound to while running
        self.error: str | None = None
        self.port: int | None = None  # chosen on the Server page; None: the settings' port
        self.tls: tls.TlsMaterial | None = None  # the certificate served while running with TLS
        # whether the server should listen: set by start() (even one that failed on a busy port), cleared
        # by the user's stop; a port change restarts only a wanted server
        self.wanted = False

    @property
    def running(self) -> bool:
        return self._site is not None

    async def setup(self) -> None:
        await self.runner.setup()  # enters the Runtime (cleanup_ctx)

    @property
    def peers(self) -> PeerRegistry:
        """The paired machines, owned by this server's app (set up with it; pairing needs a TLS start)."""
        return self.app[peers.PEERS]

    async def start(self) -> str:
        """Listen on the configured address; a busy port is an error, never shown as started."""
        self.wanted = True
        if self._site is not None:
            return self.url or ""
        s = self.runtime.settings
        if not auth.is_loopback(s.server.host) and not KeyStore.at(self.paths):
            self.error = (
                f"refusing to listen on {s.server.host}: that exposes the API to the network and no API key "
                "exists; create one on the Server page first"
            )
            self._publish()
            raise SettingsError(self.error)
        material = self._tls()
        auth.arm(self.app, s)  # the guards follow the settings as they are now, not as at the first start
        want = s.server.port if self.port is None else self.port
        ctx = tls.server_context(material) if material is not None else None
        try:
            bound = await open_site(
                self.runner,
                host=s.server.host,
                port=want,
                ssl_context=ctx,
                change="change the port on the Server page",
            )
        except OSError as exc:
            self.error = (
                exc.message
                if isinstance(exc, PortInUseError)
                else (f"could not listen on {s.server.host}:{want}: {exc.strerror or exc}")
            )
            self._publish()
            raise PortInUseError(self.error) from exc
        site, port = bound.site, bound.port
        if material is not None and ctx is not None:  # peers pair and call over this TLS site, as with serve
            peers.arm(self.app, cert_pem=material.cert.read_text(), ctx=ctx, host=s.server.host, port=port)
        _, dial = server_urls(s.server.host, port, scheme="https" if material else "http")
        self._site, self.url, self.error, self.tls, self.host = site, dial, None, material, s.server.host
        record_server(self.paths, dial=dial, host=s.server.host, port=port, material=material)
        self._publish()
        return self.url

    def _tls(self) -> tls.TlsMaterial | None:
        """A network bind serves HTTPS (the window has no --tls flag to forget) unless allow_plain_lan is
        set; settings that name a certificate turn it on everywhere."""
        s = self.runtime.settings
        lan = not auth.is_loopback(s.server.host) and not s.security.allow_plain_lan
        try:
            return tls.material_for(s, self.paths, use_tls=tls.wanted(s, asked=lan))
        except SettingsError as exc:
            self.error = exc.message
            self._publish()
            raise

    async def stop(self, *, keep_wanted: bool = False) -> None:
        """Close the socket; `keep_wanted`: only to listen elsewhere (a port change), not the user's stop."""
        self.wanted = self.wanted and keep_wanted
        site, self._site = self._site, None
        if site is None:
            return
        await site.stop()
        peers.disarm(self.app)
        forget_server(self.paths)
        self.url, self.tls, self.host = None, None, None
        self._publish()

    async def close(self) -> None:
        """Quit: close the socket, then the Runtime (every lane stopped, downloads saved)."""
        await self.stop()
        await self.runner.cleanup()

    def _publish(self) -> None:
        fp = self.tls.fingerprint if self.tls is not None else None
        self.runtime.bus.publish(
            EventKind.SERVER_STATE, running=self.running, url=self.url, error=self.error, fingerprint=fp
        )
