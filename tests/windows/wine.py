"""Running this checkout's code as Windows code: the official Windows CPython under wine.

scripts/wine-setup.sh makes (once, cached in ~/.cache/switchyard-wine) a wine prefix with that Python
and the project's win_amd64 wheels; `WinePython.run` starts `python.exe` there on a check script with
this checkout on its path (wine's Z: drive is the Linux root). A python.exe start costs about 2.4 s,
so each check script batches many checks and prints one JSON line per result.

Wine's own limits (not Windows'): standard streams must be pipes, `QT_*` variables are dropped, no
console (Ctrl-Break), no performance counters. A check that meets one reports it as `wine` with the
reason; the test marks it xfail with that reason, never a silent skip.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

REPO = Path(__file__).resolve().parents[2]
SETUP = REPO / "scripts" / "wine-setup.sh"
CHECKS = Path(__file__).resolve().parent / "checks"
SETUP_TIMEOUT_S = 900  # a fresh machine: Debian packages, the prefix and the wheels (about 1 to 3 minutes)
# the Linux variables that must not reach the Windows Python (its pip, its paths)
_DROP = ("PIP_", "PYTHON", "VIRTUAL_ENV", "SWITCHYARD_", "HF_", "LD_")


def win_path(path: Path | str) -> str:
    """The Windows path of a Linux path: wine's Z: drive is the Linux root."""
    return "Z:" + str(PurePosixPath(Path(path).resolve())).replace("/", "\\")


@dataclass(frozen=True)
class Result:
    returncode: int
    lines: list[dict[str, object]]  # every stdout line that parsed as a JSON object
    stdout: str
    stderr: str
    seconds: float

    def by_check(self) -> dict[str, dict[str, object]]:
        return {str(line["check"]): line for line in self.lines if "check" in line}

    def tail(self) -> str:
        return f"exit {self.returncode}\n--- stdout\n{self.stdout[-4000:]}\n--- stderr\n{self.stderr[-4000:]}"


@dataclass(frozen=True)
class WinePython:
    prefix: Path
    python: Path

    @classmethod
    def setup(cls) -> WinePython:
        """Make or reuse the cached prefix; RuntimeError (with the setup's output) when that fails."""
        done = subprocess.run(
            [str(SETUP)], capture_output=True, text=True, timeout=SETUP_TIMEOUT_S, stdin=subprocess.DEVNULL
        )
        if done.returncode != 0:
            raise RuntimeError(f"scripts/wine-setup.sh failed ({done.returncode}):\n{done.stderr[-3000:]}")
        keys = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
        return cls(prefix=Path(keys["WINEPREFIX"]), python=Path(keys["WINE_PYTHON"]))

    def wine_env(self, extra: Mapping[str, str] = {}) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(_DROP)}
        env |= {
            "WINEPREFIX": str(self.prefix),
            "WINEDEBUG": "-all",
            "WINEARCH": "win64",
            "WINEDLLOVERRIDES": "mscoree,mshtml=",
            "PYTHONUTF8": "1",  # an engine's non-ASCII output crashed under the cp1252 code page
            "PYTHONPATH": win_path(REPO),
            # compiled modules kept beside the prefix, not in the checkout: a warm run skips compiling app/
            "PYTHONPYCACHEPREFIX": win_path(self.prefix.parent / "pycache"),
        }
        return env | dict(extra)

    def keeper(self) -> subprocess.Popen[bytes]:
        """A Windows program that idles until its stdin closes, holding wine's services up for a session.

        Wine's services start with the first Windows program and inherit its standard streams: started by
        a check whose output we read, they would keep that pipe open after the check ends. Started here,
        with nothing of ours but a stdin pipe, they stay up for every check; closing the keeper's stdin
        lets them (and wineserver) exit a few seconds after the last program."""
        return subprocess.Popen(
            ["wine", "cmd", "/c", "pause"],
            env=self.wine_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def popen(self, args: list[str], *, env: Mapping[str, str] = {}) -> subprocess.Popen[str]:
        """python.exe ARGS under wine, standard streams as pipes (a file there kills python.exe)."""
        return subprocess.Popen(
            ["wine", str(self.python), *args],
            env=self.wine_env(env),
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            encoding="utf-8",
            errors="replace",
        )

    def run(self, script: str, *args: str, env: Mapping[str, str] = {}, timeout: float = 180) -> Result:
        """Run checks/SCRIPT under the Windows Python and collect its JSON lines."""
        started = time.monotonic()
        proc = self.popen([win_path(CHECKS / script), *args], env=env)
        out, err = collect(proc, timeout=timeout)
        lines = []
        for raw in out.splitlines():
            raw = raw.strip()
            if raw.startswith("{"):
                try:
                    lines.append(json.loads(raw))
                except ValueError:
                    continue
        return Result(proc.returncode, lines, out, err, time.monotonic() - started)


def collect(proc: subprocess.Popen[str], *, timeout: float) -> tuple[str, str]:
    """(stdout, stderr) of a Windows program once it has exited (killed after `timeout`).

    Not communicate(): that waits for the end of the pipes, and a wine service the program started on
    first use (a driver host for sockets, say) inherits them and stays up after the program ends."""
    chunks: dict[str, list[str]] = {"out": [], "err": []}
    readers = [
        threading.Thread(target=lambda s=stream, k=key: chunks[k].extend(s), daemon=True)
        for key, stream in (("out", proc.stdout), ("err", proc.stderr))
    ]
    for t in readers:
        t.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for t in readers:
        t.join(timeout=2)  # what the program wrote is in the pipe by now
    return "".join(chunks["out"]), "".join(chunks["err"])
