"""Remote lanes for real: a second `switchyard serve` (keys required, tiny models) registered as remote `home`
of the first, driven through the first with the official openai, anthropic and ollama clients and the CLI.
A small aiohttp app in the test, registered as remote `rec`, records what a remote is sent for an upload."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import io
import json
import math
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import wave
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anthropic
import ollama
import openai
import pytest
from aiohttp import web

from app.cli.remote import doctor_rows
from app.core.paths import Paths
from app.core.secrets import KeyStore
from tests.conftest import REPO, ServerProcess, link_models, running_server
from tests.support.whispergen import write_random_whisper

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
        write_random_whisper(models_b / "whisper-rand.bin")  # ≈ 4 MB of random weights: loads in a second
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
    assert {m["id"] for m in ls["remote_models"]} == {"home/tiny", "home/embed", "home/whisper-rand"}
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


def remote_saw(pair: Pair, route: str) -> list[str]:
    """The remote's access-log lines for `route`, waiting a little: it logs a stream once it closed it."""
    deadline = time.monotonic() + 10
    while (
        not (seen := [ln for ln in pair.b.stderr if f"POST {route} " in ln]) and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    return seen


def test_anthropic_messages_through_the_remote(pair: Pair) -> None:
    client = anthropic.Anthropic(base_url=pair.a.url, api_key=pair.other, max_retries=0, timeout=60)
    ask: dict[str, Any] = {
        "model": "home/tiny",
        "max_tokens": 32,
        "messages": [{"role": "user", "content": "q"}],
        "extra_body": {"grammar": GRAMMAR},
    }
    m = client.messages.create(**ask)
    assert m.model == "home/tiny" and m.role == "assistant" and m.stop_reason == "end_turn"
    assert [(b.type, getattr(b, "text", None)) for b in m.content] == [("text", "the answer is 42")]
    assert m.usage.input_tokens > 0 and m.usage.output_tokens > 0
    with client.messages.stream(**ask) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[:2] == ["message_start", "content_block_start"] and kinds[-3:] == [
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert "content_block_delta" in kinds and set(kinds) <= {
        "message_start",
        "content_block_start",
        "content_block_delta",
        "text",
        "content_block_stop",
        "message_delta",
        "message_stop",
    }
    assert final.content[0].type == "text" and final.content[0].text == "the answer is 42"
    assert final.stop_reason == "end_turn" and final.usage.input_tokens == m.usage.input_tokens
    assert final.usage.output_tokens > 0
    assert all("client=upstream" in ln for ln in remote_saw(pair, "/v1/chat/completions"))


def test_count_tokens_of_a_remote_model_is_what_the_remote_counts(pair: Pair) -> None:
    messages: list[Any] = [{"role": "user", "content": "how many tokens is this prompt?"}]
    through_a = anthropic.Anthropic(base_url=pair.a.url, api_key=pair.other, max_retries=0, timeout=60)
    n = through_a.messages.count_tokens(model="home/tiny", messages=messages).input_tokens
    assert isinstance(n, int) and n > 0
    # the remote's own count for its local model: its template applied, then its tokenizer (another path)
    at_b = anthropic.Anthropic(base_url=pair.b.url, api_key=pair.upstream, max_retries=0, timeout=60)
    assert n == at_b.messages.count_tokens(model="tiny", messages=messages).input_tokens
    answer = through_a.messages.create(model="home/tiny", max_tokens=2, messages=messages)
    assert answer.usage.input_tokens == n
    longer = [{"role": "user", "content": "how many tokens is this prompt, now that it is longer?"}]
    assert through_a.messages.count_tokens(model="home/tiny", messages=longer).input_tokens > n


def test_anthropic_errors_from_the_remote_keep_anthropics_shape(pair: Pair) -> None:
    client = anthropic.Anthropic(base_url=pair.a.url, api_key=pair.other, max_retries=0, timeout=60)
    hi: list[Any] = [{"role": "user", "content": "q"}]
    with pytest.raises(anthropic.BadRequestError) as exc:
        client.messages.create(
            model="home/tiny", max_tokens=2, messages=hi, extra_body={"grammar": "root ::= ("}
        )
    assert exc.value.body["type"] == "error"  # type: ignore[index]
    assert exc.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "remote 'home' (for 'home/tiny') refused the request" in exc.value.message
    with pytest.raises(anthropic.BadRequestError) as exc:
        client.messages.create(model="home/embed", max_tokens=2, messages=hi)
    assert "embedding model on remote 'home'" in exc.value.message


def test_responses_through_the_remote(pair: Pair, client: openai.OpenAI) -> None:
    r = client.responses.create(
        model="home/tiny", input="q", max_output_tokens=32, extra_body={"grammar": GRAMMAR}
    )
    assert r.status == "completed" and r.model == "home/tiny" and r.output_text == "the answer is 42"
    assert r.usage is not None and r.usage.input_tokens > 0 and r.usage.output_tokens > 0
    events = list(
        client.responses.create(
            model="home/tiny", input="q", max_output_tokens=32, stream=True, extra_body={"grammar": GRAMMAR}
        )
    )
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "the answer is 42"
    done = events[-1].response  # type: ignore[union-attr]
    assert done.output_text == "the answer is 42" and done.usage is not None and done.usage.input_tokens > 0
    with pytest.raises(openai.BadRequestError) as exc:
        client.responses.create(model="home/tiny", input="q", extra_body={"grammar": "root ::= ("})
    assert exc.value.code == "remote_http_400" and "remote 'home' (for 'home/tiny')" in str(exc.value)
    assert exc.value.body["source"] == "remote"  # type: ignore[index]


def test_ollama_show_says_what_is_known_and_ps_lists_only_local(pair: Pair) -> None:
    o = ollama.Client(host=pair.a.url, timeout=60)
    shown = o.show("home/tiny")
    assert shown.details is not None and shown.details.format == "remote" and shown.details.family is None
    assert shown.modelinfo == {"general.name": "tiny", "switchyard.remote": "home", "switchyard.kind": "chat"}
    assert shown.capabilities == ["completion"] and shown.template is None
    assert o.show("home/embed:latest").capabilities == ["embedding"]
    with pytest.raises(ollama.ResponseError) as exc:
        o.show("home/not-there")
    assert exc.value.status_code == 404 and "remote 'home'" in str(exc.value)
    answer = o.chat(
        model="home/tiny:latest", messages=[{"role": "user", "content": "q"}], options={"num_predict": 2}
    )
    assert answer.done and answer.model == "home/tiny:latest"  # the remote was asked for its `tiny`
    assert not [m for m in o.ps().models if (m.model or "").startswith("home/")]  # the remote holds it


def wav_tone(seconds: float = 1.0, rate: int = 16000) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(
            b"".join(
                struct.pack("<h", int(9000 * math.sin(2 * math.pi * 440 * i / rate)))
                for i in range(int(seconds * rate))
            )
        )
    return buf.getvalue()


def test_transcription_and_translation_through_the_remote(pair: Pair, client: openai.OpenAI) -> None:
    pytest.importorskip("pywhispercpp")  # the remote's whisper.cpp lane
    audio = wav_tone()
    t = client.audio.transcriptions.create(
        model="home/whisper-rand", file=("a.wav", audio), language="en", response_format="verbose_json"
    )
    assert isinstance(t.text, str) and t.duration is not None and abs(float(t.duration) - 1.0) < 0.1
    tr = client.audio.translations.create(model="home/whisper-rand", file=("a.wav", audio))
    assert isinstance(tr.text, str)
    for route in ("/v1/audio/transcriptions", "/v1/audio/translations"):
        seen = remote_saw(pair, route)
        assert seen and all("client=upstream" in ln and "status=200" in ln for ln in seen)
    with pytest.raises(openai.BadRequestError) as exc:
        client.audio.transcriptions.create(model="home/tiny", file=("a.wav", audio))
    assert exc.value.code == "capability_missing"


@contextlib.contextmanager
def recording_peer() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A stand-in remote on its own thread: lists one transcription model and records each upload."""
    seen: list[dict[str, Any]] = []

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "rec-model", "kind": "transcription"}]})

    async def upload(request: web.Request) -> web.Response:
        form = await request.post()
        upload = form["file"]
        assert isinstance(upload, web.FileField)
        seen.append(
            {
                "headers": {k.lower(): v for k, v in request.headers.items()},
                "fields": {k: v for k, v in form.items() if isinstance(v, str)},
                "file": (upload.filename, upload.content_type, upload.file.read()),
            }
        )
        return web.json_response({"text": "recorded"})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/audio/transcriptions", upload)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    port = free_port()
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}/v1", seen
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_an_upload_reaches_the_remote_with_its_model_name_and_key_only(pair: Pair) -> None:
    peer_key = "sy-rec-0123456789-peer-key-peer-key"
    # bytes that a careless multipart rebuild would damage: line ends, a boundary-like line, NULs
    audio = b"RIFF\r\n--\r\n\x00\xff\r" + bytes(range(256)) * 40 + b"\n\r\n"
    with recording_peer() as (url, seen):
        status, doc = api(pair, "POST", "/api/remotes", {"name": "rec", "url": url, "api_key": peer_key})
        assert status == 201 and doc["state"] == "ready", doc
        try:
            client = openai.OpenAI(
                base_url=pair.a.api,
                api_key=pair.other,
                max_retries=0,
                timeout=30,
                default_headers={"X-Client-Secret": "stays-here"},
            )
            t = client.audio.transcriptions.create(
                model="rec/rec-model",
                file=("voice memo é.wav", audio, "audio/wav"),
                language="en",
                prompt="línea uno",
                temperature=0.25,
            )
        finally:
            api(pair, "DELETE", "/api/remotes/rec")
    assert t.text == "recorded" and len(seen) == 1
    got = seen[0]
    assert got["file"] == ("voice memo é.wav", "audio/wav", audio)
    assert got["fields"] == {
        "model": "rec-model",
        "language": "en",
        "prompt": "línea uno",
        "temperature": "0.25",
    }
    assert got["headers"]["authorization"] == f"Bearer {peer_key}"
    assert "x-client-secret" not in got["headers"] and pair.other not in json.dumps(got["headers"])


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
