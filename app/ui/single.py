"""One window per SWITCHYARD_HOME: a second launch asks the first to come forward, then exits."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from PySide6.QtNetwork import QLocalServer, QLocalSocket

from app.core.paths import Paths


def instance_name(paths: Paths) -> str:
    return "switchyard-" + hashlib.sha1(str(paths.home).encode()).hexdigest()[:12]


def forward_to_running(paths: Paths, *, timeout_ms: int = 500) -> bool:
    """True when a running window answered (it was asked to show itself)."""
    sock = QLocalSocket()
    sock.connectToServer(instance_name(paths))
    if not sock.waitForConnected(timeout_ms):
        return False
    sock.write(b"show\n")
    sock.flush()
    sock.waitForBytesWritten(timeout_ms)
    sock.disconnectFromServer()
    return True


class InstanceServer:
    def __init__(self, paths: Paths, on_show: Callable[[], None]) -> None:
        self.server = QLocalServer()
        self._on_show = on_show
        name = instance_name(paths)
        if not self.server.listen(name):
            QLocalServer.removeServer(name)  # a stale socket from a process that died
            self.server.listen(name)
        self.server.newConnection.connect(self._accept)

    def _accept(self) -> None:
        while self.server.hasPendingConnections():
            sock = self.server.nextPendingConnection()
            sock.readyRead.connect(lambda s=sock: self._read(s))

    def _read(self, sock: QLocalSocket) -> None:
        if bytes(sock.readAll().data()).startswith(b"show"):
            self._on_show()
        sock.disconnectFromServer()

    def close(self) -> None:
        self.server.close()
