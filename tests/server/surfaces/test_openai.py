"""A real `switchyard serve` with real llama.cpp lanes, driven by the official openai client."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.conftest import ServerProcess, link_models, running_server

GRAMMAR = 'root ::= "the answer is 42"'


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("api")
    models = link_models(base / "models", model_store / "tiny.gguf", model_store / "embed.gguf")
    (models / "broken.gguf").write_bytes(b"definitely not a gguf")
    # one chat and one embedding lane may be loaded together
    with running_server(base / "home", models) as s:
        yield s


@pytest.fixture
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=60)


def raw(
    server: ServerProcess, path: str, body: bytes | None = None, method: str = "POST"
) -> tuple[int, dict]:
    req = urllib.request.Request(
        server.url + path, data=body, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_list_models_only_servable_with_loaded_flag(client: openai.OpenAI) -> None:
    models = {m.id: m for m in client.models.list()}
    assert set(models) == {"tiny", "embed"}
    assert models["tiny"].owned_by == "switchyard"
    client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    extra = {m.id: m.model_extra for m in client.models.list()}
    assert extra["tiny"]["loaded"] is True and extra["tiny"]["kind"] == "chat"
    assert extra["embed"]["kind"] == "embedding"


def test_chat_non_stream_pinned_by_grammar(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "what is it?"}],
        max_tokens=32,
        extra_body={"grammar": GRAMMAR},
    )
    assert r.choices[0].message.content == "the answer is 42"
    assert r.model == "tiny"
    assert r.usage is not None and r.usage.completion_tokens > 0


def test_chat_stream_arrives_in_chunks(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "go"}],
        max_tokens=32,
        stream=True,
        extra_body={"grammar": GRAMMAR},
    )
    parts = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert "".join(parts) == "the answer is 42"
    assert len([p for p in parts if p]) > 1, "the stream should come as several chunks"


def test_completions(client: openai.OpenAI) -> None:
    r = client.completions.create(model="tiny", prompt="Once", max_tokens=32, extra_body={"grammar": GRAMMAR})
    assert r.choices[0].text == "the answer is 42"
    s = client.completions.create(
        model="tiny", prompt="Once", max_tokens=32, stream=True, extra_body={"grammar": GRAMMAR}
    )
    pieces = [c.choices[0].text for c in s if c.choices]
    assert "".join(pieces) == "the answer is 42" and len(pieces) > 1


def test_embeddings_float_and_base64(client: openai.OpenAI) -> None:
    as_float = client.embeddings.create(model="embed", input=["hello", "world"], encoding_format="float")
    default = client.embeddings.create(model="embed", input=["hello", "world"])  # the client asks for base64
    assert len(as_float.data) == 2 and len(as_float.data[0].embedding) == 64
    for a, b in zip(as_float.data, default.data, strict=True):
        assert a.embedding == pytest.approx(b.embedding, rel=1e-5, abs=1e-6)
    assert as_float.data[0].embedding != as_float.data[1].embedding


def test_eight_concurrent_streams(server: ServerProcess) -> None:
    async def one(c: openai.AsyncOpenAI, i: int) -> tuple[str, int]:
        s = await c.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": f"n{i}"}],
            max_tokens=64,
            stream=True,
            extra_body={"grammar": GRAMMAR},
        )
        text, chunks = "", 0
        async for chunk in s:
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
                chunks += 1
        return text, chunks

    async def main() -> list[tuple[str, int]]:
        async with openai.AsyncOpenAI(base_url=server.api, api_key="x", max_retries=0) as c:
            return await asyncio.gather(*(one(c, i) for i in range(8)))

    results = asyncio.run(main())
    assert [text for text, _ in results] == ["the answer is 42"] * 8
    assert all(chunks > 1 for _, chunks in results), results


def test_unknown_model_is_404_naming_models(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as exc:
        client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "x"}])
    err = exc.value.body
    assert isinstance(err, dict) and err["code"] == "model_not_found"
    assert "gpt-9" in err["message"] and "tiny" in err["message"] and "embed" in err["message"]


def test_broken_model_is_listed_with_reason_and_refused(server: ServerProcess, client: openai.OpenAI) -> None:
    _, body = raw(server, "/api/models", method="GET")
    broken = {m["id"]: m for m in body["models"]}["broken"]
    assert broken["status"] == "broken" and "not a GGUF" in broken["problem"]
    with pytest.raises(openai.UnprocessableEntityError, match="not a GGUF"):
        client.chat.completions.create(model="broken", messages=[{"role": "user", "content": "x"}])


@pytest.mark.parametrize(
    ("body", "code", "needle"),
    [
        (b"{not json", "malformed_json", "not valid JSON"),
        (b"", "malformed_json", "empty"),
        (b"[1, 2]", "malformed_json", "JSON object"),
        (b'{"messages": [{"role": "user", "content": "x"}]}', "invalid_request", "'model'"),
        (b'{"model": 5, "messages": []}', "invalid_request", "'model' must be a string"),
        (b'{"model": "tiny", "messages": "hi"}', "invalid_request", "'messages' must be a list"),
        (
            b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}',
            "invalid_request",
            "'stream' must be true or false",
        ),
        (
            b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": "8"}',
            "invalid_request",
            "'max_tokens' must be an integer",
        ),
        (b'{"model": "tiny", "messages": [3]}', "invalid_request", "messages[0]"),
        # shapes llama.cpp would answer with a 500 from its JSON library
        (
            b'{"model": "tiny", "messages": [{"role": "user", "content": {"a": 1}}]}',
            "invalid_request",
            "content",
        ),
        (
            b'{"model": "tiny", "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}',
            "invalid_request",
            "messages[0].content[0] is a text part",
        ),
        (
            b'{"model": "tiny", "messages": [{"role": "user", "content": [7]}]}',
            "invalid_request",
            'string "type"',
        ),
        (
            b'{"model": "tiny", "messages": [{"role": "user", "content": "x", "name": {"n": 1}}]}',
            "invalid_request",
            "messages[0].name must be a string",
        ),
    ],
)
def test_malformed_bodies_are_400(server: ServerProcess, body: bytes, code: str, needle: str) -> None:
    status, err = raw(server, "/v1/chat/completions", body)
    assert status == 400
    assert set(err["error"]) >= {"message", "type", "param", "code"}
    assert err["error"]["code"] == code and needle in err["error"]["message"]
    assert err["error"]["type"] == "invalid_request_error"


def test_wrong_kind_of_model_for_route(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="embedding model"):
        client.chat.completions.create(model="embed", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="not an embedding model"):
        client.embeddings.create(model="tiny", input="x")


def test_unknown_route_and_method_are_enveloped(server: ServerProcess) -> None:
    status, err = raw(server, "/v1/nothing", b"{}")
    assert status == 404 and err["error"]["code"] == "route_not_found"
    status, err = raw(server, "/v1/chat/completions", method="GET")
    assert status == 405 and err["error"]["code"] == "method_not_allowed"


def test_foreign_host_header_is_refused(server: ServerProcess) -> None:
    req = urllib.request.Request(server.url + "/v1/models", headers={"Host": "evil.example:80"})
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req, timeout=10)
    assert exc.value.code == 403
    assert json.loads(exc.value.read())["error"]["code"] == "host_not_allowed"


def test_health_and_request_log(server: ServerProcess) -> None:
    status, body = raw(server, "/health", method="GET")
    assert status == 200 and body["status"] == "ok"
    raw(server, "/v1/chat/completions", b'{"model": "nope", "messages": [{"role": "user", "content": "x"}]}')
    line = "POST /v1/chat/completions model=nope status=404"
    deadline = time.monotonic() + 5  # the line is logged after the answer is sent
    while not any(line in ln for ln in server.stderr) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert any(line in ln for ln in server.stderr)


def test_engine_refusal_is_rewrapped_in_our_envelope(server: ServerProcess) -> None:
    # a value only llama.cpp checks (an over-long prompt is refused by the gateway: see test_limits.py)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": -5}
    status, err = raw(server, "/v1/chat/completions", json.dumps(body).encode())
    assert 400 <= status < 600
    e = err["error"]
    assert e["source"] == "engine" and "refused the request" in e["message"]
    assert set(e) == {"message", "type", "param", "code", "source"} and isinstance(e["code"], str)


def test_engine_cors_headers_are_not_passed_through(server: ServerProcess) -> None:
    body = b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}'
    req = urllib.request.Request(
        server.url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        assert not [h for h in r.headers if h.lower().startswith("access-control-")]
