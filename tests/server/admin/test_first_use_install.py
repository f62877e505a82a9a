"""Engines installed at first use (auto_install_engines): a request for an MLX model on a server that
cannot import MLX starts the install as a job; a plain request gets 503 with the job, a stream hears the
install in loading comments; a failed install says why, is not retried at once, and leaves what worked
before untouched (the loaded llama.cpp lane keeps answering from the same process). The real install from
the package index, followed by the answer, is in the slow tier."""

from __future__ import annotations

import json
import os
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import REPO, ServerProcess, running_server
from tests.support.mlxgen import write_mlx_llama
from tests.support.tinymodels import CHAT, write_tiny_gguf

MLX_MODEL = "mini-mlx"


@pytest.fixture
def hidden_mlx(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server started in this test cannot import MLX (tests/support/hidden_engines/sitecustomize.py)."""
    monkeypatch.setenv("PYTHONPATH", str(REPO / "tests" / "support" / "hidden_engines"))
    monkeypatch.setenv("SWITCHYARD_TEST_HIDE_MODULES", "mlx,mlx_lm")
    monkeypatch.setenv("SWITCHYARD_TEST_HIDE_FROM", sysconfig.get_paths()["purelib"])


def _models(root: Path) -> Path:
    root.mkdir()
    write_tiny_gguf(root / "tiny.gguf", CHAT)
    write_mlx_llama(root / MLX_MODEL)
    return root


@pytest.fixture
def failing_server(tmp_path: Path, hidden_mlx: None) -> Iterator[ServerProcess]:
    home = tmp_path / "home"
    home.mkdir()
    # an interpreter that does not exist: the install fails at once, offline, with a reason
    (home / "settings.json").write_text(json.dumps({"engine_python": str(tmp_path / "no-such-python3")}))
    with running_server(home, _models(tmp_path / "models")) as s:
        yield s


def _chat(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, **extra}


def _stream(url: str, model: str) -> tuple[list[str], list[dict[str, Any]]]:
    """(the comment lines, the data events) of a streamed chat."""
    comments, events = [], []
    with httpx.stream("POST", url + "/v1/chat/completions", json=_chat(model, stream=True), timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith(":"):
                comments.append(line)
            elif line.startswith("data: :"):
                continue  # mlx_lm.server's prompt-progress keepalive, framed as data (upstream's own)
            elif line.startswith("data:") and line.strip() != "data: [DONE]":
                try:
                    events.append(json.loads(line[5:]))
                except ValueError:
                    raise AssertionError(f"not a JSON event: {line!r}") from None
    return comments, events


def test_install_job_503_stream_progress_and_a_failure_that_changes_nothing(
    failing_server: ServerProcess,
) -> None:
    url = failing_server.url
    loaded = httpx.post(url + "/v1/chat/completions", json=_chat("tiny"), timeout=60)
    assert loaded.status_code == 200, loaded.text
    before = {ln["id"]: ln["pid"] for ln in httpx.get(url + "/api/lanes").json()["lanes"]}

    first = httpx.post(url + "/v1/chat/completions", json=_chat(MLX_MODEL), timeout=60)
    assert first.status_code == 503, first.text
    err = first.json()["error"]
    assert err["code"] == "engine_installing" and "MLX" in err["message"], err
    job = err["message"].split("(job ", 1)[1].split(":", 1)[0]
    assert "retry in about" in err["message"]

    comments, events = _stream(url, MLX_MODEL)  # joins the running job, or hears its failure
    failed = [e for e in events if "error" in e]
    assert failed and failed[0]["error"]["code"] == "engine_install_failed", events
    assert "no-such-python3" in failed[0]["error"]["message"]
    assert "engine install mlx" in failed[0]["error"]["message"]
    assert all("installing MLX" in c for c in comments if "loading" in c), comments

    detail = httpx.get(f"{url}/api/engines/jobs/{job}").json()
    assert detail["state"] == "failed" and "no-such-python3" in detail["error"]
    jobs = httpx.get(url + "/api/jobs").json()["jobs"]
    assert any(j["kind"] == "engine_install" and j["state"] == "failed" for j in jobs), jobs

    again = httpx.post(url + "/v1/chat/completions", json=_chat(MLX_MODEL), timeout=60)
    assert again.status_code == 503 and again.json()["error"]["code"] == "engine_install_failed"
    loaded_by_admin = httpx.post(f"{url}/api/models/{MLX_MODEL}/load", timeout=60)  # the dashboard's Load
    assert loaded_by_admin.status_code == 503, loaded_by_admin.text
    assert loaded_by_admin.json()["error"]["code"] == "engine_install_failed"

    # what worked before: the llama.cpp lane, the same process, still answering
    after = {ln["id"]: ln["pid"] for ln in httpx.get(url + "/api/lanes").json()["lanes"]}
    assert after["tiny"] == before["tiny"] is not None
    assert httpx.post(url + "/v1/chat/completions", json=_chat("tiny"), timeout=60).status_code == 200
    engines = {e["engine"]: e for e in httpx.get(url + "/api/engines").json()["engines"]}
    assert not engines["mlx"]["installed"]

    # the setting off: refused with what to run, no job started
    put = httpx.put(url + "/api/settings", json={"auto_install_engines": False}, timeout=30)
    assert put.status_code == 200, put.text
    off = httpx.post(url + "/v1/chat/completions", json=_chat(MLX_MODEL), timeout=60)
    assert off.status_code == 503 and off.json()["error"]["code"] == "engine_unavailable", off.text


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_mlx_is_installed_at_first_use_and_answers(tmp_path: Path, hidden_mlx: None) -> None:
    """The real install (mlx-lm and mlx[cpu] from the package index into an engine environment), heard as
    loading comments by a streaming client, then the answer from the new environment."""
    home = tmp_path / "home"
    with running_server(home, _models(tmp_path / "models")) as s:
        t0 = time.monotonic()
        comments, events = _stream(s.url, MLX_MODEL)
        took = time.monotonic() - t0
        assert not [e for e in events if "error" in e], events
        assert any("installing MLX" in c for c in comments), comments[:5]
        text = "".join(
            (e["choices"][0].get("delta") or {}).get("content") or "" for e in events if e.get("choices")
        )
        assert text, events
        engines = {e["engine"]: e for e in httpx.get(s.url + "/api/engines").json()["engines"]}
        assert engines["mlx"]["installed"], engines["mlx"]
        print(f"first-use MLX install and answer: {took:.0f} s")
        again = httpx.post(s.url + "/v1/chat/completions", json=_chat(MLX_MODEL), timeout=120)
        assert again.status_code == 200, again.text
    assert os.path.isdir(home / "engines")
