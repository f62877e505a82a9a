"""The server's areas: where it binds (server), who may ask (security), how much one request may take
(limits) and what images a request may carry (images)."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from app.core.errors import SettingsError
from app.core.tracing import check_endpoint

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8686
EVENT_LOOPS = ("auto", "asyncio", "uvloop")
PEERS_ANNOUNCE = ("auto", "on", "off")


@dataclass(frozen=True)
class ServerSettings:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    event_loop: str = "auto"
    # desktop window (docs/desktop.md): start the local API when the window opens
    start_server_with_app: bool = True
    # traces (docs/tracing.md): the OTLP/HTTP collector spans go to (its base URL); None: no tracing at all
    tracing_otlp_endpoint: str | None = None
    # peers (docs/peers.md#finding-machines-nearby): announce this machine on mDNS while its TLS site is
    # armed for pairing; auto: only when it serves beyond loopback (nobody else could dial it otherwise)
    peers_announce: str = "auto"

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise SettingsError(f"port {self.port} is out of range; use 1-65535 (or 0 for any free port)")
        if self.event_loop not in EVENT_LOOPS:
            raise SettingsError("event_loop must be auto, asyncio or uvloop")
        if self.peers_announce not in PEERS_ANNOUNCE:
            raise SettingsError(
                "peers_announce must be auto (announce on mDNS when serving beyond loopback), on or off"
            )
        if self.tracing_otlp_endpoint is not None and (why := check_endpoint(self.tracing_otlp_endpoint)):
            raise SettingsError(f"tracing_otlp_endpoint {why}; or remove it to turn tracing off")


@dataclass(frozen=True)
class SecuritySettings:
    """docs/security.md: keys are always required on a non-loopback bind."""

    require_api_key: bool = False
    allowed_hosts: tuple[str, ...] = ()
    cors_origins: tuple[str, ...] = ()
    allow_remote_admin: bool = False
    # TLS (docs/security.md#tls): certificate and key files; None: a self-signed pair under the data dir
    tls_cert: str | None = None
    tls_key: str | None = None
    # a non-loopback bind needs TLS unless this is set
    allow_plain_lan: bool = False

    def __post_init__(self) -> None:
        for h in self.allowed_hosts:
            _check_host(h)
        for o in self.cors_origins:
            _check_origin(o)


def _check_host(h: str) -> None:
    bare = h[1:-1] if h.startswith("[") and h.endswith("]") else h
    try:
        ipaddress.ip_address(bare)
    except ValueError:
        if not re.fullmatch(r"[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?", h):
            raise SettingsError(
                f"allowed_hosts entry {h!r} must be a plain host name or address (no scheme, port or "
                "'*'), e.g. 'switchyard.lan' or '192.168.1.20'"
            ) from None


def _check_origin(o: str) -> None:
    parts = urlsplit(o)
    try:
        parts.port  # noqa: B018 - raises on a malformed port
    except ValueError:
        parts = urlsplit("")
    if (
        o.strip() in ("*", "null")
        or parts.scheme not in ("http", "https")
        or not parts.hostname
        or "*" in o
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or parts.username
    ):
        raise SettingsError(
            f"cors_origins entry {o!r} must be an exact origin, scheme://host[:port], e.g. "
            "'http://localhost:5173'; '*', 'null' and paths are not allowed"
        )


@dataclass(frozen=True)
class LimitSettings:
    """Request limits (docs/api.md#request-limits), live transcription's (docs/api.md#live-transcription)."""

    max_body_mib: int = 64
    max_concurrent_per_client: int = 0
    idle_timeout_s: float = 60.0
    body_timeout_s: float = 60.0
    check_prompt_length: bool = True
    # one live transcription session's length and its uncommitted audio
    realtime_max_session_s: float = 1800.0
    realtime_max_buffer_s: float = 60.0

    def __post_init__(self) -> None:
        if self.max_body_mib < 1:
            raise SettingsError("max_body_mib must be at least 1")
        if self.max_concurrent_per_client < 0:
            raise SettingsError("max_concurrent_per_client must be 0 (unlimited) or a number of requests")
        for name in ("idle_timeout_s", "body_timeout_s"):
            if getattr(self, name) <= 0:
                raise SettingsError(f"{name} must be a positive number of seconds")
        for name in ("realtime_max_session_s", "realtime_max_buffer_s"):
            if getattr(self, name) <= 0:
                raise SettingsError(f"{name} must be a number of seconds above 0")


@dataclass(frozen=True)
class ImageSettings:
    """Images in chat requests (docs/api.md#images): the decoded size cap, and http(s) image URLs fetched by
    the server (off: only data: URLs); private and loopback addresses only when allowed."""

    max_image_mib: int = 20
    # pixels an image may declare (every GIF/WebP frame and GIF's logical screen too), and all of one
    # request's images together: checked before anything is decoded (a small file can declare a huge picture)
    max_image_megapixels: int = 40
    max_request_megapixels: int = 80
    fetch_image_urls: bool = False
    fetch_image_private: bool = False
    fetch_image_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.max_image_mib < 1:
            raise SettingsError("max_image_mib must be at least 1")
        if not 1 <= self.max_image_megapixels <= self.max_request_megapixels:
            raise SettingsError(
                "max_image_megapixels must be at least 1 and at most max_request_megapixels (the budget of "
                "all of a request's images together)"
            )
        if self.fetch_image_timeout_s <= 0:
            raise SettingsError("fetch_image_timeout_s must be a positive number of seconds")
