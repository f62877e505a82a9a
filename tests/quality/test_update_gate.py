"""Update gates: a new revision from the local test hub is scored by a suite before it becomes current; one
that fails leaves the old revision current and its own files gone, one that passes is switched to. A real
`switchyard serve` runs the suite's cases on the candidate through a real llama.cpp lane."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from app.hub import cache_layout
from app.quality.store import EvalStore
from tests.cli.test_pull import cache_dir, switchyard
from tests.hub.test_download import sha
from tests.support.fakehub import FakeHub

REPO = "org/gated-GGUF"
MODEL = f"{REPO}/g-Q8_0"


def _suite(path: Path, answer: str) -> str:
    case = {"id": "sum", "prompt": "17+25?", "expect": {"number": 42}}
    case["params"] = {"grammar": f"root ::= {json.dumps(answer)}", "max_tokens": 8}
    path.write_text(json.dumps({"name": path.stem, "cases": [case]}))
    return str(path)


def _post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _models(url: str) -> set[str]:
    with urllib.request.urlopen(url + "/v1/models", timeout=30) as resp:
        return {m["id"] for m in json.loads(resp.read())["data"]}


def test_a_failing_revision_is_kept_out_and_a_passing_one_switched(
    fake_hub: FakeHub, model_store: Path, start_server: Any, tmp_path: Path
) -> None:
    fake_hub.add_repo(REPO, {"g-Q8_0.gguf": (model_store / "tiny.gguf").read_bytes()})
    old = fake_hub.repos[REPO].head.sha
    assert switchyard("pull", f"{REPO}:Q8_0").returncode == 0
    rd = cache_layout.repo_folder(cache_dir(), REPO)
    newer = (model_store / "tiny2.gguf").read_bytes()
    new = fake_hub.commit(REPO, {"g-Q8_0.gguf": newer})
    (tmp_path / "models").mkdir()
    server = start_server(tmp_path / "models")
    failing, passing = _suite(tmp_path / "wrong.yaml", "41"), _suite(tmp_path / "right.yaml", "42")

    r = switchyard("update", MODEL, "--eval", failing, "--min-score", "0.9", "--url", server.url, timeout=180)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "kept" in r.stdout and "0.000 against 0.9" in r.stdout and "[1/1] sum" in r.stdout
    assert cache_layout.read_ref(rd, "main") == old
    assert cache_layout.read_ref(rd, cache_layout.CANDIDATE_REF) is None
    assert not (rd / "snapshots" / new).exists() and not (rd / "blobs" / sha(newer)).exists()
    assert (rd / "snapshots" / old / "g-Q8_0.gguf").exists()  # the current revision is untouched
    assert MODEL in _models(server.url) and not any(m.endswith("@candidate") for m in _models(server.url))
    (run,) = EvalStore(server.home / "evals.db").runs()
    assert run.model == f"{MODEL}@candidate" and run.passed is False

    # a standing gate: the plain update route refuses to bypass it, `update MODEL` applies it
    r = switchyard("gate", MODEL, passing, "0.5", "--url", server.url, home=server.home)
    assert r.returncode == 0, r.stderr
    status, body = _post(server.url + "/api/hub/update", {"repo": REPO})
    assert status == 409 and body["error"]["code"] == "model_has_gate"
    listed = switchyard("gate", "--url", server.url, home=server.home)
    assert MODEL in listed.stdout and "0.5" in listed.stdout
    r = switchyard("update", MODEL, "--url", server.url, home=server.home, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"switched to {new[:12]}" in r.stdout and "1.000 against 0.5" in r.stdout
    assert cache_layout.read_ref(rd, "main") == new
    assert cache_layout.read_ref(rd, cache_layout.PREVIOUS_REF) == old
    assert (rd / "blobs" / sha(newer)).exists()
    # rollback works as before, and the gate can be removed
    r = switchyard("update", REPO, "--rollback", "--url", server.url)
    assert r.returncode == 0 and cache_layout.read_ref(rd, "main") == old, r.stderr
    r = switchyard("gate", MODEL, "--off", "--url", server.url, home=server.home)
    assert r.returncode == 0 and "removed" in r.stdout
    assert json.loads((server.home / "settings.json").read_text())["gates"] == {}


def test_gated_update_refusals(
    fake_hub: FakeHub, model_store: Path, start_server: Any, tmp_path: Path
) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "local.gguf").write_bytes((model_store / "tiny.gguf").read_bytes())
    server = start_server(tmp_path / "models")
    url = server.url + "/api/hub/gated-update"
    assert _post(url, {"model": "local"})[0] == 400  # no standing gate and no suite named
    status, body = _post(url, {"model": "local", "suite": "arithmetic", "min_score": 0.5})
    assert status == 400 and "not pulled from a hub" in body["error"]["message"]
    status, body = _post(url, {"model": "local@candidate", "suite": "arithmetic", "min_score": 0.5})
    assert status == 400 and "not its candidate" in body["error"]["message"]
    assert _post(url, {"model": "nope", "suite": "arithmetic", "min_score": 0.5})[0] == 404
    assert _post(url, {"model": "local", "suite": "arithmetic", "min_score": 3})[0] == 400
