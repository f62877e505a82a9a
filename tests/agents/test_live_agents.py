"""Claude Code and Codex, unmodified, each run for one non-interactive turn through `switchyard launch`
against a real `switchyard serve` (issue 36).

The agents come from the npm registry, pinned, installed once per machine by scripts/ensure-agents.sh under
~/.cache/switchyard-agents. The model is tests/support/agentmodel.py's: random weights, so its words are
nonsense;
what is checked is the protocol: the agent's own request is accepted, its turn completes, it exits 0.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, ServerProcess, running_server
from tests.support.agentmodel import write_agent_gguf

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def agents_bin() -> Path:
    out = subprocess.run(
        [str(REPO / "scripts" / "ensure-agents.sh")], capture_output=True, text=True, timeout=900
    )
    assert out.returncode == 0, f"installing the agents failed: {out.stderr}"
    return Path(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("agents-live")
    write_agent_gguf(base / "models" / "agent.gguf")
    with running_server(base / "home", base / "models") as s:
        yield s


def run_agent(
    server: ServerProcess, agents_bin: Path, tmp_path: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    """`switchyard launch ARGS` with the agents on PATH, in a home and a working folder of the test's own
    (the agents write their settings and sessions under HOME)."""
    home, work = tmp_path / "home", tmp_path / "work"
    (home / ".codex").mkdir(parents=True)
    work.mkdir()
    env = {
        **os.environ,
        "HOME": str(home),
        "CODEX_HOME": str(home / ".codex"),
        "SWITCHYARD_HOME": str(server.home),
        "PATH": f"{agents_bin}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    return subprocess.run(
        [sys.executable, "-m", "app", "launch", "--url", server.url, "--model", "agent", *args],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )


def accepted(server: ServerProcess, route: str) -> list[str]:
    """The server's access-log lines for `route` (the serve process logs each request on stderr)."""
    return [line for line in server.stderr if f"POST {route} " in line]


def test_claude_code_one_turn(server: ServerProcess, agents_bin: Path, tmp_path: Path) -> None:
    out = run_agent(server, agents_bin, tmp_path, "claude", "--", "-p", "say hi")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "API Error" not in out.stdout + out.stderr
    lines = accepted(server, "/v1/messages")
    assert lines and all("status=200" in line for line in lines), lines


def test_codex_one_turn(server: ServerProcess, agents_bin: Path, tmp_path: Path) -> None:
    out = run_agent(server, agents_bin, tmp_path, "codex", "--", "exec", "--skip-git-repo-check", "say hi")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "tokens used" in out.stderr + out.stdout  # codex's line at the end of a completed turn
    lines = accepted(server, "/v1/responses")
    assert lines and all("status=200" in line for line in lines), lines
