"""Make a child process die with the server that started it, even when the server is killed with SIGKILL,
and whatever the child is doing then (loading a model in native code, stuck in an engine's teardown).

Two mechanisms, because neither is enough alone:
  - Linux: prctl(PR_SET_PDEATHSIG, SIGKILL). The kernel kills the child when its parent dies; nothing in
    the child has to run, so a model load or an engine's shutdown path cannot hold it up.
  - Everywhere: a daemon thread that notices the server is gone and leaves with os._exit, never through
    the interpreter's teardown (which waits on the engine's native destructors).

The server may not be the direct parent: an interpreter launcher (a venv's python.exe on Windows, a shim)
can sit between them. Then the death signal follows the launcher, and the thread watches the server's pid.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

PR_SET_PDEATHSIG = 1
GONE_EXIT_CODE = 3  # the workers' documented "the server is gone" exit code
_MAX_DEPTH = 16  # launchers between the server and us: one or two in practice


def set_pdeathsig(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send `sig` when our parent dies (Linux only; False elsewhere or on failure).

    SIGKILL cannot be caught or deferred: a process blocked in native code dies with its parent too."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _linux_stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a live process, from /proc; None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2 :].split()  # the command name may hold spaces and parentheses
    if not fields or fields[0] in ("Z", "X"):  # a zombie is as good as gone
        return None
    return int(fields[1]), int(fields[19])


def _posix_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0 only checks (never on Windows, where os.kill terminates)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _windows_waiter(pid: int) -> Callable[[], bool] | None:
    """A check on a handle opened now: a handle keeps naming this process even if its pid is reused."""
    if sys.platform != "win32":
        return None
    kernel32 = ctypes.windll.kernel32
    synchronize, wait_timeout = 0x00100000, 0x102
    handle = kernel32.OpenProcess(synchronize, False, pid)
    if not handle:
        return None
    return lambda: bool(kernel32.WaitForSingleObject(handle, 0) == wait_timeout)


def _ancestor_check(server: int) -> Callable[[], bool] | None:
    """How to tell the server is still there when a launcher sits between us, or None if it is gone."""
    if sys.platform == "win32":
        return _windows_waiter(server)
    if not sys.platform.startswith("linux"):
        return (lambda: _posix_alive(server)) if _posix_alive(server) else None
    pid = os.getppid()
    for _ in range(_MAX_DEPTH):
        stat = _linux_stat(pid)
        if stat is None or pid <= 1:
            return None
        if pid == server:
            born = stat[1]  # a pid reused by a later process has another start time
            return lambda: (now := _linux_stat(server)) is not None and now[1] == born
        pid = stat[0]
    return None


def server_check(server: int) -> Callable[[], bool] | None:
    """A cheap check that the server (pid `server`, our parent or an ancestor) still runs; None if it is
    already gone (it may die between our fork and this call)."""
    if sys.platform != "win32" and os.getppid() == server:
        # re-parenting changes getppid(): to init, or to a subreaper (systemd --user, a container's init)
        return lambda: os.getppid() == server
    return _ancestor_check(server)


def watch_server(alive: Callable[[], bool], *, interval: float = 0.25) -> threading.Thread:
    """A daemon thread that exits the process hard (code 3) as soon as `alive()` turns False."""

    def run() -> None:
        while True:
            with contextlib.suppress(Exception):  # a failed check must not end the watch
                if not alive():
                    # no grace and no interpreter teardown: both would wait on the engine's destructors
                    os._exit(GONE_EXIT_CODE)
            time.sleep(interval)

    t = threading.Thread(target=run, name="server-watch", daemon=True)
    t.start()
    return t


def tie_to_server(server: int) -> bool:
    """Die with the server from now on, whatever this process is doing; False if it is gone already.

    Call it first thing in a worker, before the engine is imported or loaded."""
    set_pdeathsig(signal.SIGKILL)
    # checked after arming: a server that died before the prctl would never send the signal
    alive = server_check(server)
    if alive is None or not alive():
        return False
    watch_server(alive)
    return True
