"""The Ollama surface: the official ollama client against a real `switchyard serve`, and the
translator functions field by field."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest

from app.chat.deltas import chunk_deltas
from app.core.errors import BadRequestError
from app.server.surfaces.ollama.translate import (
    OllamaTranslator,
    candidate_ids,
    chat_messages,
    chat_request,
    generate_request,
    map_format,
    map_options,
    ollama_name,
    parse_keep_alive,
    shorten,
)
from tests.conftest import ServerProcess, link_models, running_server
from tests.support.modelgen import write_piper_voice

GRAMMAR = 'root ::= "the answer is 42"'
PIN = {"grammar": GRAMMAR}
HI = [{"role": "user", "content": "hi"}]


def norm(v: Any) -> float:
    return math.sqrt(sum(x * x for x in v))


# ---- against a real server -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("ollama")
    models = link_models(base / "models", model_store / "tiny.gguf", model_store / "embed.gguf")
    write_piper_voice(models / "voices")  # a voice is served by Switchyard, but is not for Ollama clients
    with running_server(base / "home", models) as s:
        yield s


@pytest.fixture
def client(server: ServerProcess) -> ollama.Client:
    return ollama.Client(host=server.url, timeout=60)


def test_chat_non_stream_with_latest_tag(client: ollama.Client) -> None:
    r = client.chat(model="tiny:latest", messages=HI, options=PIN)
    assert r.message.role == "assistant" and r.message.content == "the answer is 42"
    assert r.model == "tiny:latest" and r.done is True and r.done_reason == "stop"
    assert r.prompt_eval_count and r.prompt_eval_count > 0 and r.eval_count and r.eval_count > 0
    assert r.total_duration and r.eval_duration and r.total_duration >= r.eval_duration > 0
    assert datetime.fromisoformat(str(r.created_at).replace("Z", "+00:00")).tzinfo is not None


def test_chat_stream_is_ndjson_pieces_then_done(client: ollama.Client) -> None:
    parts = list(client.chat(model="tiny", messages=HI, options=PIN, stream=True))
    assert "".join(p.message.content or "" for p in parts) == "the answer is 42"
    assert len([p for p in parts if p.message.content]) > 1
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    last = parts[-1]
    assert last.done_reason == "stop" and last.eval_count and last.prompt_eval_count


def test_stream_is_the_default(server: ServerProcess) -> None:
    body = {"model": "tiny", "messages": HI, "options": PIN}
    with httpx.stream("POST", server.url + "/api/chat", json=body, timeout=60) as r:
        assert r.headers["content-type"] == "application/x-ndjson"
        lines = [json.loads(ln) for ln in r.iter_lines() if ln]
    assert len(lines) > 2 and lines[-1]["done"] is True
    assert "".join(o["message"]["content"] for o in lines) == "the answer is 42"


def test_generate_plain_raw_and_stream(client: ollama.Client) -> None:
    r = client.generate(model="tiny", prompt="what is it?", options=PIN)
    assert r.response == "the answer is 42" and r.done and r.done_reason == "stop"
    with_system = client.generate(model="tiny", prompt="what is it?", system="Be brief.", options=PIN)
    assert with_system.prompt_eval_count and r.prompt_eval_count
    assert with_system.prompt_eval_count > r.prompt_eval_count
    raw = client.generate(model="tiny", prompt="Once", raw=True, options=PIN)
    assert raw.response == "the answer is 42"
    assert raw.prompt_eval_count and raw.prompt_eval_count < r.prompt_eval_count  # no template around it
    parts = list(client.generate(model="tiny", prompt="go", options=PIN, stream=True))
    assert "".join(p.response or "" for p in parts) == "the answer is 42" and parts[-1].done


def test_options_num_predict_stop_and_seed(client: ollama.Client) -> None:
    r = client.chat(model="tiny", messages=HI, options={**PIN, "num_predict": 3})
    assert r.done_reason == "length" and r.eval_count == 3
    assert "the answer is 42".startswith(r.message.content or "")
    r = client.chat(model="tiny", messages=HI, options={**PIN, "stop": ["is"]})
    assert r.message.content == "the answer " and r.done_reason == "stop"


def test_format_json_schema(client: ollama.Client) -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"enum": [1]}},
        "required": ["a"],
        "additionalProperties": False,
    }
    r = client.chat(model="tiny", messages=HI, format=schema, options={"seed": 0, "num_predict": 256})
    assert r.done_reason == "stop" and json.loads(r.message.content or "") == {"a": 1}


def test_ignored_load_options_are_named(server: ServerProcess) -> None:
    body = {
        "model": "tiny",
        "messages": HI,
        "stream": False,
        "options": {**PIN, "num_ctx": 8192, "num_gpu": 1},
    }
    r = httpx.post(server.url + "/api/chat", json=body, timeout=60)
    assert r.status_code == 200 and r.json()["message"]["content"] == "the answer is 42"
    assert r.headers["x-switchyard-ignored-options"] == "num_ctx, num_gpu"


def test_tool_history_is_accepted(client: ollama.Client) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather for a city",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
            },
        }
    ]
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "content": "sunny, 24 degrees", "tool_name": "get_weather"},
    ]
    r = client.chat(model="tiny", messages=history, tools=tools, options={"num_predict": 3})
    assert r.done and r.done_reason == "length" and r.eval_count == 3
    shorter = client.chat(model="tiny", messages=history[:1], tools=tools, options={"num_predict": 3})
    assert (
        r.prompt_eval_count and shorter.prompt_eval_count and r.prompt_eval_count > shorter.prompt_eval_count
    )


def test_embed_and_legacy_embeddings(client: ollama.Client) -> None:
    r = client.embed(model="embed", input=["hello", "world"])
    assert r.model == "embed" and len(r.embeddings) == 2 and len(r.embeddings[0]) == 64
    assert r.embeddings[0] != r.embeddings[1]
    assert all(norm(v) == pytest.approx(1.0, abs=1e-4) for v in r.embeddings)
    assert r.prompt_eval_count and r.prompt_eval_count > 0
    one = client.embed(model="embed:latest", input="hello", dimensions=16)
    assert len(one.embeddings) == 1 and len(one.embeddings[0]) == 16
    assert norm(one.embeddings[0]) == pytest.approx(1.0, abs=1e-4)
    legacy = client.embeddings(model="embed", prompt="hello").embedding
    assert len(legacy) == 64 and norm(legacy) != pytest.approx(1.0, abs=1e-3)  # raw, as Ollama's old route
    unit = [x / norm(legacy) for x in legacy]
    assert unit == pytest.approx(list(r.embeddings[0]), abs=1e-4)


def test_list_show_ps_version(client: ollama.Client, server: ServerProcess, model_store: Path) -> None:
    listed = {m.model: m for m in client.list().models}
    assert set(listed) == {"tiny:latest", "embed:latest"}  # not the piper voice
    assert any(
        m["kind"] == "speech" for m in httpx.get(server.url + "/api/library", timeout=10).json()["models"]
    )
    tiny = listed["tiny:latest"]
    assert tiny.size == (model_store / "tiny.gguf").stat().st_size
    assert tiny.details and tiny.details.format == "gguf" and tiny.details.family == "llama"
    assert tiny.digest and len(tiny.digest) == 64
    shown = client.show("tiny")
    assert shown.template and "<|im_start|>" in shown.template
    assert shown.modelinfo and shown.modelinfo["llama.context_length"] == 2048
    assert shown.capabilities == ["completion"] and client.show("embed:latest").capabilities == ["embedding"]
    client.chat(model="tiny", messages=HI, options={"num_predict": 1})
    running = {m.model: m for m in client.ps().models}
    assert "tiny:latest" in running
    row = running["tiny:latest"]
    assert row.size and row.size > 0 and row.size_vram == 0 and row.context_length == 2048
    assert row.expires_at and row.expires_at > datetime.now(UTC)
    version = httpx.get(server.url + "/api/version", timeout=10).json()
    assert isinstance(version["version"], str) and version["version"]


def test_keep_alive_sets_the_lane_ttl(client: ollama.Client) -> None:
    r = client.chat(model="tiny", messages=HI, options=PIN, keep_alive="1s")
    assert r.message.content == "the answer is 42"
    [row] = [m for m in client.ps().models if m.model == "tiny:latest"]
    assert row.expires_at is not None and row.expires_at.year < 2100  # a real deadline, not "forever"
    deadline = time.monotonic() + 10
    while "tiny:latest" in {m.model for m in client.ps().models} and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "tiny:latest" not in {m.model for m in client.ps().models}, "keep_alive 1s should unload it"
    client.chat(model="tiny", messages=HI, options=PIN, keep_alive=-1)
    [row] = [m for m in client.ps().models if m.model == "tiny:latest"]
    assert row.expires_at is not None and row.expires_at.year > 2100  # kept loaded


def test_empty_prompt_loads_and_keep_alive_zero_unloads(client: ollama.Client) -> None:
    loaded = client.generate(model="tiny", prompt="")
    assert loaded.done and loaded.done_reason == "load"
    assert "tiny:latest" in {m.model for m in client.ps().models}
    gone = client.generate(model="tiny", prompt="", keep_alive=0)
    assert gone.done_reason == "unload"
    assert "tiny:latest" not in {m.model for m in client.ps().models}
    r = client.chat(model="tiny", messages=HI, options=PIN, keep_alive=0)  # answered, then unloaded
    assert r.message.content == "the answer is 42"
    deadline = time.monotonic() + 10
    while "tiny:latest" in {m.model for m in client.ps().models} and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "tiny:latest" not in {m.model for m in client.ps().models}


def test_unknown_model_is_404(client: ollama.Client) -> None:
    for call in (
        lambda: client.chat(model="llama3:8b", messages=HI),
        lambda: list(client.generate(model="llama3:8b", prompt="x", stream=True)),
        lambda: client.embed(model="llama3:8b", input="x"),
        lambda: client.show("llama3:8b"),
    ):
        with pytest.raises(ollama.ResponseError) as exc:
            call()
        assert exc.value.status_code == 404
        assert "llama3:8b" in exc.value.error and "tiny:latest" in exc.value.error


def test_wrong_kind_and_images_are_400(client: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError, match="embedding model") as exc:
        client.chat(model="embed", messages=HI)
    assert exc.value.status_code == 400
    with pytest.raises(ollama.ResponseError, match="not an embedding model"):
        client.embed(model="tiny", input="x")
    with pytest.raises(ollama.ResponseError, match="no vision projector") as exc:
        client.chat(
            model="tiny", messages=[{"role": "user", "content": "what is it?", "images": ["iVBORw0KGgo="]}]
        )
    assert exc.value.status_code == 400


def test_malformed_body_is_ollama_shaped(server: ServerProcess) -> None:
    r = httpx.post(server.url + "/api/chat", content=b"{nope", timeout=10)
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]
    r = httpx.post(
        server.url + "/api/chat", json={"model": "tiny", "messages": HI, "keep_alive": "soon"}, timeout=10
    )
    assert r.status_code == 400 and "keep_alive" in r.json()["error"]
    # a tool llama.cpp cannot parse would be its 500: the gateway names the shape instead (schemathesis)
    for tool in ({"type": "function"}, {"type": "function", "function": {"x": 1}}, {"type": "web"}):
        r = httpx.post(
            server.url + "/api/chat",
            json={"model": "tiny", "messages": HI, "tools": [tool], "stream": False},
            timeout=60,
        )
        assert r.status_code == 400 and "tools[0] must be" in r.json()["error"], r.text
    r = httpx.post(
        server.url + "/api/chat",
        json={
            "model": "tiny",
            "messages": HI,
            "tools": [{"type": "function", "function": {"name": "f"}}],  # no parameters: accepted
            "stream": False,
            "options": {"num_predict": 2},
        },
        timeout=60,
    )
    assert r.status_code == 200, r.text


# ---- translator functions ------------------------------------------------------------------------
def test_names() -> None:
    assert ollama_name("tiny") == "tiny:latest" and ollama_name("org/repo/file") == "org/repo/file:latest"
    assert ollama_name("qwen:7b") == "qwen:7b"
    assert candidate_ids("tiny:latest") == ["tiny:latest", "tiny"] and candidate_ids("tiny") == ["tiny"]


def test_options_mapping_field_by_field() -> None:
    opts = {
        "temperature": 0.2,
        "top_p": 0.8,
        "top_k": 20,
        "min_p": 0.1,
        "seed": 5,
        "num_predict": 64,
        "stop": ["\n\n"],
        "repeat_penalty": 1.1,
        "presence_penalty": 0.3,
        "frequency_penalty": 0.4,
        "num_keep": 4,
        "num_ctx": 8192,
        "num_thread": 8,
        "grammar": "root ::= x",
        "mirostat": None,
    }
    out, ignored = map_options(opts)
    assert out == {
        "temperature": 0.2,
        "top_p": 0.8,
        "top_k": 20,
        "min_p": 0.1,
        "seed": 5,
        "max_tokens": 64,
        "stop": ["\n\n"],
        "repeat_penalty": 1.1,
        "presence_penalty": 0.3,
        "frequency_penalty": 0.4,
        "n_keep": 4,
        "grammar": "root ::= x",
    }
    assert ignored == ["num_ctx", "num_thread"]
    assert map_options({"num_predict": -1}) == ({}, []) and map_options({"stop": "x"})[0] == {"stop": ["x"]}
    for bad in ({"top_k": 1.5}, {"temperature": "hot"}, {"stop": [1]}, {"seed": True}):
        with pytest.raises(BadRequestError):
            map_options(bad)


def test_format_think_and_keep_alive() -> None:
    assert map_format(None) is None and map_format("") is None
    assert map_format("json") == {"type": "json_object"}
    schema = {"type": "object"}
    assert map_format(schema) == {
        "type": "json_schema",
        "json_schema": {"name": "format", "schema": schema, "strict": True},
    }
    with pytest.raises(BadRequestError):
        map_format("yaml")
    assert [parse_keep_alive(v) for v in (None, 0, 30, "5m", "1h30m", "1.5s", "-1", "-1m", "300")] == [
        None,
        0.0,
        30.0,
        300.0,
        5400.0,
        1.5,
        -1.0,
        -60.0,
        300.0,
    ]
    with pytest.raises(BadRequestError):
        parse_keep_alive("5 minutes")
    call = chat_request({"model": "m", "messages": HI, "think": False, "format": "json", "keep_alive": "10m"})
    assert call.stream is True and call.keep_alive == 600.0
    assert call.openai["chat_template_kwargs"] == {"enable_thinking": False}
    assert call.openai["response_format"] == {"type": "json_object"}
    assert call.openai["stream_options"] == {"include_usage": True}


def test_chat_messages_tool_ids_and_images() -> None:
    msgs, images = chat_messages(
        [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "look", "images": ["iVBORw0KGgo="]},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"function": {"name": "a", "arguments": {"x": 1}}},
                    {"function": {"name": "b", "arguments": {}}},
                ],
            },
            {"role": "tool", "content": "B", "tool_name": "b"},
            {"role": "tool", "content": "A"},
        ]
    )
    assert images is True
    assert msgs[1]["content"] == [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
    ]
    assert msgs[2] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_2_0", "type": "function", "function": {"name": "a", "arguments": '{"x": 1}'}},
            {"id": "call_2_1", "type": "function", "function": {"name": "b", "arguments": "{}"}},
        ],
    }
    assert msgs[3] == {"role": "tool", "tool_call_id": "call_2_1", "content": "B"}  # matched by tool_name
    assert msgs[4] == {"role": "tool", "tool_call_id": "call_2_0", "content": "A"}  # the one left


def test_generate_request_shapes() -> None:
    call = generate_request(
        {"model": "m", "prompt": "p", "system": "s", "stream": False, "options": {"num_predict": 2}}
    )
    assert call.path == "/v1/chat/completions" and call.stream is False
    assert call.openai["messages"] == [{"role": "system", "content": "s"}, {"role": "user", "content": "p"}]
    assert call.openai["max_tokens"] == 2
    raw = generate_request({"model": "m", "prompt": "p", "raw": True})
    assert raw.path == "/v1/completions" and raw.openai["prompt"] == "p" and "messages" not in raw.openai
    with pytest.raises(BadRequestError, match="suffix"):
        generate_request({"model": "m", "prompt": "p", "suffix": "s"})


def test_translator_tool_calls_and_stats() -> None:
    tr = OllamaTranslator(model="tiny:latest", kind="chat", started=time.perf_counter())
    out = []
    for chunk in [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]},
        {"choices": [{"index": 0, "delta": {"content": "ok"}}]},
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {"index": 0, "id": "c", "function": {"name": "f", "arguments": '{"a"'}}
                        ]
                    },
                }
            ]
        },
        {
            "choices": [
                {"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}}
            ]
        },
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        {
            "choices": [],
            "usage": {"prompt_tokens": 7, "completion_tokens": 5},
            "timings": {"prompt_ms": 2.5, "predicted_ms": 4.0},
        },
    ]:
        out += [o for d in chunk_deltas(chunk) for o in tr.feed(d)]
    assert [o["message"]["content"] for o in out] == ["ok"] and out[0]["done"] is False
    final = tr.final()
    assert final[0]["message"]["tool_calls"] == [{"function": {"name": "f", "arguments": {"a": 1}}}]
    last = final[-1]
    assert last["done"] is True and last["done_reason"] == "stop" and last["message"]["content"] == ""
    assert last["prompt_eval_count"] == 7 and last["eval_count"] == 5
    assert last["prompt_eval_duration"] == 2_500_000 and last["eval_duration"] == 4_000_000
    whole = tr.whole()
    assert (
        whole["message"]["content"] == "ok"
        and whole["message"]["tool_calls"] == final[0]["message"]["tool_calls"]
    )
    gen = OllamaTranslator(model="m", kind="generate", started=time.perf_counter())
    chunk = {"choices": [{"index": 0, "text": "hi", "finish_reason": "length"}]}
    pieces = [o for d in chunk_deltas(chunk) for o in gen.feed(d)]
    assert pieces[0]["response"] == "hi"
    assert gen.whole()["done_reason"] == "length" and gen.whole()["response"] == "hi"


def test_shorten_renormalizes() -> None:
    v = shorten([3.0, 4.0, 12.0], 2)
    assert v == pytest.approx([0.6, 0.8])
    assert shorten([1.0, 2.0], None) == [1.0, 2.0] and shorten([1.0, 2.0], 5) == [1.0, 2.0]
