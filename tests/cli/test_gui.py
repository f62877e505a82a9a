"""The real `switchyard` command: no arguments opens the window with the server in it; a second launch
hands over to the first and exits; SIGTERM quits cleanly; no display means headless serve."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("qasync")

REPO = Path(__file__).resolve().parents[2]


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ, SWITCHYARD_HOME=str(home), PYTHONUNBUFFERED="1", **extra)
    env.pop("DISPLAY", None)
    env.pop("WAYLAND_DISPLAY", None)
    return env


def test_switchyard_opens_the_window_hands_over_and_quits_on_sigterm(isolated_env: Path) -> None:
    home = isolated_env
    home.mkdir(parents=True, exist_ok=True)
    (home / "settings.json").write_text(json.dumps({"port": 0, "monitor_interval_s": 0}))
    env = _env(home, QT_QPA_PLATFORM="offscreen")
    first = subprocess.Popen(
        [sys.executable, "-m", "app"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not (home / "server.json").exists():
            assert first.poll() is None, first.stderr.read() if first.stderr else ""
            assert time.monotonic() < deadline, "the window's server never started"
            time.sleep(0.1)
        url = json.loads((home / "server.json").read_text())["url"]
        with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
            assert r.status == 200
        second = subprocess.run(
            [sys.executable, "-m", "app", "gui"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert second.returncode == 0 and "already running" in second.stderr
        assert first.poll() is None  # the first one is still there
        first.send_signal(signal.SIGTERM)
        assert first.wait(20) == 0
        assert not (home / "server.json").exists()  # a clean stop removes it
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()


def test_without_a_display_it_runs_headless(isolated_env: Path) -> None:
    isolated_env.mkdir(parents=True, exist_ok=True)
    (isolated_env / "settings.json").write_text(json.dumps({"port": 0, "monitor_interval_s": 0}))
    env = _env(isolated_env)
    env.pop("QT_QPA_PLATFORM", None)
    serve = subprocess.Popen(
        [sys.executable, "-m", "app"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert serve.stdout is not None
        line = serve.stdout.readline()  # serve prints its address first; EOF if it died
        assert line.startswith("listening on "), serve.stderr.read() if serve.stderr else ""
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(20)
    assert serve.stderr is not None and "no display" in serve.stderr.read()
