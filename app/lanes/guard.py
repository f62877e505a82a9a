"""`python -m app.lanes.guard PPID -- ARGV...`: run an engine program that dies with our server.

For engines we do not write (llama-server, mlx_lm.server, sd-server, vLLM, SGLang). The guard stays as
the engine's parent, in the lane's process group, and is small pure Python that never blocks in native
code, so it always notices the server's death (a death signal and a watch of its parent, as the workers
do) and then kills the whole group at once: the engine and anything it started (vLLM's GPU workers).
The engine itself gets SIGKILL as its own death signal, so it also dies if the guard is killed.

A stop from the lane signals the whole group: the engine gets it directly, and the guard waits for the
engine and leaves the way it did (its exit code, or the same signal).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

from app.lanes.parentwatch import GONE_EXIT_CODE, server_check, set_pdeathsig

_NO_HANDLER = frozenset(getattr(signal, n) for n in ("SIGKILL", "SIGSTOP") if hasattr(signal, n))
POLL_S = 0.1  # how soon a dead server or a finished engine is seen
STOP_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, name)
)


def _tie_child() -> None:  # runs in the child between fork and exec
    set_pdeathsig(signal.SIGKILL)


def _start(program: list[str], *, leader: bool) -> subprocess.Popen[bytes]:
    if os.name != "posix":
        return subprocess.Popen(program)
    # the guard has no threads, so a preexec_fn is safe here
    return subprocess.Popen(program, preexec_fn=_tie_child, process_group=None if leader else 0)


def _kill_everything(child: subprocess.Popen[bytes], *, leader: bool) -> None:
    """SIGKILL the engine's whole group: ours when we lead it (a lane's guard always does), else its own."""
    if os.name != "posix":
        child.kill()
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(0 if leader else child.pid, signal.SIGKILL)  # ours includes this process: nothing is left


def _leave_like(returncode: int) -> int:
    """Exit as the engine did: the same code, or killed by the same signal (what the lane reports)."""
    if returncode >= 0:
        return returncode
    sig = -returncode
    if sig not in _NO_HANDLER:  # SIGKILL and SIGSTOP have no handler to reset (EINVAL)
        signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    return 128 + sig  # only reached for a signal that does not end a process


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m app.lanes.guard PPID -- PROGRAM [ARGS...]", file=sys.stderr)
        return 2
    set_pdeathsig(signal.SIGTERM)  # caught below: the guard itself must run to kill the group
    alive = server_check(int(argv[0]))
    if alive is None or not alive():  # the server died before we could arm the signal
        return GONE_EXIT_CODE
    # A lane's guard leads the engine's group: a stop signals the whole group, the engine has it too, and
    # the guard stays to report how it ended. Under a launcher the guard leads nothing: the engine gets a
    # group of its own (so it can be killed whole) and the guard passes stop signals on to it.
    leader = os.name == "posix" and os.getpgrp() == os.getpid()
    started: list[int] = []
    stops: list[int] = []  # the stop signals received

    def on_stop(signum: int, _frame: object) -> None:
        stops.append(signum)
        if not leader and started and os.name == "posix":
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(started[0], signum)

    for sig in STOP_SIGNALS:
        signal.signal(sig, on_stop)
    try:
        child = _start(argv[2:], leader=leader)
    except OSError as exc:
        print(f"switchyard guard: cannot start {argv[2]}: {exc.strerror or exc}", file=sys.stderr)
        return 127
    started.append(child.pid)
    if stops:
        # a stop that came while the child was starting: a group signal that reached it between fork and
        # exec was taken by the handler it inherited from us and lost at exec, so it is sent once more
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(child.pid, stops[-1])
    while (code := child.poll()) is None:
        if not alive():
            _kill_everything(child, leader=leader)
            return GONE_EXIT_CODE
        time.sleep(POLL_S)  # a signal (the death signal) cuts this short
    return _leave_like(code)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
