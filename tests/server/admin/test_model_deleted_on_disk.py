"""Issue 31, defect 20's loose end: a model whose file is deleted behind the server's back (not through
`switchyard rm`) leaves `switchyard ps`, Ollama's /api/ps and the lanes list, and its engine is stopped."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.conftest import REPO, ServerProcess, link_models


def test_a_model_deleted_on_disk_leaves_ps_and_the_lanes(
    start_server: Callable[..., ServerProcess], tmp_path: Path, model_store: Path
) -> None:
    models = link_models(tmp_path / "models", model_store / "tiny.gguf", model_store / "tiny2.gguf")
    s = start_server(models)
    for model in ("tiny", "tiny2"):
        r = httpx.post(s.url + "/api/models/" + model + "/load", json={}, timeout=120)
        assert r.is_success, r.text
    (models / "tiny.gguf").unlink()
    deadline = time.monotonic() + 30
    while True:
        lanes = [ln["id"] for ln in httpx.get(s.url + "/api/lanes", timeout=30).json()["lanes"]]
        ps = [m["name"] for m in httpx.get(s.url + "/api/ps", timeout=30).json()["models"]]
        if "tiny" not in lanes or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert "tiny" not in lanes and "tiny2" in lanes, lanes
    assert not any(n.startswith("tiny:") or n == "tiny" for n in ps) and ps, ps
    cli = subprocess.run(
        [sys.executable, "-m", "app", "ps", "--url", s.url],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    rows = [ln.split()[0] for ln in cli.stdout.splitlines()[1:] if ln.strip()]
    assert cli.returncode == 0 and rows == ["tiny2"], (cli.stdout, cli.stderr)
    r = httpx.post(  # the other model still serves
        s.api + "/chat/completions",
        json={"model": "tiny2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        timeout=120,
    )
    assert r.status_code == 200, r.text
