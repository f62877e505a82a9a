"""Engines die with the server, whatever they are doing; engines start from an allow-listed environment.

The kill tests SIGKILL a real `switchyard serve` at many points of a real engine's start (from the
worker's fork to after it serves) and check that no process of that engine is left anywhere.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from app.lanes.proc import engine_env
from tests.conftest import REPO, ServerProcess, link_models, wait_gone

WORKER = "app.lanes.workers.llamacpp"
# The kernel kills an engine the moment its server dies (its death signal is SIGKILL): nothing waits on
# the engine's teardown or on a grace period, so a second and a half is ample even on a busy machine
GONE_WITHIN_S = 1.5


# ---- helpers ------------------------------------------------------------------------------------------
def _ask(url: str, model: str) -> None:
    """A chat request that starts the model's lane; its answer (or the server's death) is not awaited."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    req = urllib.request.Request(
        url + "/v1/chat/completions", data=body.encode(), headers={"Content-Type": "application/json"}
    )

    def send() -> None:
        with contextlib.suppress(OSError), urllib.request.urlopen(req, timeout=120) as r:
            r.read()

    threading.Thread(target=send, daemon=True).start()


def _engine_child(server: ServerProcess, marker: str, timeout: float = 30) -> psutil.Process:
    """The server's child whose command line holds `marker`, as soon as it is forked."""
    parent = psutil.Process(server.proc.pid)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in parent.children():
            with contextlib.suppress(psutil.Error):
                if any(marker in part for part in child.cmdline()):
                    return child
        time.sleep(0.002)
    raise AssertionError(f"no engine process appeared: {server.stderr_text()}")


def _tree(proc: psutil.Process) -> list[int]:
    with contextlib.suppress(psutil.Error):
        return [proc.pid, *(c.pid for c in proc.children(recursive=True))]
    return [proc.pid]


def _left_running(needle: str) -> list[str]:
    """Live processes anywhere whose command line mentions `needle` (a path unique to one test)."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        with contextlib.suppress(psutil.Error, TypeError):
            if p.info["status"] != psutil.STATUS_ZOMBIE and needle in " ".join(p.info["cmdline"] or []):
                found.append(f"{p.pid}: {' '.join(p.info['cmdline'])[:160]}")
    return found


def _lane_state(url: str, model: str) -> str | None:
    with contextlib.suppress(OSError, ValueError), urllib.request.urlopen(url + "/api/lanes", timeout=5) as r:
        lanes = json.loads(r.read())["lanes"]
        return next((ln["state"] for ln in lanes if ln["model"] == model), None)
    return None


def _serve(home: Path, models: Path, *, settings: dict[str, Any] | None = None) -> ServerProcess:
    home.mkdir(parents=True, exist_ok=True)
    if settings:
        (home / "settings.json").write_text(json.dumps(settings))
    return ServerProcess(home, models).wait_ready(60)


def _kill_server_and_check(server: ServerProcess, engine: psutil.Process, needle: str) -> None:
    pids = _tree(engine)
    server.proc.kill()
    server.proc.wait(10)
    alive = wait_gone(pids, GONE_WITHIN_S)
    assert not alive, f"engine processes outlived the server: {alive}"
    assert not _left_running(needle)


@pytest.fixture(scope="module")
def large_dir(tmp_path_factory: pytest.TempPathFactory, large_model: Path) -> Path:
    return link_models(tmp_path_factory.mktemp("procs") / "models-large", large_model)


@pytest.fixture(scope="module")
def load_s(tmp_path_factory: pytest.TempPathFactory, large_dir: Path) -> float:
    """Seconds from the worker's fork to its lane being ready, measured once; the server is then killed."""
    base = tmp_path_factory.mktemp("procs-measure")
    server = _serve(base / "home", large_dir)
    _ask(server.url, "large")
    engine = _engine_child(server, WORKER)
    forked = time.monotonic()
    deadline = forked + 60
    while _lane_state(server.url, "large") != "ready":
        assert time.monotonic() < deadline, server.stderr_text()
        time.sleep(0.01)
    took = time.monotonic() - forked
    _kill_server_and_check(server, engine, str(large_dir))  # killed while serving: the last point
    return took


def _kill_points(load_s: float, n: int) -> list[float]:
    """`n` delays after the fork, from at once (before the worker could arm anything) to past ready."""
    return [load_s * 1.1 * i / (n - 1) for i in range(n)]


def _trial(base: Path, models: Path, delay: float) -> None:
    server = _serve(base, models)
    _ask(server.url, "large")
    engine = _engine_child(server, WORKER)
    time.sleep(delay)
    _kill_server_and_check(server, engine, str(models))


