"""`switchyard jobs`, `jobs follow`, `pull --detach`, `eval --detach`, `updates` and `notify test` against
a real `switchyard serve` (a tiny llama.cpp lane for the eval) and the local test hub; `jobs` after the
server stopped lists what it saved."""

from __future__ import annotations

import hashlib
import hmac
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests.cli.test_pull import switchyard
from tests.conftest import link_models
from tests.support.fakehub import FakeHub

REPO = "org/cli-jobs-GGUF"


class _Hook(http.server.BaseHTTPRequestHandler):
    got: ClassVar[list[tuple[bytes, dict[str, str]]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.got.append((body, dict(self.headers)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def hook() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    _Hook.got = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    server.shutdown()


def test_detached_pull_followed_listed_and_kept(
    fake_hub: FakeHub, model_store: Path, start_server: Any, tmp_path: Path, hook: str
) -> None:
    fake_hub.add_repo(REPO, {"c-Q8_0.gguf": (model_store / "tiny.gguf").read_bytes()})
    r = switchyard("pull", f"{REPO}:Q8_0", "--detach", home=tmp_path / "nobody")
    assert r.returncode == 2 and "needs a running server" in r.stderr, r.stderr
    home = tmp_path / "home0"  # start_server's first home
    home.mkdir()
    notify = {"webhooks": [{"url": hook, "kind": "json", "secret": "k", "allow_local": True}]}
    (home / "settings.json").write_text(json.dumps({"notify": notify}))
    (tmp_path / "models").mkdir()
    server = start_server(tmp_path / "models")
    assert server.home == home

    r = switchyard("pull", f"{REPO}:Q8_0", "--detach", "--url", server.url, home=home)
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.split()[0]
    assert job_id.startswith("job-") and "jobs follow" in r.stdout
    r = switchyard("jobs", "follow", job_id, "--url", server.url, home=home)
    assert r.returncode == 0 and "completed" in r.stdout.splitlines()[-1], r.stdout + r.stderr
    listed = json.loads(switchyard("jobs", "--json", "--url", server.url, home=home).stdout)
    assert [(j["id"], j["state"]) for j in listed] == [(job_id, "completed")]

    r = switchyard("updates", "--check", "--all", "--url", server.url, home=home)
    assert r.returncode == 0 and f"{REPO}/c-Q8_0" in r.stdout and "up to date" in r.stdout, r.stdout

    r = switchyard("notify", "test", "--url", server.url, home=home)
    assert r.returncode == 0 and "HTTP 204" in r.stdout, r.stdout + r.stderr
    tests = [(b, h) for b, h in _Hook.got if json.loads(b)["event"] == "test"]
    body, headers = tests[0]
    assert headers["X-Switchyard-Signature"] == "sha256=" + hmac.new(b"k", body, hashlib.sha256).hexdigest()
    assert any(json.loads(b)["event"] == "job.completed" for b, _ in _Hook.got)  # the pull's end

    server.stop()
    r = switchyard("jobs", home=home)
    assert r.returncode == 0 and "no server is running" in r.stdout and job_id in r.stdout, r.stdout
    r = switchyard("updates", home=home)
    assert r.returncode == 0 and "every pulled model is up to date" in r.stdout, r.stdout


def test_detached_eval_is_a_job_listed_and_finished(
    model_store: Path, start_server: Any, tmp_path: Path
) -> None:
    models = link_models(tmp_path / "models", model_store / "tiny.gguf")
    suite = tmp_path / "pinned.json"
    case = {"id": "sum", "prompt": "17+25?", "expect": {"number": 42}}
    case["params"] = {"grammar": 'root ::= "42"', "max_tokens": 4}
    suite.write_text(json.dumps({"name": "pinned", "cases": [case]}))
    server = start_server(models)
    r = switchyard("eval", "tiny", "--suite", str(suite), "--detach", "--url", server.url, home=server.home)
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.split()[0]
    assert job_id.startswith("job-") and "jobs follow" in r.stdout, r.stdout
    listed = json.loads(switchyard("jobs", "--json", "--url", server.url, home=server.home).stdout)
    (mine,) = [j for j in listed if j["id"] == job_id]  # listed at once, whatever its state
    assert mine["kind"] == "eval" and mine["title"] == "eval pinned on tiny"
    r = switchyard("jobs", "follow", job_id, "--url", server.url, home=server.home)
    assert r.returncode == 0 and "completed" in r.stdout.splitlines()[-1], r.stdout + r.stderr
    listed = json.loads(switchyard("jobs", "--json", "--url", server.url, home=server.home).stdout)
    (done,) = [j for j in listed if j["id"] == job_id]
    assert done["state"] == "completed" and done["result"]["score"] == 1.0, done
    assert done["steps"][-1] == {"name": "eval", "done": 1, "total": 1}
    r = switchyard("eval", "tiny", "--history", "--json", "--url", server.url, home=server.home)
    assert r.returncode == 0 and json.loads(r.stdout)[0]["suite"] == "pinned", r.stdout
