"""Issue 31, the command line in a new user's first hour: output piped into a reader that leaves early
(defect 11)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli.options import PIPE_CLOSED_STATUS
from tests.conftest import REPO
from tests.support.fakehub import FakeHub
from tests.support.tinymodels import TinySpec, write_tiny_gguf


def piped_into_a_closed_reader(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    """`switchyard ARGS | head -0`: the pipe's read end is closed before the command writes anything."""
    env = dict(os.environ, SWITCHYARD_HOME=str(home))
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone
    err = proc.stderr.read()
    return subprocess.CompletedProcess(proc.args, proc.wait(60), "", err)


@pytest.mark.parametrize("args", [("ls",), ("ls", "--json"), ("ps",), ("jobs", "--json")])
def test_a_closed_pipe_ends_a_command_quietly(args: tuple[str, ...], tmp_path: Path) -> None:
    home = tmp_path / "home"
    models = home / "models"
    models.mkdir(parents=True)
    for i in range(3):
        write_tiny_gguf(models / f"m{i}.gguf", TinySpec(seed=i))
    done = piped_into_a_closed_reader(*args, home=home)
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr
    # `ps` and `jobs` with no server running say so on stderr (status 2); a listing is cut by the pipe
    assert done.returncode in (PIPE_CLOSED_STATUS, 2), (done.returncode, done.stderr)


def test_search_json_into_a_closed_pipe(fake_hub: FakeHub, tmp_path: Path) -> None:
    fake_hub.add_repo("org/chat-GGUF", {"chat-Q4_K_M.gguf": b"GGUF" + b"\0" * 64})
    done = piped_into_a_closed_reader("search", "chat", "--json", home=tmp_path / "home")
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == PIPE_CLOSED_STATUS, done.stderr