# ---- dying with the server ----------------------------------------------------------------------------
@pytest.mark.parametrize("point", range(3))
def test_server_killed_during_an_engine_start_leaves_no_engine(
    point: int, tmp_path: Path, large_dir: Path, load_s: float
) -> None:
    _trial(tmp_path / "home", large_dir, _kill_points(load_s, 3)[point])


@pytest.mark.slow
def test_server_killed_at_many_points_of_an_engine_start(
    tmp_path: Path, large_dir: Path, load_s: float
) -> None:
    for i, delay in enumerate(_kill_points(load_s, 12)):
        _trial(tmp_path / f"home{i}", large_dir, delay)


def test_a_wrapped_engine_and_its_children_die_with_the_server(tmp_path: Path, model_store: Path) -> None:
    """A program we do not write (here a llama-server that ignores SIGTERM and starts a child of its own)
    runs under the guard: killing the server kills the engine's whole group, while it is still loading."""
    fake = tmp_path / "bin" / "llama-server"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\ntrap '' TERM\nsleep 600 &\nsleep 601\n")
    fake.chmod(0o755)
    models = link_models(tmp_path / "models", model_store / "tiny.gguf")
    settings = {"runtime": "llama-server", "llama_server_path": str(fake)}
    server = _serve(tmp_path / "home", models, settings=settings)
    _ask(server.url, "tiny")
    guard = _engine_child(server, "app.lanes.guard")
    deadline = time.monotonic() + 20
    while sum("sleep" in " ".join(c.cmdline()) for c in guard.children(recursive=True)) < 2:
        assert time.monotonic() < deadline, server.stderr_text()
        time.sleep(0.02)
    _kill_server_and_check(server, guard, str(fake))


def test_the_guard_follows_a_server_behind_a_launcher(tmp_path: Path) -> None:
    """The server's pid is an ancestor, not the parent (a launcher sits between): the engine still starts,
    and still dies with the server, not with the launcher."""
    marker = tmp_path / "started"
    guard = [
        sys.executable,
        "-m",
        "app.lanes.guard",
        "{ppid}",
        "--",
        "sh",
        "-c",
        f"touch {marker}; sleep 602",
    ]
    # the "server": starts `sh -c 'guard ...; true'` (a shell that stays, as a launcher) in a new session
    code = (
        "import os, subprocess, sys, time\n"
        f"argv = {guard!r}\n"
        "argv[3] = str(os.getpid())\n"
        "cmd = ' '.join(subprocess.list2cmdline([a]) for a in argv) + '; true'\n"
        "subprocess.Popen(['sh', '-c', cmd], start_new_session=True)\n"
        "time.sleep(600)\n"
    )
    server = subprocess.Popen([sys.executable, "-c", code], cwd=REPO)
    try:
        deadline = time.monotonic() + 20
        pids: list[int] = []
        while not marker.exists() or len(pids) < 4:  # launcher shell, guard, the program's shell, its sleep
            assert time.monotonic() < deadline, "the guarded program never started"
            time.sleep(0.02)
            with contextlib.suppress(psutil.Error, IndexError):
                pids = _tree(psutil.Process(server.pid).children()[0])
        server.kill()
        server.wait(10)
        alive = wait_gone(pids[1:], GONE_WITHIN_S)  # the launcher is not ours to kill; all below it is
        assert not alive, f"outlived the server: {alive}"
    finally:
        server.kill()
        server.wait(10)


def test_a_stop_through_the_guard_ends_the_engine_as_the_engine_ended(tmp_path: Path) -> None:
    """The guard stays as the engine's parent now: a lane's stop (SIGTERM to the group) still ends the
    engine, and the lane still sees the engine's own ending (the signal, or its exit code)."""
    head = [sys.executable, "-m", "app.lanes.guard", str(os.getpid()), "--"]
    engine = subprocess.Popen([*head, "sleep", "603"], cwd=REPO, start_new_session=True)
    deadline = time.monotonic() + 20
    while not psutil.Process(engine.pid).children():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    os.killpg(engine.pid, signal.SIGTERM)
    assert engine.wait(10) == -signal.SIGTERM
    done = subprocess.run([*head, "sh", "-c", "exit 7"], cwd=REPO, start_new_session=True, timeout=30)
    assert done.returncode == 7


