"""Request limits and request safety against a real `switchyard serve` with a real llama.cpp lane.

Body size (413 in each surface's shape), prompt length against the lane's per-request context (400
context_length_exceeded, agreeing with llama.cpp at the boundary), concurrent requests per client (429
with Retry-After), slow-loris heads and slow bodies, path traversal in model names, and no shell anywhere.
"""

from __future__ import annotations

import http.client
import json
import re
import shutil
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import ollama
import openai
import pytest

from app.core.errors import SettingsError
from app.core.settings import Settings
from app.server.gateway.core import PER_MESSAGE_ALLOWANCE, TEMPLATE_ALLOWANCE, may_exceed
from tests.conftest import REPO, ServerProcess, link_models, wait_gone

SETTINGS = {"max_body_mib": 1, "max_concurrent_per_client": 1, "idle_timeout_s": 1.0, "body_timeout_s": 2.0}
SLOT_CTX = 2048  # the tiny model: 4 slots of its trained 2048 tokens (ctx_size 8192)
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("limits")
    models = link_models(base / "lib" / "models", model_store / "tiny.gguf")
    # a real model just outside the library, and one folder further out: names must never reach them
    shutil.copy(model_store / "tiny2.gguf", base / "lib" / "outside.gguf")
    shutil.copy(model_store / "tiny2.gguf", base / "secret.gguf")
    home = base / "home"
    home.mkdir()
    (home / "settings.json").write_text(json.dumps(SETTINGS))
    s = ServerProcess(home, models).wait_ready()
    yield s
    pids = s.engine_pids()
    s.stop()
    wait_gone(pids, 5)


def call(
    server: ServerProcess, path: str, body: Any = None, *, method: str = "POST", raw: bytes | None = None
) -> tuple[int, Any, dict[str, str]]:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(
        server.url + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read() or b"null"), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null"), dict(e.headers)


def chat(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": 1, **extra}


def address(server: ServerProcess) -> tuple[str, int]:
    u = urllib.parse.urlsplit(server.url)
    assert u.hostname and u.port
    return u.hostname, u.port


# ---- body size -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "shape"),
    [("/v1/chat/completions", "openai"), ("/v1/messages", "anthropic"), ("/api/chat", "ollama")],
)
def test_body_over_the_limit_is_413_in_the_surfaces_shape(
    server: ServerProcess, path: str, shape: str
) -> None:
    big = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "x" * (MIB + 1000)}]})
    status, err, _ = call(server, path, raw=big.encode())
    assert status == 413
    if shape == "openai":
        assert err["error"]["code"] == "too_large" and err["error"]["type"] == "invalid_request_error"
        message = err["error"]["message"]
    elif shape == "anthropic":
        assert err["type"] == "error" and err["error"]["type"] == "request_too_large"  # as Anthropic says it
        message = err["error"]["message"]
    else:
        message = err["error"]
    assert "1 MiB" in message and "max_body_mib" in message


def test_chunked_body_over_the_limit_is_413_and_one_under_is_read(server: ServerProcess) -> None:
    def send(size: int) -> tuple[int, dict]:  # type: ignore[type-arg]
        piece = b"x" * 65536
        n = size // len(piece)

        def chunks() -> Iterator[bytes]:  # no Content-Length: only reading can tell the size
            yield b'{"model": "nope", "messages": [{"role": "user", "content": "'
            yield from (piece for _ in range(n))
            yield b'"}]}'

        conn = http.client.HTTPConnection(*address(server), timeout=30)
        try:
            conn.request("POST", "/v1/chat/completions", body=chunks(), encode_chunked=True)
            r = conn.getresponse()
            return r.status, json.loads(r.read())
        finally:
            conn.close()

    status, err = send(MIB + 65536)
    assert status == 413 and err["error"]["code"] == "too_large"
    status, err = send(MIB - 2 * 65536)
    assert status == 404 and err["error"]["code"] == "model_not_found"  # read whole, then judged


