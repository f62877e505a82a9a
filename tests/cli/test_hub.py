"""`switchyard search`, `show` and `hub login|logout|status` as subprocesses, and the /api/hub routes of a
real `switchyard serve`, all against the fake hub."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO as ROOT
from tests.support.fakehub import FakeHub, gguf_repo_files
from tests.support.tinymodels import TinySpec, write_tiny_gguf

BIN = str(ROOT / ".venv" / "bin" / "switchyard")
TOKEN = "hf_testtoken"


def sy(*args: str, stdin: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"}
    full.update(env)
    return subprocess.run(
        [BIN, *args], input=stdin, capture_output=True, text=True, env=full, timeout=120, cwd=ROOT
    )


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("cli-ggufs")
    return {
        "Q4_K_M": write_tiny_gguf(d / "a.gguf", TinySpec(seed=3)),
        "Q8_0": write_tiny_gguf(d / "b.gguf", TinySpec(seed=4, n_embd=128)),
    }


def _populate(hub: FakeHub, ggufs: dict[str, Path]) -> None:
    hub.add_repo("org/tiny-GGUF", gguf_repo_files("tiny", ggufs), tags=["gguf"], downloads=900, likes=4)
    hub.add_repo("org/other-GGUF", gguf_repo_files("other", {"Q4_K_M": ggufs["Q4_K_M"]}), tags=["gguf"])
    hub.add_repo("acme/chat", {"README.md": b"# chat\n"}, tags=["safetensors"], downloads=50)
    hub.add_repo("meta/gated", gguf_repo_files("g", {"Q4_K_M": ggufs["Q4_K_M"]}), gated="manual")


def test_search_cli(fake_hub: FakeHub, ggufs: dict[str, Path]) -> None:
    _populate(fake_hub, ggufs)
    r = sy("search", "GGUF", "--format", "gguf", "--sort", "downloads", "--limit", "1")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:3] == ["MODEL", "FORMATS", "DOWNLOADS"]
    assert lines[1].split()[:3] == ["org/tiny-GGUF", "gguf", "900"]
    assert "more: add --page 2" in r.stdout
    r = sy("search", "GGUF", "--format", "gguf", "--limit", "1", "--page", "2", "--json")
    doc = json.loads(r.stdout)
    assert [m["id"] for m in doc["models"]] == ["org/other-GGUF"] and doc["next_page"] is None
    r = sy("search", "--author", "acme", "--json")
    assert [m["id"] for m in json.loads(r.stdout)["models"]] == ["acme/chat"]


def test_show_cli_with_fit(fake_hub: FakeHub, ggufs: dict[str, Path]) -> None:
    _populate(fake_hub, ggufs)
    r = sy("show", "org/tiny-GGUF", "--fit", "--card")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith(f"org/tiny-GGUF @ {fake_hub.repos['org/tiny-GGUF'].head.sha[:12]}")
    assert "license: apache-2.0" in out and "# tiny" in out
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith(("Q4_K_M", "Q8_0"))}
    assert set(rows) == {"Q4_K_M", "Q8_0"}
    for row in rows.values():
        assert "llama.cpp" in row and ("CPU only" in row or "fits on the GPU" in row or "partial" in row)
    r = sy("show", "org/tiny-GGUF", "--fit", "--quant", "Q8_0", "--json")
    doc = json.loads(r.stdout)
    assert list(doc["fit"]["quantizations"]) == ["Q8_0"]
    short = json.loads(sy("show", "org/tiny-GGUF:q8_0", "--json").stdout)
    assert list(short["fit"]["quantizations"]) == ["Q8_0"]
    verdict = doc["fit"]["quantizations"]["Q8_0"]
    assert (
        verdict["verdict"] in ("gpu", "partial", "cpu")
        and verdict["max_ctx"]
        and verdict["lane"] == "llama.cpp"
    )


def test_show_cli_errors(fake_hub: FakeHub, ggufs: dict[str, Path]) -> None:
    _populate(fake_hub, ggufs)
    r = sy("show", "nobody/nothing")
    assert r.returncode == 2 and "nobody/nothing was not found" in r.stderr
    r = sy("show", "meta/gated", "--fit")
    assert r.returncode == 0, r.stderr
    assert "gated: yes (manual approval)" in r.stdout
    assert f"accept its license on the hub page {fake_hub.url}/meta/gated" in r.stdout
    fake_hub.reset_counters()
    r = sy("search", "x", HF_HUB_OFFLINE="1")
    assert r.returncode == 2 and "offline" in r.stderr and "Local models keep working" in r.stderr
    r = sy("show", "org/tiny-GGUF", "--fit", HF_HUB_OFFLINE="1")
    assert r.returncode == 2 and "offline" in r.stderr
    assert fake_hub.api_calls == [] and fake_hub.requests == []
    assert sy("ls", HF_HUB_OFFLINE="1").returncode == 0  # local things keep working


def test_hub_login_status_logout(fake_hub: FakeHub, isolated_env: Path) -> None:
    r = sy("hub", "status")
    assert r.returncode == 0 and f"endpoint: {fake_hub.url}" in r.stdout and "token:    none" in r.stdout
    # a rejected token is not stored
    r = sy("hub", "login", "--token-stdin", stdin="hf_wrong\n")
    assert r.returncode == 2 and "rejected the token" in r.stderr
    # no keyring here: the token is kept nowhere unless --file is given, and the user is told so
    r = sy("hub", "login", "--token-stdin", stdin=TOKEN + "\n")
    assert r.returncode == 1 and "no system keyring is available here" in r.stderr and "--file" in r.stderr
    assert not (isolated_env / "hf_token").exists()
    r = sy("hub", "login", "--token-stdin", "--file", stdin=TOKEN + "\n")
    assert r.returncode == 0 and "logged in for tester" in r.stdout, r.stderr
    f = isolated_env / "hf_token"
    assert stat.S_IMODE(f.stat().st_mode) == 0o600
    for out in (r.stdout, r.stderr):
        assert TOKEN not in out
    r = sy("hub", "status")
    assert r.returncode == 0 and f"set, from {f} (valid, user tester)" in r.stdout and TOKEN not in r.stdout
    doc = json.loads(sy("hub", "status", "--json").stdout)
    assert doc["token"] == {"set": True, "source": "file", "problems": []} and doc["verified"] is True
    assert TOKEN not in json.dumps(doc)
    r = sy("hub", "status", HF_TOKEN="hf_other")
    assert r.returncode == 1 and "HF_TOKEN in the environment (REJECTED by the hub)" in r.stdout
    r = sy("hub", "logout")
    assert r.returncode == 0 and "file" in r.stdout and not f.exists()
    assert "token:    none" in sy("hub", "status").stdout


def _get(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_admin_api_routes(
    fake_hub: FakeHub, ggufs: dict[str, Path], start_server: Any, tmp_path: Path
) -> None:
    _populate(fake_hub, ggufs)
    server = start_server(tmp_path / "models")
    status, doc = _get(f"{server.url}/api/hub/search?q=GGUF&format=gguf&limit=1")
    assert status == 200 and [m["id"] for m in doc["models"]] == ["org/tiny-GGUF"] and doc["next_page"] == 2
    status, doc = _get(f"{server.url}/api/hub/search?q=GGUF&format=gguf&limit=1&page=2")
    assert [m["id"] for m in doc["models"]] == ["org/other-GGUF"] and doc["next_page"] is None
    status, doc = _get(f"{server.url}/api/hub/search?format=onnx")
    assert status == 400 and doc["error"]["param"] == "format" and "unknown format" in doc["error"]["message"]
    status, doc = _get(f"{server.url}/api/hub/models/org/tiny-GGUF")
    assert status == 200, doc
    names = {q["name"] for q in doc["quantizations"]}
    assert names == {"Q4_K_M", "Q8_0"} and set(doc["fit"]["quantizations"]) == names
    assert all(v["lane"] == "llama.cpp" for v in doc["fit"]["quantizations"].values())
    status, doc = _get(f"{server.url}/api/hub/models/org/tiny-GGUF?fit=false")
    assert status == 200 and doc["fit"] is None
    status, doc = _get(f"{server.url}/api/hub/models/nobody/nothing")
    assert status == 404 and doc["error"]["code"] == "hub_repo_not_found" and doc["error"]["type"]
    status, doc = _get(f"{server.url}/api/hub/status?verify=false")
    assert status == 200 and doc["endpoint"] == fake_hub.url and doc["token"]["set"] is False
