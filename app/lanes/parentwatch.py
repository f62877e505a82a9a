"""Make a child process die with its parent, even when the parent is killed with SIGKILL.

Linux: prctl(PR_SET_PDEATHSIG) delivers a signal when the parent dies. Everywhere: a daemon
thread that notices the parent pid changed (the child was re-parented) and exits hard.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1


def set_pdeathsig(sig: int = signal.SIGTERM) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def watch_parent(expected_ppid: int, *, interval: float = 0.5, grace: float = 2.0) -> threading.Thread:
    """Exit the process (code 3) soon after the parent is gone."""

    def run() -> None:
        while True:
            if os.getppid() != expected_ppid:
                # give a SIGTERM-based shutdown a moment, then leave unconditionally
                time.sleep(grace)
                os._exit(3)
            time.sleep(interval)

    t = threading.Thread(target=run, name="parent-watch", daemon=True)
    t.start()
    return t
