"""Issue 12, a new user's CLI defects: `search` against a hub that is down or hangs fails in seconds with one
line; `doctor versions` is the versions view of doctor; every flag of every command says what it does."""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

from app import __version__
from app.__main__ import _parser, main
from app.core.settings import Settings
from tests.conftest import REPO as ROOT
from tests.support.fakehub import FakeHub


class HungHub:
    """A TCP server that accepts every connection, reads the request and never answers."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.request_lines: list[str] = []
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.settimeout(5)
            try:
                first = conn.recv(4096).split(b"\r\n", 1)[0].decode(errors="replace")
            except OSError:
                first = ""
            with self._lock:
                self._conns.append(conn)
                self.request_lines.append(first)

    def close(self) -> None:
        self.sock.close()
        with self._lock:
            for c in self._conns:
                c.close()


@pytest.fixture
def hung_hub() -> Iterator[HungHub]:
    hub = HungHub()
    try:
        yield hub
    finally:
        hub.close()


@pytest.fixture
def closed_port() -> Iterator[str]:
    # bound but never listening: connections are refused, and no other process can take the port meanwhile
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    try:
        yield f"http://127.0.0.1:{s.getsockname()[1]}"
    finally:
        s.close()


# the command's own wall time, measured inside a fresh process once the modules it imports are loaded:
# import time on a loaded 2-core machine (seconds) is not what the issue is about (24 s of retries was)
_TIMED = """
import json, sys, time
from app.__main__ import main
import app.hub.api, app.hub.browse
t0 = time.monotonic()
rc = main(sys.argv[1:])
print(json.dumps({"rc": rc, "elapsed": time.monotonic() - t0}))
"""


def _timed_cli(*args: str, endpoint: str) -> tuple[int, float, str]:
    env = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"}
    env.update(HF_ENDPOINT=endpoint, HF_HUB_OFFLINE="0")
    r = subprocess.run(
        [sys.executable, "-c", _TIMED, *args], capture_output=True, text=True, env=env, timeout=60, cwd=ROOT
    )
    assert r.stdout.strip(), r.stderr
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    return doc["rc"], doc["elapsed"], r.stderr


def _assert_one_line_error(stderr: str, endpoint: str) -> None:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("switchyard: error: "), stderr
    assert endpoint in lines[0] and "Traceback" not in stderr and "Retry" not in stderr


@pytest.mark.parametrize("hub", ["closed_port", "hung_hub"])
def test_search_fails_fast_when_the_hub_is_down_or_hangs(hub: str, request: pytest.FixtureRequest) -> None:
    target = request.getfixturevalue(hub)
    endpoint = target if isinstance(target, str) else target.url
    rc, elapsed, stderr = _timed_cli("search", "llama", endpoint=endpoint)
    assert rc != 0
    assert elapsed < 3.0, f"search took {elapsed:.1f} s: {stderr}"
    _assert_one_line_error(stderr, endpoint)
    if isinstance(target, HungHub):
        # one request, the search itself: no retry, and no telemetry request the user did not ask for
        assert len(target.request_lines) == 1, target.request_lines
        assert target.request_lines[0].startswith("GET /api/models?"), target.request_lines
        assert "did not answer in time" in stderr
    else:
        assert "cannot reach the hub" in stderr


def test_doctor_versions_shows_only_the_versions(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "versions", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["switchyard"] == __version__
    assert doc["python"] == platform.python_version()
    assert "xllamacpp" in doc["engines"]["llama.cpp"]  # the venv's llama.cpp runtime, with its version
    assert doc["engines"]["vllm"] is None  # needs a CUDA GPU: not installed here
    assert doc["packages"]["huggingface_hub"] == metadata.version("huggingface_hub")
    assert "pytest" not in doc["packages"]  # test-only packages are not what the user runs on
    assert main(["doctor", "versions"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"switchyard {__version__}\n")
    assert f"aiohttp              {metadata.version('aiohttp')}" in text
    assert "notes:" not in text and "memory:" not in text  # not the whole doctor report
    assert _parser().parse_args(["doctor"]).view is None  # plain `doctor` is the full report still


def test_doctor_rejects_an_unknown_view(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _parser().parse_args(["doctor", "version-list"])
    assert exc.value.code == 2
    assert "choose from 'versions'" in capsys.readouterr().err


def _walk(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, argparse.Action]]:
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk(sub, f"{path} {name}")
            continue
        yield path, action


def test_every_flag_of_every_command_has_help_in_words() -> None:
    keys = {f.name for f in Settings.fields()}
    seen, poor = 0, []
    for path, action in _walk(_parser(), "switchyard"):
        seen += 1
        text = (action.help or "").strip()
        name = "/".join(action.option_strings) or action.dest
        # a bare settings key (or any one-word help) says nothing a user can act on
        if not text or text == argparse.SUPPRESS or text.strip("`()") in keys or " " not in text:
            poor.append(f"{path} {name}: {action.help!r}")
    assert seen > 80  # the walk reached every subcommand (serve, engine pin, remote check, ...)
    assert poor == [], "\n".join(poor)


def test_every_command_has_a_summary() -> None:
    missing = []
    stack: list[tuple[str, argparse.ArgumentParser]] = [("switchyard", _parser())]
    while stack:
        path, parser = stack.pop()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                # by parser: an alias (`keys list` for `keys ls`) shares its command's parser and help
                helps = {id(action.choices[c.dest]): c.help for c in action._choices_actions}
                for name, sub in action.choices.items():
                    if not (helps.get(id(sub)) or "").strip():
                        missing.append(f"{path} {name}")
                    stack.append((f"{path} {name}", sub))
    assert missing == []


def test_serve_help_describes_log_level() -> None:
    r = subprocess.run(
        [str(Path(sys.executable).parent / "switchyard"), "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert r.returncode == 0
    assert "--log-level" in r.stdout and "logs to stderr" in r.stdout


def test_search_sends_the_token_and_pages_through_the_hub(
    fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # the search builds its own request now: the token must still go with it, and Link pages be followed
    fake_hub.page_size = 2
    for i in range(5):
        fake_hub.add_repo(f"org/m{i}", {"README.md": b"x"}, downloads=100 - i)
    fake_hub.add_repo("me/secret", {"README.md": b"x"}, private=True, downloads=1)
    assert main(["search", "--json", "--limit", "3", "--page", "2"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [m["id"] for m in doc["models"]] == ["org/m3", "org/m4"]
    assert doc["next_page"] is None
    assert main(["search", "secret", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["models"] == []  # private: not without the token
    monkeypatch.setenv("HF_TOKEN", "hf_testtoken")
    assert main(["search", "secret", "--json"]) == 0
    assert [m["id"] for m in json.loads(capsys.readouterr().out)["models"]] == ["me/secret"]
