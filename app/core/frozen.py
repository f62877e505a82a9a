"""Running our own Python modules as child processes, from a source tree or from a frozen bundle.

A lane's worker is `python -m app.lanes.workers.llamacpp ...`. A PyInstaller bundle has no `python`:
its `sys.executable` is the `switchyard` program itself, so there the same module is started as the
hidden command `switchyard _module app.lanes.workers.llamacpp ...`, which the bundle's entry script
(installers/entry.py) answers before anything else is imported.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

MODULE_COMMAND = "_module"
# only our own process entry points may be started this way: the hidden command is not a Python shell
RUNNABLE_PREFIXES = ("app.lanes.",)


def is_frozen() -> bool:
    return bool(getattr(sys, "frozen", False))


def module_argv(module: str) -> tuple[str, ...]:
    """The start of the argv that runs `module` as `__main__` in a new process."""
    if is_frozen():
        return (_console_program(), MODULE_COMMAND, module)
    return (sys.executable, "-m", module)


def _console_program() -> str:
    """On Windows the desktop entry runs the windowed switchyardw.exe, which has no standard streams of
    its own; workers report on stdout, so they run as the console program beside it."""
    exe = Path(sys.executable)
    if exe.stem.lower() == "switchyardw":
        console = exe.with_name("switchyard" + exe.suffix)
        if console.is_file():
            return str(console)
    return str(exe)


def run_module(argv: list[str]) -> int:
    """`_module NAME ARGS...`: run NAME as `__main__` with ARGS as its command line, as `-m` would."""
    if not argv or not argv[0].startswith(RUNNABLE_PREFIXES):
        print(f"switchyard {MODULE_COMMAND}: not one of Switchyard's worker modules", file=sys.stderr)
        return 2
    sys.argv = [argv[0], *argv[1:]]
    try:
        runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
        if code is None or isinstance(code, int):
            return int(code or 0)
        print(code, file=sys.stderr)
        return 1
    return 0
