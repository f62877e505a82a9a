"""`python -m app.lanes.guard PPID -- ARGV...`: exec an engine binary that dies with our server.

The death signal set here survives exec, so a native engine (llama-server) is tied to the
server's lifetime without any cooperation from the engine.
"""

from __future__ import annotations

import os
import signal
import sys

from app.lanes.parentwatch import set_pdeathsig


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m app.lanes.guard PPID -- PROGRAM [ARGS...]", file=sys.stderr)
        return 2
    ppid = int(argv[0])
    set_pdeathsig(signal.SIGTERM)
    if os.getppid() != ppid:  # the server died before we could arm the signal
        return 3
    os.execvp(argv[2], argv[2:])
    return 127  # pragma: no cover - execvp does not return


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
