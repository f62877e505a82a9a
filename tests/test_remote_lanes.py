"""Remote lanes for real: a second `switchyard serve` (keys required, tiny models) registered as remote `home`
of the first, driven through the first with the official openai and ollama clients and the CLI."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import ollama
import openai
import pytest

from app.cli_remote import doctor_rows
from app.core.paths import Paths
from app.core.secrets import KeyStore
from tests.conftest import REPO, ServerProcess, link_models, running_server

GRAMMAR = 'root ::= "the answer is 42"'
WRONG_KEY = "sy-00000000-wrong-key-wrong-key-wrong-key"


@dataclass(frozen=True)
class Pair:
    a: ServerProcess  # the gateway the tests talk to
    b: ServerProcess  # the remote: keys required
    home_a: Path
    upstream: str  # B's key for A (registered with the remote)
    other: str  # another key B accepts: the local client sends it to A, and A must not pass it on


def cli(home: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "SWITCHYARD_HOME": str(home),
        "PYTHON_KEYRING_BACKEND": "keyring.backends.fail.Keyring",
    }
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=REPO,
    )


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Iterator[Pair]:
    base = tmp_path_factory.mktemp("remote")
    home_b, home_a = base / "home-b", base / "home-a"
    home_b.mkdir()
    (home_b / "settings.json").write_text(json.dumps({"require_api_key": True}))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHON_KEYRING_BACKEND", "keyring.backends.fail.Keyring")  # headless: no keyring
        keys = KeyStore.at(Paths(home_b))
        upstream, other = keys.create("upstream").secret.reveal(), keys.create("other").secret.reveal()
        models_b = link_models(base / "models-b", model_store / "tiny.gguf", model_store / "embed.gguf")
        (base / "models-a").mkdir()
        with running_server(home_b, models_b) as b, running_server(home_a, base / "models-a") as a:
            added = cli(home_a, "remote", "add", "home", b.api, "--api-key-stdin", stdin=upstream + "\n")
            assert added.returncode == 0, added.stderr
            assert (
                "added remote home" in added.stdout
                and "ready" in added.stdout
                and "home/tiny" in added.stdout
            )
            assert "memory only" in added.stderr  # no keyring here: the server holds the key for its session
            yield Pair(a, b, home_a, upstream, other)


@pytest.fixture
def client(pair: Pair) -> openai.OpenAI:
    # the local client's own key is one the remote would accept: forwarding it would show on the remote
    return openai.OpenAI(base_url=pair.a.api, api_key=pair.other, max_retries=0, timeout=60)


def api(pair: Pair, method: str, path: str, body: dict[str, object] | None = None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        pair.a.url + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_remote_models_are_listed_like_local_ones(pair: Pair, client: openai.OpenAI) -> None:
    models = {m.id: m for m in client.models.list()}
    assert models["home/tiny"].owned_by == "remote:home" and models["home/tiny"].model_extra["kind"] == "chat"
    assert models["home/embed"].model_extra["kind"] == "embedding"
    assert models["home/tiny"].model_extra["state"] == "ready"
    tags = {m.model for m in ollama.Client(host=pair.a.url, timeout=30).list().models}
    assert {"home/tiny:latest", "home/embed:latest"} <= tags
    ls = json.loads(cli(pair.home_a, "ls", "--json").stdout)
    assert {m["id"] for m in ls["remote_models"]} == {"home/tiny", "home/embed"}
    ps = cli(pair.home_a, "ps")
    assert ps.returncode == 0 and "remotes:" in ps.stdout and "home/tiny" in ps.stdout
    listed = json.loads(cli(pair.home_a, "remote", "ls", "--json").stdout)["remotes"]
    home = next(r for r in listed if r["name"] == "home")
    assert home["state"] == "ready" and home["key"] == {"set": True, "source": "session", "kept": "session"}
    rows = {r["name"]: r for r in doctor_rows(Paths(pair.home_a))}
    assert rows["home"]["state"] == "ready"


def test_chat_and_stream_go_through_with_the_remotes_key(pair: Pair, client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="home/tiny", messages=[{"role": "user", "content": "q"}], extra_body={"grammar": GRAMMAR}
    )
    assert r.choices[0].message.content == "the answer is 42"
    stream = client.chat.completions.create(
        model="home/tiny",
        messages=[{"role": "user", "content": "q"}],
        stream=True,
        extra_body={"grammar": GRAMMAR},
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "the answer is 42"
    # the remote logs a stream once it has closed it, which can be just after our client read the end
    deadline = time.monotonic() + 10
    while len(seen := [ln for ln in pair.b.stderr if "POST /v1/chat/completions" in ln]) < 2:
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(seen) >= 2 and all("client=upstream" in ln for ln in seen)  # the remote saw its key only
    assert not any("client=other" in ln for ln in pair.b.stderr)  # the local client's key stayed here


def test_embeddings_and_ollama_chat_through_the_remote(pair: Pair, client: openai.OpenAI) -> None:
    e = client.embeddings.create(model="home/embed", input=["one", "two"])
    assert len(e.data) == 2 and len(e.data[0].embedding) == 64
    answer = ollama.Client(host=pair.a.url, timeout=60).chat(
        model="home/tiny", messages=[{"role": "user", "content": "q"}], options={"num_predict": 3}
    )
    assert answer.done and answer.message.role == "assistant"
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model="home/embed", messages=[{"role": "user", "content": "q"}])
    assert exc.value.code == "capability_missing" and "remote 'home'" in str(exc.value)


def test_wrong_or_missing_remote_key_is_a_clear_502(pair: Pair, client: openai.OpenAI) -> None:
    status, doc = api(
        pair, "POST", "/api/remotes", {"name": "badkey", "url": pair.b.api, "api_key": WRONG_KEY}
    )
    assert status == 201 and doc["state"] == "unauthorized" and "refused the API key" in doc["error"]
    with pytest.raises(openai.APIStatusError) as exc:
        client.chat.completions.create(model="badkey/tiny", messages=[{"role": "user", "content": "q"}])
    assert exc.value.status_code == 502 and exc.value.code == "remote_auth_failed"
    assert "remote 'badkey' refused the API key" in str(exc.value) and "--api-key-stdin" in str(exc.value)
    status, doc = api(pair, "POST", "/api/remotes", {"name": "nokey", "url": pair.b.api})
    assert status == 201 and doc["state"] == "unauthorized"
    with pytest.raises(openai.APIStatusError) as exc:
        client.chat.completions.create(model="nokey/tiny", messages=[{"role": "user", "content": "q"}])
    assert exc.value.status_code == 502 and "needs an API key" in str(exc.value)
    for name in ("badkey", "nokey"):
        assert cli(pair.home_a, "remote", "rm", name).returncode == 0
    assert "badkey/tiny" not in {m.id for m in client.models.list()}


def test_a_remote_that_is_down_answers_503_naming_it(pair: Pair, client: openai.OpenAI) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    added = cli(pair.home_a, "remote", "add", "gone", url, "--model", "tiny", "--json")
    assert added.returncode == 0 and json.loads(added.stdout)["state"] == "unreachable"
    assert {m.id: m.model_extra["state"] for m in client.models.list()}["gone/tiny"] == "unreachable"
    for stream in (False, True):
        with pytest.raises(openai.APIStatusError) as exc:
            client.chat.completions.create(
                model="gone/tiny", messages=[{"role": "user", "content": "q"}], stream=stream
            )
        err = exc.value
        assert err.status_code == 503 and err.code == "remote_unreachable"
        assert (
            "remote 'gone'" in str(err) and "does not answer" in str(err) and "remote check gone" in str(err)
        )
    check = cli(pair.home_a, "remote", "check", "gone")
    assert check.returncode == 1 and "unreachable" in check.stdout
    assert cli(pair.home_a, "remote", "rm", "gone").returncode == 0


def test_state_changes_are_events(pair: Pair) -> None:
    host = urlsplit(pair.a.url)
    conn = http.client.HTTPConnection(host.hostname or "127.0.0.1", host.port, timeout=10)
    conn.request("GET", "/api/events")
    events = conn.getresponse()
    assert events.readline().startswith(b"event: snapshot")
    status, _ = api(
        pair, "POST", "/api/remotes", {"name": "flaky", "url": f"http://127.0.0.1:{free_port()}/v1"}
    )
    assert status == 201
    deadline, found = time.monotonic() + 10, None
    while found is None and time.monotonic() < deadline:
        line = events.readline()
        if line.startswith(b"data:") and b'"remote": "flaky"' in line:
            found = json.loads(line[5:])
    conn.close()
    assert found is not None and found["state"] == "unreachable" and found["previous"] == "checking"
    api(pair, "DELETE", "/api/remotes/flaky")


def test_keys_never_show_in_logs_files_or_answers(pair: Pair) -> None:
    _, listed = api(pair, "GET", "/api/remotes")
    seen = [
        json.dumps(listed),
        cli(pair.home_a, "remote", "ls", "--json").stdout,
        (pair.home_a / "remotes.json").read_text(),
        pair.a.stderr_text(),
        "\n".join(pair.a.stdout),
        pair.b.stderr_text(),
    ]
    seen += [p.read_text(errors="replace") for p in (pair.home_a / "logs").rglob("*") if p.is_file()]
    for text in seen:
        assert pair.upstream not in text and WRONG_KEY not in text
    assert '"source": "session"' in seen[0]  # where the key is, said without it
