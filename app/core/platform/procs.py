"""An engine's process tree as one unit: started in a group of its own, asked to stop, then killed whole.

POSIX: the engine leads a new session (its own process group); a stop is SIGTERM to the group, a kill
SIGKILL to the group. Windows: the engine starts in a new process group (so Ctrl-Break reaches it and not
us) and is put into a Job Object (jobs.py) at once; a stop closes the engine's standard input (the stop
pipe, which our workers watch) or sends Ctrl-Break where a console carries it, a kill ends the job, and the
server's death closes the job by itself.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from typing import Any

from app.core.platform.jobs import Job
from app.core.platform.parent import SIGKILL, posix_alive, windows_alive

SIGTERM = 15  # numbers, not signal.SIGKILL/SIGTERM: Windows' signal module lacks SIGKILL
# set in an engine's environment when its standard input is the stop pipe (our workers watch it: see
# app/lanes/parentwatch.py); foreign engines ignore both and are ended after the grace
STOP_PIPE_ENV = "SWITCHYARD_STOP_PIPE"


def engine_env_defaults() -> dict[str, str]:
    """What every engine's environment holds unless the user set it otherwise. Windows: Python's UTF-8
    mode, since an engine's standard streams are pipes there and take the ANSI code page (cp1252), where
    printing a model's non-ASCII text (a prompt echoed in a log line) raised and ended the engine."""
    if sys.platform == "win32":
        return {"PYTHONUTF8": "1"}
    return {}


def stop_by_pipe() -> bool:
    """Whether an engine is asked to stop by closing its standard input rather than by a signal. Windows:
    Ctrl-Break reaches only a process group with a console, which a desktop app or a service lacks, and
    no other signal asks; POSIX keeps SIGTERM, which every engine (ours or not) understands."""
    return sys.platform == "win32"


def spawn_options() -> dict[str, Any]:
    """Keyword arguments for subprocess.Popen / asyncio.create_subprocess_exec that start the child in a
    group of its own on this OS."""
    if sys.platform == "win32":
        return {"creationflags": subprocess.CREATE_NEW_PROCESS_GROUP}
    return {"start_new_session": True}


class ProcessGroup:
    """The OS handle on one started engine and everything it starts. Create it right after the spawn."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._job: Job | None = None
        if sys.platform == "win32":
            job = Job.create()
            try:
                job.add(pid)
            except OSError:
                job.close()  # the engine died already (or was never ours): nothing to hold
            else:
                self._job = job

    def ask_to_stop(self) -> bool:
        """Ask the engine to leave; False when this OS had no way to deliver the request (the caller then
        ends it at once instead of waiting for a grace period that nothing will use)."""
        if sys.platform == "win32":
            try:
                os.kill(self.pid, signal.CTRL_BREAK_EVENT)  # only reaches a console process group
            except OSError:
                return False
            return True
        return self._signal(SIGTERM)

    def kill(self) -> None:
        """End the engine and everything it started, now. Never waits on the engine's own teardown."""
        if self._job is not None:
            self._job.terminate()
        elif sys.platform == "win32":
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGTERM)  # TerminateProcess: the leader at least
        else:
            self._signal(SIGKILL)

    def close(self) -> None:
        """Let go of the OS handle (Windows: closing the job kills what is left in it)."""
        if self._job is not None:
            self._job.close()
            self._job = None

    def _signal(self, sig: int) -> bool:
        if sys.platform == "win32":
            return False
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            return False
        return True


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists now (it may be a later process that reused the pid)."""
    if sys.platform == "win32":
        return windows_alive(pid)
    return posix_alive(pid)
