"""While a lane loads, a streaming client of each translated surface hears that it is loading, and a
start that fails ends the stream with that surface's own error: the official anthropic, openai (Responses)
and ollama clients against a real `switchyard serve`, and the raw bytes they read.

Anthropic and Responses streams get SSE comment lines (`: switchyard: loading MODEL (phase, N s)`), which
SSE clients skip. Ollama streams NDJSON, which has no comments: it gets empty pieces (`"content": ""`,
`"done": false`) that Ollama clients append as nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest

from tests.conftest import ServerProcess, link_models, running_server
from tests.support.tinymodels import write_unknown_arch_gguf

GRAMMAR = 'root ::= "the answer is 42"'
HI = [{"role": "user", "content": "hi"}]
LOADING = ": switchyard: loading "


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("loading")
    models = link_models(base / "models", model_store / "tiny.gguf")
    write_unknown_arch_gguf(models / "alien.gguf")
    with running_server(base / "home", models) as s:
        yield s


@pytest.fixture
def unloaded(server: ServerProcess) -> ServerProcess:
    """The server with tiny's lane stopped, so the next request waits for a start."""
    r = httpx.post(server.url + "/api/models/tiny/unload", timeout=60)
    assert r.status_code in (200, 404), r.text
    lanes = httpx.get(server.url + "/api/lanes", timeout=30).json()["lanes"]
    assert not [ln for ln in lanes if ln["model"] == "tiny" and ln["state"] == "ready"]
    return server


def raw_lines(server: ServerProcess, path: str, body: dict[str, Any]) -> tuple[int, list[str]]:
    with httpx.stream("POST", server.url + path, json=body, timeout=60) as r:
        return r.status_code, [ln for ln in r.iter_lines() if ln.strip()]


# ---- Anthropic -----------------------------------------------------------------------------------
def test_anthropic_stream_hears_the_loading_phase(unloaded: ServerProcess) -> None:
    body = {"model": "tiny", "max_tokens": 32, "messages": HI, "stream": True, "grammar": GRAMMAR}
    status, lines = raw_lines(unloaded, "/v1/messages", body)
    assert status == 200 and lines[0].startswith(LOADING + "tiny (")
    events = [ln.removeprefix("event: ") for ln in lines if ln.startswith("event: ")]
    assert events[0] == "message_start" and events[-1] == "message_stop"
    # the official client reads through the comments to the same answer
    httpx.post(unloaded.url + "/api/models/tiny/unload", timeout=60)
    client = anthropic.Anthropic(base_url=unloaded.url, api_key="unused", max_retries=0, timeout=60)
    with client.messages.stream(
        model="tiny", max_tokens=32, messages=HI, extra_body={"grammar": GRAMMAR}
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "the answer is 42" and final.stop_reason == "end_turn"


def test_anthropic_stream_whose_start_fails_ends_with_an_error_event(server: ServerProcess) -> None:
    body = {"model": "alien", "max_tokens": 4, "messages": HI, "stream": True}
    status, lines = raw_lines(server, "/v1/messages", body)
    assert status == 200 and lines[0].startswith(LOADING + "alien (")
    assert lines[-2] == "event: error"
    err = json.loads(lines[-1].removeprefix("data: "))
    assert err["type"] == "error" and err["error"]["type"] == "api_error"
    assert "nosucharch" in err["error"]["message"]
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(anthropic.APIStatusError) as exc:
        with client.messages.stream(model="alien", max_tokens=4, messages=HI) as stream:
            list(stream)
    assert "nosucharch" in str(exc.value)


# ---- Responses -----------------------------------------------------------------------------------
def test_responses_stream_hears_the_loading_phase(unloaded: ServerProcess) -> None:
    body = {"model": "tiny", "input": "hi", "max_output_tokens": 32, "stream": True, "grammar": GRAMMAR}
    status, lines = raw_lines(unloaded, "/v1/responses", body)
    assert status == 200 and lines[0].startswith(LOADING + "tiny (")
    events = [ln.removeprefix("event: ") for ln in lines if ln.startswith("event: ")]
    assert events[0] == "response.created" and events[-1] == "response.completed"
    httpx.post(unloaded.url + "/api/models/tiny/unload", timeout=60)
    client = openai.OpenAI(base_url=unloaded.api, api_key="unused", max_retries=0, timeout=60)
    with client.responses.stream(
        model="tiny", input="hi", max_output_tokens=32, extra_body={"grammar": GRAMMAR}
    ) as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    assert final.output_text == "the answer is 42" and final.status == "completed"


def test_responses_stream_whose_start_fails_ends_failed(server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=60)
    events = list(client.responses.create(model="alien", input="hi", max_output_tokens=4, stream=True))
    kinds = [e.type for e in events]
    assert kinds == ["response.created", "response.in_progress", "error", "response.failed"]
    error = events[2]
    assert error.type == "error" and error.code == "engine_start_failed" and "nosucharch" in error.message
    failed = events[3]
    assert failed.type == "response.failed" and failed.response.status == "failed"
    assert failed.response.error is not None and "nosucharch" in failed.response.error.message


# ---- Ollama --------------------------------------------------------------------------------------
def test_ollama_stream_hears_empty_pieces_while_loading(unloaded: ServerProcess) -> None:
    body = {"model": "tiny", "messages": HI, "options": {"grammar": GRAMMAR, "num_predict": 32}}
    status, lines = raw_lines(unloaded, "/api/chat", body)
    assert status == 200
    first = json.loads(lines[0])
    assert first["message"] == {"role": "assistant", "content": ""} and first["done"] is False
    assert first["model"] == "tiny"
    last = json.loads(lines[-1])
    assert last["done"] is True and last["load_duration"] > 0
    text = "".join(json.loads(ln)["message"]["content"] for ln in lines)
    assert text == "the answer is 42"
    httpx.post(unloaded.url + "/api/models/tiny/unload", timeout=60)
    client = ollama.Client(host=unloaded.url, timeout=60)
    pieces = list(client.generate(model="tiny", prompt="hi", options={"grammar": GRAMMAR}, stream=True))
    assert pieces[0].response == "" and not pieces[0].done  # heard while loading
    assert "".join(p.response for p in pieces) == "the answer is 42" and pieces[-1].done


def test_ollama_stream_whose_start_fails_ends_with_an_error_line(server: ServerProcess) -> None:
    status, lines = raw_lines(server, "/api/chat", {"model": "alien", "messages": HI})
    assert status == 200 and json.loads(lines[0])["done"] is False
    assert "nosucharch" in json.loads(lines[-1])["error"]
    client = ollama.Client(host=server.url, timeout=60)
    with pytest.raises(ollama.ResponseError) as exc:
        list(client.chat(model="alien", messages=HI, stream=True))
    assert "nosucharch" in exc.value.error
