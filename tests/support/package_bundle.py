"""The PyInstaller bundle for the packaging tests: built with `make package`, or reused when it is newer
than every file that goes into it (a rebuild after an edit takes well under a minute)."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
BUNDLE = REPO / "dist" / "switchyard"
PROGRAM = BUNDLE / "switchyard"
INPUTS = ("app", "installers/entry.py", "resources", "build.spec", "pyproject.toml")


def newest_input() -> float:
    newest = 0.0
    for rel in INPUTS:
        p = REPO / rel
        files = (
            [p] if p.is_file() else [f for f in p.rglob("*") if f.is_file() and "__pycache__" not in f.parts]
        )
        newest = max([newest, *(f.stat().st_mtime for f in files)])
    return newest


def ensure_bundle() -> Path:
    if PROGRAM.is_file() and PROGRAM.stat().st_mtime > newest_input():
        return PROGRAM
    started = time.monotonic()
    r = subprocess.run(["make", "package"], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"make package failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    print(f"built {BUNDLE} in {time.monotonic() - started:.0f} s")
    assert PROGRAM.is_file() and os.access(PROGRAM, os.X_OK)
    return PROGRAM


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """What `env -i` with PATH, HOME and SWITCHYARD_HOME leaves: no venv, no PYTHONPATH, no HF_*."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "SWITCHYARD_HOME": str(home / "sy"),
        **extra,
    }


class Program:
    """The frozen program as a child process started through `env -i`, its output collected."""

    def __init__(self, argv: list[str], env: dict[str, str], *, cwd: Path) -> None:
        envargs = [f"{k}={v}" for k, v in env.items()]
        self.proc = subprocess.Popen(
            ["env", "-i", *envargs, *argv],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self.url = ""
        self._ready = threading.Event()
        threading.Thread(target=self._pump, args=(self.proc.stdout, self.stdout, True), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, self.stderr, False), daemon=True).start()

    def _pump(self, stream, sink: list[str], watch: bool) -> None:  # type: ignore[no-untyped-def]
        for line in stream:
            sink.append(line.rstrip("\n"))
            if watch and line.startswith("listening on "):
                self.url = line.split()[-1]
                self._ready.set()

    def wait_listening(self, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.1):
            assert self.proc.poll() is None, f"exited with {self.proc.returncode}:\n{self.log()}"
            assert time.monotonic() < deadline, f"not listening after {timeout} s:\n{self.log()}"
        return self.url

    def log(self) -> str:
        return "\n".join(self.stdout[-40:] + self.stderr[-80:])

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"did not stop on SIGTERM within {timeout} s:\n{self.log()}") from None
        return self.proc.returncode


def processes_of(home: Path) -> list[psutil.Process]:
    """Live processes of the bundle that run with this SWITCHYARD_HOME (the server and its lanes)."""
    mine = []
    want = str(home / "sy")
    for p in psutil.process_iter(["exe", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE or not str(p.info["exe"] or "").endswith(
                "switchyard"
            ):
                continue
            if p.environ().get("SWITCHYARD_HOME") == want:
                mine.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return mine


def wait_no_processes(home: Path, timeout: float = 15) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    left = processes_of(home)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = processes_of(home)
    return left
