"""How a child process tells that the server which started it is still running, per OS.

  - Linux: the parent-death signal (prctl PR_SET_PDEATHSIG): the kernel kills the child when its parent
    dies, with nothing in the child having to run; and /proc to follow launchers and pid reuse.
  - macOS and other POSIX: no death signal; a poll of the pid (kill 0).
  - Windows: a handle to the server's process opened now and waited on with a zero timeout: a handle
    keeps naming that process even after its pid is reused. (Engines also live in a Job Object that the
    server's death closes: jobs.py.)

The server may not be the direct parent: an interpreter launcher (a venv's python.exe on Windows, a shim)
can sit between them. Then a death signal follows the launcher, and the check follows the server's pid.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable
from pathlib import Path

PR_SET_PDEATHSIG = 1
_MAX_DEPTH = 16  # launchers between the server and us: one or two in practice
SIGKILL = 9  # the number, not signal.SIGKILL: that name does not exist on Windows


def set_pdeathsig(sig: int = SIGKILL) -> bool:
    """Ask the kernel to send `sig` when our parent dies (Linux only; False elsewhere or on failure).

    SIGKILL cannot be caught or deferred: a process blocked in native code dies with its parent too."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def linux_stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a live process, from /proc; None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2 :].split()  # the command name may hold spaces and parentheses
    if not fields or fields[0] in ("Z", "X"):  # a zombie is as good as gone
        return None
    return int(fields[1]), int(fields[19])


def posix_alive(pid: int) -> bool:
    """Whether `pid` exists (POSIX only: on Windows os.kill terminates the process)."""
    try:
        os.kill(pid, 0)  # signal 0 only checks
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def windows_waiter(pid: int) -> Callable[[], bool] | None:
    """A check on a handle opened now (Windows only; None elsewhere or when the process is gone)."""
    if sys.platform != "win32":
        return None
    kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
    kernel32.OpenProcess.restype = ctypes.c_void_p
    kernel32.WaitForSingleObject.argtypes = (ctypes.c_void_p, ctypes.c_uint32)
    synchronize, wait_timeout = 0x00100000, 0x102
    handle = kernel32.OpenProcess(synchronize, False, pid)
    if not handle:
        return None
    return lambda: bool(kernel32.WaitForSingleObject(handle, 0) == wait_timeout)


def windows_alive(pid: int) -> bool:
    """Whether process `pid` runs now (Windows only; a handle opened, waited on and closed)."""
    if sys.platform != "win32":
        return False
    kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
    kernel32.OpenProcess.restype = ctypes.c_void_p
    kernel32.WaitForSingleObject.argtypes = (ctypes.c_void_p, ctypes.c_uint32)
    kernel32.CloseHandle.argtypes = (ctypes.c_void_p,)
    handle = kernel32.OpenProcess(0x00100000, False, pid)  # SYNCHRONIZE
    if not handle:
        return False
    try:
        return bool(kernel32.WaitForSingleObject(handle, 0) == 0x102)  # WAIT_TIMEOUT: still running
    finally:
        kernel32.CloseHandle(handle)


def _ancestor_check(server: int) -> Callable[[], bool] | None:
    if sys.platform == "win32":
        return windows_waiter(server)
    if not sys.platform.startswith("linux"):
        return (lambda: posix_alive(server)) if posix_alive(server) else None
    pid = os.getppid()
    for _ in range(_MAX_DEPTH):
        stat = linux_stat(pid)
        if stat is None or pid <= 1:
            return None
        if pid == server:
            born = stat[1]  # a pid reused by a later process has another start time
            return lambda: (now := linux_stat(server)) is not None and now[1] == born
        pid = stat[0]
    return None


def server_check(server: int) -> Callable[[], bool] | None:
    """A cheap check that the server (pid `server`, our parent or an ancestor) still runs; None if it is
    already gone (it may die between our start and this call)."""
    if sys.platform != "win32" and os.getppid() == server:
        # re-parenting changes getppid(): to init, or to a subreaper (systemd --user, a container's init)
        return lambda: os.getppid() == server
    return _ancestor_check(server)
