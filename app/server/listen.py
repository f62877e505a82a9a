"""Opening the listening socket, for `switchyard serve` and the window's Start alike.

Address reuse is left to the platform's default, which asyncio sets to SO_REUSEADDR on POSIX: without it
a server restarted at once cannot bind its port for as long as the last connections linger in TIME_WAIT
(about a minute), although no process holds the port. SO_REUSEADDR still refuses a port another process
listens on. On Windows the default stays off, where that option would let a second server take a port
in use.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from ssl import SSLContext

from aiohttp import web

from app.core.errors import PortInUseError


@dataclass(frozen=True)
class Bound:
    """A started site and the port it listens on (the OS's choice for port 0)."""

    site: web.TCPSite
    port: int


def who_holds(port: int) -> str | None:
    """'pid N (name)' of the process listening on `port`, where the OS lets us see it; None when no
    listener is visible (none exists, or it belongs to a user whose sockets we cannot read)."""
    try:
        import psutil

        for c in psutil.net_connections(kind="inet"):
            if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN and c.pid:
                return f"pid {c.pid} ({psutil.Process(c.pid).name()})"
    except Exception:  # psutil may be denied access; the message stays useful without it
        pass
    return None


def busy_message(host: str, port: int, *, change: str) -> str:
    """Why `host:port` could not be bound, naming the process only when one is seen listening; `change`
    says how to pick another port where the caller is (a flag, a page)."""
    holder = who_holds(port)
    if holder is not None:
        return f"port {port} on {host} is already in use by {holder}; stop it, or {change}"
    return (
        f"port {port} on {host} cannot be bound (address in use), and no process visible to this user "
        f"listens on it: another user's process may hold it; {change}"
    )


async def open_site(
    runner: web.AppRunner, *, host: str, port: int, ssl_context: SSLContext | None, change: str
) -> Bound:
    """Listen on `host:port` with `runner`'s app. A port in use raises PortInUseError (message: see
    busy_message); other bind errors are raised as they are."""
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context)  # reuse_address: platform default
    try:
        await site.start()
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise PortInUseError(busy_message(host, port, change=change)) from exc
        raise
    server = site._server
    sockets = getattr(server, "sockets", None) or []
    return Bound(site, int(sockets[0].getsockname()[1]) if sockets else port)
