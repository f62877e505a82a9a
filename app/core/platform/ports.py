"""Loopback ports: a free one for a child process to listen on, and who holds a listening one (for the
"port in use" message)."""

from __future__ import annotations

import socket
import sys


def free_loopback_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the OS's choice; the child that binds
    it next may still lose a race, and says so when it cannot bind)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_owner(port: int) -> str | None:
    """'pid N (name)' of the process listening on `port` where the OS lets us see it; None when no
    listener is visible. Never raises: the message it feeds is already an error."""
    try:
        import psutil

        for c in psutil.net_connections(kind="inet"):
            if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN and c.pid:
                return f"pid {c.pid} ({_name(psutil.Process(c.pid))})"
    except Exception:  # denied (macOS without root), or no psutil in this environment
        pass
    return None


def _name(proc: object) -> str:
    import psutil

    try:
        return str(proc.name())  # type: ignore[attr-defined]
    except (psutil.Error, OSError):
        # Windows denies another user's process names to a normal user; the pid still helps
        return "name hidden" if sys.platform == "win32" else "unknown"
