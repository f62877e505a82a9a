"""Issue 31, defect 8: a remote that is this server itself is refused, and a remote's own remotes are
never listed (before: each health check nested another `self/` level into /v1/models)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, ServerProcess, link_models, running_server


def cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SWITCHYARD_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "app", *args], capture_output=True, text=True, timeout=60, env=env, cwd=REPO
    )


def model_ids(server: ServerProcess) -> list[str]:
    with urllib.request.urlopen(server.api + "/models", timeout=30) as r:
        return [m["id"] for m in json.loads(r.read())["data"]]


@pytest.fixture(scope="module")
def pair(
    tmp_path_factory: pytest.TempPathFactory, model_store: Path
) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    base = tmp_path_factory.mktemp("loops")
    for home in ("home-a", "home-b"):
        (base / home).mkdir()
        (base / home / "settings.json").write_text(json.dumps({"remote_check_s": 0.3}))
    models_a = link_models(base / "models-a", model_store / "tiny.gguf")
    (base / "models-b").mkdir()
    with (
        running_server(base / "home-a", models_a) as a,
        running_server(base / "home-b", base / "models-b") as b,
    ):
        yield a, b


def test_a_remote_that_is_this_server_is_refused(pair: tuple[ServerProcess, ServerProcess]) -> None:
    a, _ = pair
    added = cli(a.home, "remote", "add", "self", a.api)
    assert added.returncode == 2, added.stdout + added.stderr
    assert "is this server itself" in added.stderr, added.stderr
    time.sleep(1.0)  # several check rounds
    assert model_ids(a) == ["tiny"]
    assert "self" not in cli(a.home, "remote", "ls").stdout


def test_a_remotes_remotes_are_not_listed(pair: tuple[ServerProcess, ServerProcess]) -> None:
    a, b = pair
    assert cli(b.home, "remote", "add", "a", a.api).returncode == 0  # b lists a/tiny
    assert cli(a.home, "remote", "add", "b", b.api).returncode == 0  # a lists b's models, but not b's remotes
    time.sleep(1.0)  # several check rounds on both sides
    assert "a/tiny" in model_ids(b)
    ids = model_ids(a)
    assert ids == ["tiny"], ids  # before: b/a/tiny, and after a round more, b/a/b/... nesting