# ---- prompt length -------------------------------------------------------------------------------
def test_prompt_over_the_context_is_400_with_the_counts(server: ServerProcess) -> None:
    status, err, _ = call(server, "/v1/chat/completions", chat("z " * 5000))
    assert status == 400
    e = err["error"]
    assert e["code"] == "context_length_exceeded" and e["param"] == "messages" and e["source"] == "gateway"
    n = int(re.search(r"the prompt is (\d+) tokens", e["message"]).group(1))  # type: ignore[union-attr]
    assert n > SLOT_CTX
    assert (
        f"{SLOT_CTX} tokens per request" in e["message"]
        and "8192 tokens shared by 4 parallel" in e["message"]
    )
    assert "ctx_size" in e["message"] and "parallel" in e["message"]
    status, err, _ = call(
        server, "/v1/completions", {"model": "tiny", "prompt": "z " * 3000, "max_tokens": 1}
    )
    assert status == 400 and err["error"]["code"] == "context_length_exceeded"
    assert err["error"]["param"] == "prompt"


def _says_the_context(message: str) -> None:
    n = int(re.search(r"the prompt is (\d+) tokens", message).group(1))  # type: ignore[union-attr]
    assert n > SLOT_CTX and f"{SLOT_CTX} tokens per request" in message and "ctx_size" in message


def test_prompt_over_the_context_on_each_surface_with_its_official_client(server: ServerProcess) -> None:
    long = "z " * 5000
    an = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
    for stream in (False, True):  # a loaded lane: refused before any event, as a plain 400
        with pytest.raises(anthropic.BadRequestError) as a_exc:
            an.messages.create(
                model="tiny", max_tokens=1, messages=[{"role": "user", "content": long}], stream=stream
            )
        assert a_exc.value.status_code == 400 and isinstance(a_exc.value.body, dict)
        assert a_exc.value.body["type"] == "error"
        assert a_exc.value.body["error"]["type"] == "invalid_request_error"
        _says_the_context(a_exc.value.body["error"]["message"])
    oa = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError) as o_exc:
        oa.responses.create(model="tiny", input=long, max_output_tokens=16)
    assert isinstance(o_exc.value.body, dict) and o_exc.value.body["code"] == "context_length_exceeded"
    assert o_exc.value.body["param"] == "input"
    _says_the_context(o_exc.value.body["message"])
    ol = ollama.Client(host=server.url, timeout=60)
    calls = [
        lambda: ol.chat(model="tiny", messages=[{"role": "user", "content": long}]),
        lambda: list(ol.chat(model="tiny", messages=[{"role": "user", "content": long}], stream=True)),
        lambda: ol.generate(model="tiny", prompt=long),
        lambda: ol.generate(model="tiny", prompt=long, raw=True),  # the completions route
    ]
    for run in calls:
        with pytest.raises(ollama.ResponseError) as l_exc:
            run()
        assert l_exc.value.status_code == 400
        _says_the_context(l_exc.value.error)
    # under the context, the same surfaces answer
    short = [{"role": "user", "content": "z " * 100}]
    assert an.messages.create(model="tiny", max_tokens=1, messages=short).type == "message"
    assert ol.chat(model="tiny", messages=short, options={"num_predict": 1}).done


def test_prompt_length_check_can_be_turned_off(tmp_path: Path, model_store: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "settings.json").write_text(json.dumps({"check_prompt_length": False}))
    s = ServerProcess(home, link_models(tmp_path / "m", model_store / "tiny.gguf")).wait_ready()
    try:
        status, err, _ = call(
            s,
            "/api/chat",
            {"model": "tiny", "messages": [{"role": "user", "content": "z " * 5000}], "stream": False},
        )
        # the engine decides alone: it refuses the prompt in its own words (no counts from the gateway)
        assert status == 400 and "tokens per request" not in err["error"]
    finally:
        pids = s.engine_pids()
        s.stop()
        wait_gone(pids, 5)


