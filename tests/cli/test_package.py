"""The CLI package (app/cli): its one client (server found once, TLS trust of the recorded certificate or
--cacert, one SSE reader) and `switchyard run` against a real `serve --tls` on a tiny model, plus the
in-process server `run` starts when none runs."""

from __future__ import annotations

import argparse
import ast
import inspect
import io
import json
import os
import pkgutil
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import app.cli
from app.cli.client import read_sse
from app.cli.context import CliContext
from app.cli.run import Chat, chat_loop
from app.core.errors import SettingsError
from app.core.paths import Paths
from app.server import tls
from tests.conftest import REPO, ServerProcess, link_models, running_server

GRAMMAR = 'root ::= "the answer is 42"'
ANSWER = "the answer is 42"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("clipkg")
    with running_server(root / "home", link_models(root / "m", model_store / "tiny.gguf"), "--tls") as s:
        yield s


def switchyard(home: Path, *argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, SWITCHYARD_HOME=str(home))
    return subprocess.run(
        [sys.executable, "-m", "app", *argv],
        cwd=REPO,
        env=env,
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_sse_reader_joins_data_lines_skips_comments_and_stops_at_done() -> None:
    raw = [
        b": keep-alive\n",
        b"\n",
        b"event: snapshot\n",
        b'data: {"a":\n',
        b"data: 1}\n",
        b"\n",
        b'data: {"b": 2}\r\n',
        b"\r\n",
        b"data: [DONE]\n",
        b"\n",
        b'data: {"after": true}\n',
        b"\n",
    ]
    assert list(read_sse(raw)) == [("snapshot", {"a": 1}), ("message", {"b": 2})]
    # a stream cut before its closing blank line still yields its last event
    assert list(read_sse([b"event: x\n", b'data: {"c": 3}\n'])) == [("x", {"c": 3})]


def test_chat_streams_over_https_with_the_recorded_certificate(server: ServerProcess) -> None:
    client = CliContext(Paths(home=server.home)).running(None, api_key=None)
    assert client is not None and client.url == server.url and client.url.startswith("https://")
    chat = Chat(client, "tiny", system="be brief", extra={"grammar": GRAMMAR})
    out = io.StringIO()
    assert chat.ask("q", out=out) == ANSWER and out.getvalue() == ANSWER
    assert chat.ask("again", out=out) == ANSWER  # the second turn carries the first
    roles = [m["role"] for m in chat.messages]
    assert roles == ["system", "user", "assistant", "user", "assistant"]
    assert chat.messages[2]["content"] == ANSWER


class _Interrupting(io.StringIO):
    """A terminal where the user presses Ctrl-C as the first words of an answer arrive."""

    def __init__(self) -> None:
        super().__init__()
        self.pressed = False

    def write(self, s: str) -> int:
        if not self.pressed and s and not s.startswith(("chatting", ">>>", "\n", " [")):
            self.pressed = True
            raise KeyboardInterrupt
        return super().write(s)


def test_chat_loop_ctrl_c_stops_an_answer_and_ctrl_d_leaves(server: ServerProcess) -> None:
    ctx = CliContext(Paths(home=server.home))
    client = ctx.running(None, api_key=None)
    assert client is not None
    chat = Chat(client, "tiny", extra={"grammar": GRAMMAR})
    lines = iter(["first", "", "second"])

    def read(prompt: str) -> str:
        assert prompt == ">>> "
        return next(lines)  # StopIteration is not EOFError: end with it below

    def read_then_eof(prompt: str) -> str:
        try:
            return read(prompt)
        except StopIteration:
            raise EOFError from None

    out = _Interrupting()
    assert chat_loop(chat, read=read_then_eof, out=out) == 0
    text = out.getvalue()
    assert "[stopped]" in text and text.count(ANSWER) == 1  # the first stopped, the second whole
    assert [m["content"] for m in chat.messages if m["role"] == "user"] == ["first", "second"]
    # the stopped stream was closed and the lane is still there to answer the next one
    lanes = client.get("/api/lanes")["lanes"]
    assert [ln["model"] for ln in lanes] == ["tiny"] and lanes[0]["state"] == "ready"


def test_run_one_shot_through_the_running_tls_server(server: ServerProcess) -> None:
    done = switchyard(server.home, "run", "tiny", "hello", "--max-tokens", "3")
    assert done.returncode == 0, done.stderr
    assert "starting one in this process" not in done.stderr  # it used the server that runs
    piped = switchyard(server.home, "run", "tiny", "--max-tokens", "2", stdin="a prompt on stdin\n")
    assert piped.returncode == 0, piped.stderr
    empty = switchyard(server.home, "run", "tiny", stdin="")
    assert empty.returncode == 2 and "no prompt" in empty.stderr


def test_cacert_trusts_a_server_this_home_did_not_record(server: ServerProcess, tmp_path: Path) -> None:
    cert = shutil.copy(tls.tls_dir(Paths(home=server.home)) / "cert.pem", tmp_path / "their.pem")
    stranger = tmp_path / "other-home"  # no server.json, no tls folder: nothing recorded here
    url = server.url.replace("127.0.0.1", "localhost")
    refused = switchyard(stranger, "ps", "--url", url, "--json")
    assert refused.returncode == 2, refused.stdout
    assert "does not trust" in refused.stderr and "--cacert" in refused.stderr
    assert "Traceback" not in refused.stderr
    trusted = switchyard(stranger, "--cacert", str(cert), "ps", "--url", url, "--json")
    assert trusted.returncode == 0, trusted.stderr
    assert json.loads(trusted.stdout)["url"] == url


def test_cacert_that_is_not_a_certificate_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "not.pem"
    bad.write_text("hello")
    ctx = CliContext(Paths(home=tmp_path / "h"), cacert=bad)
    with pytest.raises(SettingsError, match="--cacert"):
        ctx.client("https://127.0.0.1:1", api_key=None)
    assert ctx.client("http://127.0.0.1:1", api_key=None).url == "http://127.0.0.1:1"  # plain: not read


def test_run_starts_a_server_in_process_when_none_runs(tmp_path: Path, model_store: Path) -> None:
    home = tmp_path / "home"
    models = link_models(tmp_path / "m", model_store / "tiny.gguf")
    done = switchyard(home, "run", "tiny", "hi", "--max-tokens", "2", "--models-dir", str(models))
    assert done.returncode == 0, done.stderr
    assert "starting one in this process" in done.stderr
    assert not (home / "server.json").exists()  # never announced as the running server
    missing = switchyard(home, "run", "nope", "hi", "--models-dir", str(models))
    assert missing.returncode == 2 and "switchyard: error: " in missing.stderr
    assert "Traceback" not in missing.stderr


# the modules in app/cli that are not command groups: what the groups share
CLI_HELPERS = frozenset({"client", "context", "options"})


def test_the_entry_point_stays_small() -> None:
    lines = (REPO / "app" / "__main__.py").read_text().splitlines()
    assert len(lines) < 60, f"app/__main__.py has {len(lines)} lines: a command's code belongs in app/cli/"


def _defines(name: str) -> tuple[set[str], bool]:
    """The top-level functions a module in app/cli defines, and whether it adds a subcommand anywhere."""
    source = (REPO / "app" / "cli" / f"{name}.py").read_text()
    tree = ast.parse(source)
    functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    adds = any(isinstance(n, ast.Attribute) and n.attr == "add_parser" for n in ast.walk(tree))
    return functions, adds


def test_every_command_group_has_register_and_run_and_is_in_groups() -> None:
    modules = {m.name for m in pkgutil.iter_modules(app.cli.__path__)}
    groups = [m.__name__.removeprefix("app.cli.") for m in app.cli.GROUPS]
    assert len(groups) == len(set(groups)), f"a group is listed twice in GROUPS: {groups}"
    assert {"serve", "library", "pull", "run", "gui"} <= set(groups)
    for name in sorted(modules - CLI_HELPERS):
        functions, adds = _defines(name)
        where = f"app/cli/{name}.py"
        assert {"register", "run"} <= functions, f"{where} is a command group: it needs register and run"
        assert adds, f"{where} adds no subcommand in register (sub.add_parser)"
        assert name in groups, f"{where} is a command group: add it to GROUPS in app/cli/__init__.py"
    for name in CLI_HELPERS:
        functions, adds = _defines(name)
        assert name in modules and not adds and not {"register", "run"} & functions, (
            f"app/cli/{name}.py is listed as a helper but looks like a command group: add it to GROUPS"
        )
    assert set(groups) == modules - CLI_HELPERS, "every GROUPS member is a command module in app/cli"


def test_each_group_registers_its_own_commands() -> None:
    owners: dict[str, str] = {}
    sub = argparse.ArgumentParser(prog="switchyard").add_subparsers(dest="command")
    for group in app.cli.GROUPS:
        assert list(inspect.signature(group.run).parameters) == ["args", "ctx"], group.__name__
        before = set(sub.choices)
        group.register(sub)
        added = set(sub.choices) - before
        assert added, f"{group.__name__}.register added no command"
        owners.update(dict.fromkeys(added, group.__name__))
    assert owners["ls"] == "app.cli.library" and owners["gui"] == "app.cli.gui"
