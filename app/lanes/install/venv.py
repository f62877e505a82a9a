"""Running inside an engine's own environment: which Python creates it, how our worker code gets there,
the environment its processes get, and whether a process still runs from it.

The worker modules (app/lanes/*_worker.py) are Switchyard's code, not the engine's: they are put on the
engine interpreter's PYTHONPATH through a folder that holds only a link named `app` to our package. Adding
the folder above our package instead would also add the app's own site-packages (a pip install), whose
versions would shadow the engine's. A frozen bundle has no package folder; build.spec ships the `app`
sources as data (`engine-src/app`) for this.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import psutil

import app
from app.core.errors import NoEnginePythonError
from app.core.frozen import is_frozen

MIN_PYTHON = (3, 11)
_CANDIDATES = ("python3.13", "python3.12", "python3.11", "python3", "python")
# never let the user's or the app's interpreter set-up leak into an engine's environment
_DROP = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "__PYVENV_LAUNCHER__")


def python_version(python: str) -> tuple[int, int] | None:
    """(major, minor) of an interpreter, or None when it does not run."""
    try:
        out = subprocess.run(
            [python, "-c", "import sys; print(*sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=15,
            env=venv_env(None),
        )
        major, minor = out.stdout.split()
        return int(major), int(minor)
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def base_python(configured: str | None) -> str:
    """The interpreter that creates engine environments: `engine_python` from the settings, else this
    process's own (from a source tree or a pip install), else (a frozen app) the newest 3.11+ on PATH."""
    want = ".".join(map(str, MIN_PYTHON))
    if configured:
        found = shutil.which(os.path.expanduser(configured))
        version = python_version(found) if found else None
        if version is None or version < MIN_PYTHON:
            raise NoEnginePythonError(
                f"engine_python is set to {configured!r}, which is not a Python {want} or newer that runs "
                f"here; fix engine_python in settings.json or remove it"
            )
        return found or configured
    if not is_frozen():
        return sys.executable
    for name in _CANDIDATES:
        found = shutil.which(name)
        version = python_version(found) if found else None
        if found and version is not None and version >= MIN_PYTHON:
            return found
    raise NoEnginePythonError(
        f"no Python {want} or newer was found on PATH to create the engine's environment with (this app is "
        "a bundle without a Python of its own); install one (e.g. `apt install python3 python3-venv`, "
        "or from python.org) or set engine_python in settings.json to its path"
    )


def worker_source(engines_root: Path) -> Path:
    """A folder for PYTHONPATH where `import app` finds Switchyard's own code and nothing else."""
    if is_frozen():
        return Path(getattr(sys, "_MEIPASS", Path(sys.executable).parent)) / "engine-src"
    package = Path(app.__file__).resolve().parent
    # one folder per Switchyard install: two installs sharing a data dir never re-point each other's link
    shim = engines_root / f".app-{hashlib.sha1(str(package).encode()).hexdigest()[:10]}"
    link = shim / "app"
    if not (link.is_symlink() and link.resolve() == package):
        shim.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            link.unlink()
        link.symlink_to(package, target_is_directory=True)
    return shim


def venv_env(base: dict[str, str] | None, *, pythonpath: Path | None = None) -> dict[str, str]:
    """`base` (default: this process's environment) for a process of an engine's environment: none of the
    interpreter set-up of ours or the user's; user site-packages off; our worker code on the path if given."""
    env = dict(os.environ if base is None else base)
    for name in _DROP:
        env.pop(name, None)
    env["PYTHONNOUSERSITE"] = "1"
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return env


def processes_under(folder: Path) -> list[int]:
    """Pids of the processes whose program runs from `folder` (an engine's environment or version)."""
    root = str(folder.resolve()) + os.sep
    plain = str(folder) + os.sep
    pids: list[int] = []
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error, IndexError, TypeError):
            argv0 = (proc.info["cmdline"] or [""])[0]
            if argv0.startswith((root, plain)):
                pids.append(proc.pid)
    return pids