def test_chat_boundary_agrees_with_the_engine(server: ServerProcess) -> None:
    """The gateway counts what llama.cpp counts: SLOT_CTX - 1 prompt tokens pass, SLOT_CTX are refused."""

    def prompt_tokens(k: int) -> int:
        status, body, _ = call(server, "/v1/chat/completions", chat("z" * k))
        assert status == 200, body
        return int(body["usage"]["prompt_tokens"])

    base = prompt_tokens(10) - 10  # the byte-fallback vocabulary: one token per 'z'
    assert prompt_tokens(1500) == base + 1500  # counted by the gateway (large), and linear
    fits = SLOT_CTX - 1 - base
    assert prompt_tokens(fits) == SLOT_CTX - 1
    status, err, _ = call(server, "/v1/chat/completions", chat("z" * (fits + 1)))
    assert status == 400 and err["error"]["code"] == "context_length_exceeded"
    assert f"the prompt is {SLOT_CTX} tokens" in err["error"]["message"]


def test_token_id_prompts_are_checked_exactly(server: ServerProcess) -> None:
    ok = {"model": "tiny", "prompt": [5] * (SLOT_CTX - 1), "max_tokens": 1}
    status, body, _ = call(server, "/v1/completions", ok)
    assert status == 200 and body["usage"]["prompt_tokens"] == SLOT_CTX - 1
    status, err, _ = call(server, "/v1/completions", {**ok, "prompt": [5] * SLOT_CTX})
    assert status == 400 and err["error"]["code"] == "context_length_exceeded"
    status, err, _ = call(server, "/v1/completions", {**ok, "prompt": [[5] * 3, [5] * SLOT_CTX]})
    assert status == 400 and err["error"]["code"] == "context_length_exceeded"


def test_small_requests_are_not_counted() -> None:
    """The documented rule: no engine round trip unless the body could hold the context."""
    assert not may_exceed(100, messages=2, slot_ctx=4096)
    limit = 4096 - TEMPLATE_ALLOWANCE - PER_MESSAGE_ALLOWANCE * 3
    assert not may_exceed(limit - 1, messages=3, slot_ctx=4096)
    assert may_exceed(limit, messages=3, slot_ctx=4096)


# ---- concurrency ---------------------------------------------------------------------------------
def test_second_concurrent_request_of_a_client_is_429_with_retry_after(server: ServerProcess) -> None:
    body = json.dumps({"model": "nope", "messages": [{"role": "user", "content": "x"}]}).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection(address(server), timeout=10) as first:
        first.sendall(head + body[:10])  # holds its slot while its body is on the way
        time.sleep(0.3)
        status, err, headers = call(server, "/v1/chat/completions", raw=body)
        assert status == 429 and headers.get("Retry-After") == "1"
        assert (
            err["error"]["code"] == "too_many_concurrent_requests"
            and err["error"]["type"] == "rate_limit_error"
        )
        assert call(server, "/health", method="GET")[0] == 200  # GETs are not counted
        first.sendall(body[10:])
        answer = first.recv(65536)
        assert answer.startswith(b"HTTP/1.1 404"), answer[:100]
    assert call(server, "/v1/chat/completions", raw=body)[0] == 404  # the slot was given back


# ---- slow clients --------------------------------------------------------------------------------
def closed_after(sock: socket.socket, limit: float = 10) -> float:
    t0 = time.monotonic()
    sock.settimeout(limit)
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        pass
    return time.monotonic() - t0


