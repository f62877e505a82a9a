"""Issue 31, defect 3: `search` and `show` use the running server's hub, as `pull` and `update` do, so a
repository `search` finds is one `pull` can fetch (before: search used the shell's HF_ENDPOINT)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO, ServerProcess
from tests.support.fakehub import FakeHub


def test_search_show_and_pull_use_the_servers_hub(
    fake_hub: FakeHub, tmp_path: Path, model_store: Path
) -> None:
    fake_hub.add_repo(
        "org/found-GGUF", {"found-Q8_0.gguf": (model_store / "tiny.gguf").read_bytes()}, tags=["gguf"]
    )
    home = tmp_path / "home"
    server = ServerProcess(home, tmp_path / "models").wait_ready()  # started with HF_ENDPOINT: the fake hub
    try:
        # this shell names a hub that does not answer; the server was started naming the one that does
        env = dict(os.environ, SWITCHYARD_HOME=str(home), HF_ENDPOINT="http://127.0.0.1:9")

        def sy(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "app", *args],
                cwd=REPO,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )

        found = sy("search", "found", "--json")
        assert found.returncode == 0, found.stderr
        assert [m["id"] for m in json.loads(found.stdout)["models"]] == ["org/found-GGUF"]
        shown = sy("show", "org/found-GGUF")
        assert shown.returncode == 0 and "Q8_0" in shown.stdout, shown.stdout + shown.stderr
        pulled = sy("pull", "org/found-GGUF:Q8_0")
        assert pulled.returncode == 0, pulled.stdout + pulled.stderr
        local = sy("search", "found", "--local")  # this process: the shell's hub, named when it fails
        assert local.returncode == 2 and "127.0.0.1:9" in local.stderr, local.stderr
    finally:
        server.stop()
