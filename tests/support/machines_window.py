"""The Machines page's tests: a window whose server serves HTTPS (so it can pair), real `serve --tls` machines
to pair it with, and their one-time codes.

Use the fixtures by importing them into the test module and naming them in `__all__` (as
tests/support/harden_corpus.py's server is used).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from app.core.paths import Paths
from app.core.settings import Settings
from tests.conftest import REPO, ServerProcess, wait_gone

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before pytest-qt makes its QApplication


def invite(home: Path) -> dict[str, Any]:
    """`switchyard peers invite --json` on the machine whose home is `home`: its code, addresses and
    certificate fingerprint."""
    done = subprocess.run(
        [sys.executable, "-m", "app", "peers", "invite", "--json"],
        cwd=REPO,
        env=dict(os.environ, SWITCHYARD_HOME=str(home)),
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


@pytest.fixture
def tls_machine(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """Start a real `serve --tls` machine: `tls_machine("bee", models_dir, settings={...})` writes its
    settings.json first and returns once it listens; every machine started is stopped after the test,
    its engines with it."""
    started: list[ServerProcess] = []

    def start(name: str, models: Path, *, settings: Mapping[str, Any] | None = None) -> ServerProcess:
        home = tmp_path / name
        home.mkdir()
        if settings is not None:
            (home / "settings.json").write_text(json.dumps(dict(settings)))
        machine = ServerProcess(home, models, "--tls")
        started.append(machine)
        return machine.wait_ready(60)

    yield start
    for machine in started:
        pids = machine.engine_pids()
        machine.stop()
        assert wait_gone(pids, 10) == [], f"{machine.home.name} left engines running"


@pytest.fixture
def tls_window(tmp_path: Path) -> Settings:
    """A window's settings whose server serves HTTPS (a self-signed certificate for 127.0.0.1, so the
    Machines page can invite and pair) over an empty models folder, on a free port, with no monitor."""
    from app.server import tls

    material = tls.self_signed(Paths(home=tmp_path / "certs"), host="127.0.0.1")
    empty = tmp_path / "window-models"
    empty.mkdir()
    return Settings.flat(
        port=0,
        models_dirs=(empty,),
        tls_cert=str(material.cert),
        tls_key=str(material.key),
        monitor_interval_s=0,
    )


@contextlib.asynccontextmanager
async def machines_page(qapp: Any, home: Path, settings: Settings) -> AsyncIterator[tuple[Any, Any]]:
    """A running Desktop on `settings` in `home`, showing its Machines page: (desktop, page)."""
    from app.ui.desktop import Desktop  # here: a test that skips without qasync must still import this

    async with Desktop(Paths(home=home), settings, qapp=qapp) as desk:
        yield desk, desk.window.show_page("Machines")