def test_an_engine_killed_outright_is_reported_as_killed_by_the_guard() -> None:
    """An engine ended by SIGKILL (an OOM kill, a user's kill -9): the guard ends the same way, with no
    traceback (SIGKILL has no handler to reset; setting one raised EINVAL and the guard exited 1)."""
    head = [sys.executable, "-m", "app.lanes.guard", str(os.getpid()), "--"]
    guard = subprocess.Popen(
        [*head, "sleep", "605"], cwd=REPO, start_new_session=True, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 20
    while not psutil.Process(guard.pid).children():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    psutil.Process(guard.pid).children()[0].kill()
    assert guard.wait(10) == -signal.SIGKILL
    assert guard.stderr is not None and "Traceback" not in guard.stderr.read()


def test_a_stop_that_comes_while_the_engine_starts_still_ends_it() -> None:
    """A group stop that reaches the engine between fork and exec is lost at exec (it was taken by the
    handler inherited from the guard): the guard sends it once more once the engine runs. Here the stop
    comes just before the start, the same loss, made certain (it flaked once in a clean-clone run)."""
    code = (
        "import os, signal, sys; import app.lanes.guard as g; real = g._start\n"
        "def late(program, *, leader):\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return real(program, leader=leader)\n"
        "g._start = late\n"
        "raise SystemExit(g.main(sys.argv[1:]))\n"
    )
    guard = subprocess.Popen(
        [sys.executable, "-c", code, str(os.getpid()), "--", "sleep", "604"], cwd=REPO, start_new_session=True
    )
    try:
        assert guard.wait(20) == -signal.SIGTERM
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(guard.pid, signal.SIGKILL)


# ---- the environment an engine starts with ------------------------------------------------------------
SECRETS = {
    "AWS_SECRET_ACCESS_KEY": "aws-Zq8Xsecret",
    "DATABASE_URL": "postgres://app:Zq8Xpw@db/app",
    "PGPASSWORD": "Zq8Xpg",
    "OPENAI_API_KEY": "sk-Zq8Xopenai",
    "GITHUB_TOKEN": "gh-Zq8X",
    "HF_TOKEN": "hf_Zq8X",
    "SWITCHYARD_REMOTE_KEY_WORK": "sy-Zq8X",
    "LLAMA_API_KEY": "Zq8Xllama",  # in an allowed family, still a credential
}
ALLOWED = {"LC_ALL": "C.UTF-8", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}


def test_engine_env_is_an_allow_list_plus_the_users_additions() -> None:
    base = {"PATH": "/bin", "HOME": "/h", **SECRETS, **ALLOWED, "MY_CA": "/ca.pem", "RANDOM_THING": "x"}
    env = engine_env(base, kind="llama.cpp", passed=("MY_CA", "ABSENT"), extra={"llama.cpp": {"ADDED": "1"}})
    assert env == {"PATH": "/bin", "HOME": "/h", **ALLOWED, "MY_CA": "/ca.pem", "ADDED": "1"}
    other = engine_env(base, kind="piper", extra={"llama.cpp": {"ADDED": "1"}})
    assert "ADDED" not in other and "MY_CA" not in other  # per kind, and only the names the user passes


@pytest.fixture(scope="module")
def env_server(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("procs-env")
    models = link_models(base / "models", model_store / "tiny.gguf")
    settings = {"engine_env_pass": ["MY_PASSED_VAR"], "engine_env": {"llama.cpp": {"MY_ADDED_VAR": "added"}}}
    with pytest.MonkeyPatch.context() as mp:
        for name, value in {**SECRETS, **ALLOWED, "MY_PASSED_VAR": "passed"}.items():
            mp.setenv(name, value)
        server = _serve(base / "home", models, settings=settings)  # the server's environment is set here
    try:
        yield server
    finally:
        pids = server.engine_pids()
        server.stop()
        wait_gone(pids, 5)


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc/<pid>/environ")
def test_a_real_engine_gets_no_secret_of_the_servers(env_server: ServerProcess) -> None:
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    req = urllib.request.Request(
        env_server.api + "/chat/completions", data=body.encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.status == 200  # the engine starts and answers with the allow-listed environment
    server_env = _environ(env_server.proc.pid)
    assert server_env["AWS_SECRET_ACCESS_KEY"] == SECRETS["AWS_SECRET_ACCESS_KEY"]  # the server has them
    engine = _engine_child(env_server, WORKER)
    env = _environ(engine.pid)
    assert not set(SECRETS) & set(env), sorted(set(SECRETS) & set(env))
    assert all("Zq8X" not in v for v in env.values())
    assert {k: env.get(k) for k in ALLOWED} == ALLOWED
    assert env["MY_PASSED_VAR"] == "passed" and env["MY_ADDED_VAR"] == "added"
    assert env["PATH"] == server_env["PATH"] and "SWITCHYARD_HOME" not in env
    assert os.environ.get("AWS_SECRET_ACCESS_KEY") is None  # nothing leaked into this test process