@pytest.mark.parametrize("sent", [b"POST /v1/chat/comp", b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n", b""])
def test_a_request_head_that_never_completes_is_disconnected(server: ServerProcess, sent: bytes) -> None:
    with socket.create_connection(address(server), timeout=10) as s:
        s.sendall(sent)
        waited = closed_after(s)
    assert waited < 3.5  # idle_timeout_s is 1 (aiohttp checks at a coarse tick)


def test_an_idle_keep_alive_connection_is_closed(server: ServerProcess) -> None:
    with socket.create_connection(address(server), timeout=10) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        time.sleep(0.2)
        assert s.recv(65536).startswith(b"HTTP/1.1 200")
        assert closed_after(s) < 3.5


def test_a_body_that_trickles_in_is_408(server: ServerProcess) -> None:
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100\r\n\r\n"
    )
    with socket.create_connection(address(server), timeout=10) as s:
        t0 = time.monotonic()
        s.sendall(head + b'{"model": ')
        data = b""
        s.settimeout(10)
        while chunk := s.recv(65536):
            data += chunk
        waited = time.monotonic() - t0
    assert data.startswith(b"HTTP/1.1 408"), data[:100]
    assert 1.5 < waited < 5
    err = json.loads(data.split(b"\r\n\r\n", 1)[1])
    assert err["error"]["code"] == "request_timeout" and "body_timeout_s" in err["error"]["message"]


# ---- path traversal and shells -------------------------------------------------------------------
NAMES = [
    "../outside",
    "../../secret",
    "../../etc/passwd",
    "/etc/passwd",
    "%2e%2e/x",
    "%2e%2e%2foutside",
    "org/../../x",
    "tiny/../../outside",
    "..\\outside",
    "./tiny",
    str(REPO / "tests" / "fixtures"),
]


@pytest.mark.parametrize("name", NAMES)
def test_model_names_never_leave_the_library(server: ServerProcess, name: str) -> None:
    status, err, _ = call(server, "/v1/chat/completions", chat("x", model=name))
    assert status == 404 and err["error"]["code"] == "model_not_found"
    status, err, _ = call(server, "/api/show", {"model": name})
    assert status == 404 and isinstance(err["error"], str)
    for path, body in (
        ("/v1/messages", {"model": name, "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}),
        ("/v1/responses", {"model": name, "input": "x"}),
        ("/v1/embeddings", {"model": name, "input": "x"}),
        ("/api/chat", {"model": name, "messages": [{"role": "user", "content": "x"}], "stream": False}),
        ("/api/generate", {"model": name, "prompt": "x", "stream": False}),
        ("/api/embed", {"model": name, "input": "x"}),
    ):
        status, err, _ = call(server, path, body)
        assert status == 404, (path, err)
    for quoted in (name, urllib.parse.quote(name, safe=""), urllib.parse.quote(name, safe="/")):
        for admin in ("explain", "logs"):
            route = f"/api/models/{quoted}/explain" if admin == "explain" else f"/api/lanes/{quoted}/logs"
            status, err, _ = call(server, route, method="GET")
            assert status == 404 and err["error"]["code"] in (
                "model_not_found",
                "lane_not_found",
                "route_not_found",
            ), (route, err)
        status, err, _ = call(server, f"/api/models/{quoted}/load")
        assert status == 404 and err["error"]["code"] in ("model_not_found", "route_not_found"), err
        status, err, _ = call(server, f"/v1/models/{quoted}", method="GET")
        assert status == 404 and err["error"]["code"] in ("model_not_found", "route_not_found"), err
    status, body, _ = call(server, "/api/lanes", method="GET")
    assert {ln["id"] for ln in body["lanes"]} <= {"tiny"}


def test_nothing_reaches_a_shell() -> None:
    pattern = re.compile(
        r"shell\s*=\s*True|os\.system\(|os\.popen\(|create_subprocess_shell|subprocess\.getoutput|"
        r"subprocess\.getstatusoutput|commands\.getoutput|pty\.spawn"
    )
    offenders = [
        f"{p.relative_to(REPO)}:{i}: {line.strip()}"
        for p in sorted((REPO / "app").rglob("*.py"))
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line)
    ]
    assert offenders == []
    spawns = [
        p for p in (REPO / "app").rglob("*.py") if "create_subprocess_exec" in p.read_text(encoding="utf-8")
    ]
    assert spawns, "engines are expected to start through create_subprocess_exec"


# ---- settings ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "bad",
    [
        {"max_body_mib": 0},
        {"max_concurrent_per_client": -1},
        {"idle_timeout_s": 0.0},
        {"body_timeout_s": -1.0},
    ],
)
def test_limit_settings_are_checked(bad: dict[str, Any]) -> None:
    with pytest.raises(SettingsError):
        Settings.flat(**bad)


def test_limit_setting_defaults() -> None:
    s = Settings()
    assert (
        s.limits.max_body_mib,
        s.limits.max_concurrent_per_client,
        s.limits.idle_timeout_s,
        s.limits.body_timeout_s,
    ) == (
        64,
        0,
        60.0,
        60.0,
    )
    assert s.limits.check_prompt_length is True
