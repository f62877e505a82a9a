"""The PyInstaller bundle (build.spec, `make package`): it starts from a clean environment, serves and
chats through its own llama.cpp lane, stops leaving no process, and opens its window offscreen.

The version plumbing and the frozen worker command line are checked without a bundle."""

from __future__ import annotations

import importlib.util
import json
import os
import struct
import subprocess
import sys
import tomllib
import urllib.request
from pathlib import Path

import openai
import psutil
import pytest

from app import __version__
from app.core import frozen
from tests.conftest import wait_gone
from tests.support.package_bundle import REPO, Program, clean_env, ensure_bundle, wait_no_processes
from tests.support.tinymodels import write_tiny_gguf

PYPROJECT_VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def test_version_comes_from_pyproject() -> None:
    assert __version__ == PYPROJECT_VERSION
    for args in (["--version"], ["version"]):
        r = subprocess.run(
            [sys.executable, "-m", "app", *args], cwd=REPO, capture_output=True, text=True, timeout=60
        )
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == f"switchyard {PYPROJECT_VERSION}"


def test_worker_argv_outside_a_bundle_is_python_dash_m(monkeypatch: pytest.MonkeyPatch) -> None:
    assert frozen.module_argv("app.lanes.workers.llamacpp") == (
        sys.executable,
        "-m",
        "app.lanes.workers.llamacpp",
    )
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    assert frozen.module_argv("app.lanes.guard") == (sys.executable, "_module", "app.lanes.guard")


def test_entry_script_runs_a_worker_module_and_refuses_others(tmp_path: Path) -> None:
    """installers/entry.py answers `_module` as the frozen program does: the guard execs its program."""
    entry = str(REPO / "installers" / "entry.py")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    # the guard checks that its parent is the pid it was given (this test process), then execs
    r = subprocess.run(
        [sys.executable, entry, "_module", "app.lanes.guard", str(os.getpid()), "--", "echo", "guarded-ok"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (r.returncode, r.stdout.strip()) == (0, "guarded-ok"), r.stderr
    r = subprocess.run(
        [sys.executable, entry, "_module", "app.lanes.guard", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "usage: python -m app.lanes.guard" in r.stderr
    r = subprocess.run(
        [sys.executable, entry, "_module", "os", "x"], env=env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2 and "not one of Switchyard's worker modules" in r.stderr


@pytest.fixture(scope="module")
def bundle() -> Path:
    return ensure_bundle()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_bundle_serves_and_chats_from_a_clean_environment(bundle: Path, tmp_path: Path) -> None:
    models = tmp_path / "models"
    write_tiny_gguf(models / "tiny.gguf")
    r = subprocess.run(
        ["env", "-i", *(f"{k}={v}" for k, v in clean_env(tmp_path).items()), str(bundle), "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.stdout.strip() == f"switchyard {PYPROJECT_VERSION}", r.stderr
    prog = Program(
        [str(bundle), "serve", "--port", "0", "--models-dir", str(models)], clean_env(tmp_path), cwd=tmp_path
    )
    lanes: list[int] = []
    try:
        url = prog.wait_listening()
        with urllib.request.urlopen(url + "/api/version", timeout=30) as resp:
            assert json.loads(resp.read())["version"] == PYPROJECT_VERSION
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
        reply = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=4
        )
        assert reply.choices[0].finish_reason in ("length", "stop")
        assert reply.usage is not None and reply.usage.completion_tokens > 0
        # the lane is the bundle's own program in its worker role, not a Python from PATH
        lanes = [p.pid for p in psutil.Process(prog.proc.pid).children(recursive=True)]
        cmdlines = [psutil.Process(pid).cmdline() for pid in lanes]
        assert any(c[:3] == [str(bundle), "_module", "app.lanes.workers.llamacpp"] for c in cmdlines), (
            cmdlines
        )
    finally:
        code = prog.stop()
    assert code == 0, prog.log()
    assert wait_gone([prog.proc.pid, *lanes], 15) == []
    assert wait_no_processes(tmp_path) == []


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(
    importlib.util.find_spec("PySide6") is None, reason="the bundle has no window without PySide6"
)
def test_bundle_opens_its_window_offscreen_and_takes_a_screenshot(bundle: Path, tmp_path: Path) -> None:
    (tmp_path / "sy").mkdir()
    # port 0: the window starts its server, which must not collide with a real one on 8686
    (tmp_path / "sy" / "settings.json").write_text(json.dumps({"port": 0}))
    shot = tmp_path / "window.png"
    env = clean_env(
        tmp_path,
        QT_QPA_PLATFORM="offscreen",
        SWITCHYARD_SCREENSHOT=str(shot),
        SWITCHYARD_SCREENSHOT_DELAY="3",
    )
    prog = Program([str(bundle)], env, cwd=tmp_path)
    try:
        code = prog.proc.wait(120)  # the screenshot hook quits as Ctrl+Q does once the file is written
    finally:
        prog.stop()
    assert code == 0, prog.log()
    assert shot.is_file(), prog.log()
    width, height = _png_size(shot)
    assert width >= 400 and height >= 300, (width, height)
    assert shot.stat().st_size > 5000  # a drawn window, not an empty image
    assert wait_no_processes(tmp_path) == []
