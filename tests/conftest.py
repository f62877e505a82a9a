"""Shared fixtures: an isolated home for every test, tiny models, and a real `switchyard serve`."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.fakehub import FakeHub
from tests.support.tinymodels import CHAT, EMBED, LARGE, TinySpec, write_tiny_gguf

REPO = Path(__file__).resolve().parent.parent
# the starter model (app/library/starter.py) stays out of every library the tests make, module-scoped
# servers (started before the autouse fixture below) included; tests/test_starter_*.py opt in
os.environ["SWITCHYARD_NO_STARTER"] = "1"
# other apps' stores (Ollama, LM Studio...): never the developer's own, module-scoped servers included (the
# autouse fixture below gives each test a folder of its own)
os.environ["SWITCHYARD_APPS_HOME"] = tempfile.mkdtemp(prefix="sy-apps-home-")
# tests that build Qt widgets in this process; `make test` runs them after the rest, a process per file
# (spread over pytest-xdist workers, many windows in one worker once crashed Qt and hung the scheduler)
QT_FIXTURES = frozenset({"qapp", "qtbot", "qloop"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if QT_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.qt)


@pytest.fixture(autouse=True)
def isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own data dir, HF cache and a keyring that cannot reach the user's."""
    home = tmp_path / "sy-home"
    monkeypatch.setenv("SWITCHYARD_HOME", str(home))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # other apps' stores (Ollama, LM Studio...) are looked for here, never in the developer's own home
    monkeypatch.setenv("SWITCHYARD_APPS_HOME", str(tmp_path / "apps-home"))
    monkeypatch.setenv("PYTHON_KEYRING_BACKEND", "keyring.backends.fail.Keyring")
    # the starter model (app/library/starter.py) would be in every library: tests/test_starter_*.py opt in
    monkeypatch.setenv("SWITCHYARD_NO_STARTER", "1")
    monkeypatch.setenv("SWITCHYARD_NO_FIRST_RUN", "1")  # Discover's first-run view: tests/test_firstrun_*.py
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    return home


@pytest.fixture
def qloop(qapp: Any) -> Iterator[asyncio.AbstractEventLoop]:
    """A qasync loop over pytest-qt's QApplication, set as the current loop for the test (desktop tests)."""
    qasync = pytest.importorskip("qasync")
    from app.ui.main import make_qapp

    make_qapp()
    loop = qasync.QEventLoop(qapp)
    asyncio.set_event_loop(loop)
    try:
        yield loop
    finally:
        asyncio.set_event_loop(None)
        loop.close()
        # the loop's own Qt objects (its timer, its executor's QThreads) and whatever the test left in
        # reference cycles are freed here, on the GUI thread: left to the cyclic collector, they were freed
        # on whichever thread crossed its threshold (a to_thread worker of the next test's Desktop), and Qt
        # objects deleted there crashed the process with SIGSEGV (app/ui/desktop.py, _release_qt)
        del loop
        gc.collect()


@pytest.fixture
def fake_hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """A local Hugging Face-compatible hub (tests/support/fakehub.py); HF_ENDPOINT points at it, online."""
    with FakeHub() as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("HF_HUB_OFFLINE", "0")
        yield hub


@pytest.fixture(scope="session")
def model_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Generated once per session; tests copy or link what they need."""
    d = tmp_path_factory.mktemp("models-src")
    write_tiny_gguf(d / "tiny.gguf", CHAT)
    write_tiny_gguf(d / "tiny2.gguf", TinySpec(seed=7))
    write_tiny_gguf(d / "embed.gguf", EMBED)
    return d


@pytest.fixture(scope="session")
def large_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("models-large") / "large.gguf", LARGE)


def link_models(dest: Path, *sources: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for src in sources:
        target = dest / src.name
        if not target.exists():
            os.link(src, target) if src.stat().st_dev == dest.stat().st_dev else shutil.copy(src, target)
    return dest


class ServerProcess:
    """A real `python -m app serve` child, on a free port, in its own SWITCHYARD_HOME."""

    def __init__(self, home: Path, models_dir: Path, *extra: str, port: int = 0) -> None:
        self.home = home
        self.models_dir = models_dir
        env = dict(os.environ, SWITCHYARD_HOME=str(home), PYTHONUNBUFFERED="1")
        argv = [
            sys.executable,
            "-m",
            "app",
            "serve",
            "--port",
            str(port),
            "--models-dir",
            str(models_dir),
            *extra,
        ]
        self.proc = subprocess.Popen(
            argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self._ready = threading.Event()
        self.url = ""
        threading.Thread(target=self._pump, args=(self.proc.stdout, self.stdout, True), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, self.stderr, False), daemon=True).start()

    def _pump(self, stream, sink: list[str], watch: bool) -> None:  # type: ignore[no-untyped-def]
        for line in stream:
            sink.append(line.rstrip("\n"))
            if watch and line.startswith("listening on "):
                self.url = line.split()[-1]
                self._ready.set()

    def wait_ready(self, timeout: float = 30) -> ServerProcess:
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.05):
            if self.proc.poll() is not None:
                time.sleep(0.2)
                raise RuntimeError(f"serve exited with {self.proc.returncode}: {self.stderr_text()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"serve did not become ready: {self.stderr_text()}")
        return self

    @property
    def api(self) -> str:
        return self.url + "/v1"

    def stderr_text(self) -> str:
        return "\n".join(self.stderr)

    def engine_pids(self) -> list[int]:
        try:
            kids = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        return [k.pid for k in kids]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def wait_gone(pids: list[int], timeout: float = 10) -> list[int]:
    """The pids still alive (zombies count as gone) after waiting up to `timeout`."""
    deadline = time.monotonic() + timeout
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [
            p for p in alive if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
        ]
        if alive:
            time.sleep(0.1)
    return alive


@contextlib.contextmanager
def running_server(home: Path, models_dir: Path, *extra: str) -> Iterator[ServerProcess]:
    """A started `serve` for a module's tests; stopped at the end, and its engines checked gone."""
    s = ServerProcess(home, models_dir, *extra).wait_ready()
    try:
        yield s
    finally:
        pids = s.engine_pids()
        s.stop()
        wait_gone(pids, 5)


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    started: list[ServerProcess] = []

    def start(models_dir: Path, *extra: str, port: int = 0, wait: bool = True) -> ServerProcess:
        s = ServerProcess(tmp_path / f"home{len(started)}", models_dir, *extra, port=port)
        started.append(s)
        return s.wait_ready() if wait else s

    yield start
    for s in started:
        pids = s.engine_pids()
        s.stop()
        wait_gone(pids, 5)
