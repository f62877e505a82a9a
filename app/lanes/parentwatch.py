"""Make a child process die with the server that started it, even when the server is killed with SIGKILL,
and whatever the child is doing then (loading a model in native code, stuck in an engine's teardown).

Two mechanisms, because neither is enough alone:
  - Linux: prctl(PR_SET_PDEATHSIG, SIGKILL). The kernel kills the child when its parent dies; nothing in
    the child has to run, so a model load or an engine's shutdown path cannot hold it up.
  - Everywhere: a daemon thread that notices the server is gone and leaves with os._exit, never through
    the interpreter's teardown (which waits on the engine's native destructors).
On Windows the server also holds each engine in a Job Object that its death closes (core/platform/jobs.py),
and asks an engine to stop by closing its standard input (the stop pipe), since no signal reaches a process
without a console there.
How each OS tells the server is alive is core/platform/parent.py.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import BinaryIO

from app.core.platform.parent import SIGKILL, server_check, set_pdeathsig
from app.core.platform.procs import STOP_PIPE_ENV

__all__ = [
    "GONE_EXIT_CODE",
    "server_check",
    "set_pdeathsig",
    "tie_to_server",
    "watch_server",
    "watch_stop_pipe",
]

GONE_EXIT_CODE = 3  # the workers' documented "the server is gone" exit code


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


def watch_stop_pipe(stream: BinaryIO | None = None) -> threading.Thread:
    """A daemon thread that leaves the process (code 0) when the server closes its standard input: the
    server's request to stop where no signal reaches the engine. Like the server watch it never goes
    through the interpreter's teardown, which would wait on the engine's native destructors."""

    def run() -> None:
        source = stream if stream is not None else sys.stdin.buffer
        with contextlib.suppress(OSError, ValueError):
            while source.read(4096):
                pass  # nothing is sent on the pipe: only its end means something
        os._exit(0)

    t = threading.Thread(target=run, name="stop-pipe", daemon=True)
    t.start()
    return t


def tie_to_server(server: int) -> bool:
    """Die with the server from now on, whatever this process is doing; False if it is gone already.

    Call it first thing in a worker, before the engine is imported or loaded."""
    set_pdeathsig(SIGKILL)
    # checked after arming: a server that died before the prctl would never send the signal
    alive = server_check(server)
    if alive is None or not alive():
        return False
    watch_server(alive)
    if os.environ.get(STOP_PIPE_ENV) == "1":  # the server made stdin the stop pipe (EngineProcess.spawn)
        watch_stop_pipe()
    return True
