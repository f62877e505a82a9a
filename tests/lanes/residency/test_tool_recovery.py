"""mlx-lm's lost tool calls (ml-explore/mlx-lm#1957), on every surface: a real `switchyard serve` in front of
a small aiohttp app that replays a recorded mlx_lm.server answer (finish_reason "tool_calls", no
tool_calls), registered as remote `mlx`. The official openai, anthropic and ollama clients check that the
call is recovered from the text when its markers are there, and that a clear error names the issue when not.
The replay stands in for mlx_lm.server because no tiny model can be made to hit the defect on demand."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import ollama
import openai
import pytest
from aiohttp import web

from app.chat.deltas import Finish, Text, ToolCallPart
from app.core.errors import UpstreamRefusedError
from app.server.gateway.tool_recovery import (
    StreamRecovery,
    ToolCallRecovery,
    parse_calls,
    stream_needs_recovery,
)
from tests.conftest import ServerProcess, running_server

RECORDED = json.loads(
    (
        Path(__file__).resolve().parents[2] / "support" / "fixtures" / "mlx" / "tool_calls_lost.json"
    ).read_text()
)
MODEL = "mlx/rec-model"
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
WEATHER = {"city": "Paris", "unit": "celsius"}


def _scenario(body: dict[str, Any]) -> dict[str, Any]:
    text = json.dumps(body.get("messages"))
    return RECORDED["lost" if "lost" in text else "recoverable"]


async def _chat(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    played = _scenario(body)
    if not body.get("stream"):
        return web.json_response(played["whole"])
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for chunk in played["stream"]:
        await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
    await resp.write(b"data: [DONE]\n\n")
    return resp


async def _models(_: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "rec-model", "object": "model"}]})


@pytest.fixture(scope="module")
def replay() -> Iterator[str]:
    app = web.Application()
    app.router.add_get("/v1/models", _models)
    app.router.add_post("/v1/chat/completions", _chat)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, replay: str) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("recovery")
    (base / "models").mkdir()
    with running_server(base / "home", base / "models") as s:
        req = urllib.request.Request(
            s.url + "/api/remotes",
            json.dumps({"name": "mlx", "url": replay}).encode(),
            {"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            assert json.loads(r.read())["state"] == "ready"
        yield s


def _ask(word: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"weather in Paris ({word})"}]


def test_openai_surface_recovers_or_names_the_issue(server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=30)
    r = client.chat.completions.create(model=MODEL, messages=_ask("ok"), tools=[TOOL])  # type: ignore[list-item]
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and msg.tool_calls
    assert msg.tool_calls[0].function.name == "get_weather"  # type: ignore[union-attr]
    assert json.loads(msg.tool_calls[0].function.arguments) == WEATHER  # type: ignore[union-attr]
    assert msg.content == "Let me check."
    with pytest.raises(openai.APIStatusError) as exc:
        client.chat.completions.create(model=MODEL, messages=_ask("lost"), tools=[TOOL])  # type: ignore[list-item]
    assert exc.value.status_code == 502 and "ml-explore/mlx-lm#1957" in str(exc.value)
    # the Responses API, whole and streamed
    resp = client.responses.create(model=MODEL, input="weather in Paris (ok)", tools=[_responses_tool()])
    calls = [o for o in resp.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and json.loads(calls[0].arguments) == WEATHER
    events = list(client.responses.create(model=MODEL, input="lost", tools=[_responses_tool()], stream=True))
    failed = [e for e in events if e.type in ("response.failed", "error")]
    assert failed and "mlx-lm#1957" in json.dumps([e.model_dump() for e in failed])
    assert not any(e.type == "response.output_item.added" and e.item.type == "function_call" for e in events)


def _responses_tool() -> Any:
    return {"type": "function", "name": "get_weather", "parameters": TOOL["function"]["parameters"]}


def test_anthropic_surface_recovers_or_names_the_issue(server: ServerProcess) -> None:
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=30)
    tools = [{"name": "get_weather", "input_schema": TOOL["function"]["parameters"]}]
    m = client.messages.create(model=MODEL, max_tokens=64, messages=_ask("ok"), tools=tools)  # type: ignore[arg-type]
    uses = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and uses and uses[0].name == "get_weather"
    assert uses[0].input == WEATHER
    with client.messages.stream(model=MODEL, max_tokens=64, messages=_ask("ok"), tools=tools) as s:  # type: ignore[arg-type]
        final = s.get_final_message()
    assert [b.input for b in final.content if b.type == "tool_use"] == [WEATHER]
    assert "".join(b.text for b in final.content if b.type == "text").strip() == "Let me check."
    with pytest.raises(anthropic.APIStatusError) as exc:
        client.messages.create(model=MODEL, max_tokens=64, messages=_ask("lost"), tools=tools)  # type: ignore[arg-type]
    assert exc.value.status_code == 502 and "ml-explore/mlx-lm#1957" in str(exc.value)


def test_ollama_surface_recovers_or_names_the_issue(server: ServerProcess) -> None:
    client = ollama.Client(host=server.url, timeout=30)
    r = client.chat(model=MODEL, messages=_ask("ok"), tools=[TOOL], stream=False)
    calls = r.message.tool_calls or []
    assert calls and calls[0].function.name == "get_weather" and dict(calls[0].function.arguments) == WEATHER
    streamed = [
        c
        for part in client.chat(model=MODEL, messages=_ask("ok"), tools=[TOOL], stream=True)
        for c in part.message.tool_calls or []
    ]
    assert [c.function.name for c in streamed] == ["get_weather"]
    with pytest.raises(ollama.ResponseError) as exc:
        client.chat(model=MODEL, messages=_ask("lost"), tools=[TOOL], stream=False)
    assert "ml-explore/mlx-lm#1957" in str(exc.value)
    with pytest.raises(ollama.ResponseError, match="mlx-lm#1957"):
        list(client.chat(model=MODEL, messages=_ask("lost"), tools=[TOOL], stream=True))


def test_recovery_holds_split_markers_and_passes_real_calls() -> None:
    rec = ToolCallRecovery("m")
    out = [d for piece in ("Hi <tool", '_call>{"name": "f", "arguments": {}}') for d in rec.feed(Text(piece))]
    assert out == [Text("Hi ")]
    done = rec.feed(Finish("tool_calls"))
    assert isinstance(done[0], ToolCallPart) and done[0].name == "f" and done[-1] == Finish("tool_calls")
    # an engine that sends its calls itself: held text goes out unchanged, the call passes
    rec = ToolCallRecovery("m")
    real = ToolCallPart(index=0, id="c1", name="f", arguments="{}")
    assert rec.feed(Text("<tool_call>")) == [] and rec.feed(real) == [Text("<tool_call>"), real]
    assert parse_calls('[TOOL_CALLS][{"name": "g", "arguments": {"x": 1}}]')[0][0]["function"]["name"] == "g"
    with pytest.raises(UpstreamRefusedError, match="1957"):
        ToolCallRecovery("m").feed(Finish("tool_calls"))


def _recorded_sse(scenario: str) -> bytes:
    chunks = RECORDED[scenario]["stream"]
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


def test_openai_stream_recovers_or_names_the_issue(server: ServerProcess) -> None:
    """The OpenAI pass-through's stream (relayed through StreamRecovery for a request with tools)."""
    client = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=30)
    stream = client.chat.completions.create(model=MODEL, messages=_ask("ok"), tools=[TOOL], stream=True)  # type: ignore[list-item]
    text, names, args, finish = "", [], "", None
    for chunk in stream:
        delta = chunk.choices[0].delta
        text += delta.content or ""
        for call in delta.tool_calls or []:
            names += [call.function.name] if call.function and call.function.name else []
            args += call.function.arguments or "" if call.function else ""
        finish = chunk.choices[0].finish_reason or finish
    assert names == ["get_weather"] and json.loads(args) == WEATHER and finish == "tool_calls"
    assert text.strip() == "Let me check." and "<tool" not in text
    with pytest.raises(openai.APIError, match=r"mlx-lm#1957"):
        list(client.chat.completions.create(model=MODEL, messages=_ask("lost"), tools=[TOOL], stream=True))  # type: ignore[list-item]


@pytest.mark.parametrize("step", [1, 7, 10_000])
def test_stream_recovery_on_recorded_bytes_in_any_pieces(step: int) -> None:
    def run(data: bytes) -> bytes:
        rec = StreamRecovery("rec-model")
        out = b"".join(rec.feed(data[i : i + step]) for i in range(0, len(data), step))
        return out + rec.close()

    events = [e for e in run(_recorded_sse("recoverable")).split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    chunks = [json.loads(e[5:]) for e in events[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("content") or "" for d in deltas) == "Let me check. "
    calls = [tc for d in deltas for tc in d.get("tool_calls") or []]
    assert [c["function"]["name"] for c in calls] == ["get_weather"]
    assert json.loads(calls[0]["function"]["arguments"]) == WEATHER and calls[0]["id"].startswith("call_")
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert all(c["id"] == RECORDED["recoverable"]["stream"][0]["id"] for c in chunks)
    lost = run(_recorded_sse("lost"))
    assert lost.count(b"data: ") == 1 and b"tool_calls_lost" in lost and b"[DONE]" not in lost
    # an answer without markers and a normal finish passes as it came
    choice = {"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}
    plain = f"data: {json.dumps({'id': 'a', 'choices': [choice]})}\n\n".encode()
    assert run(plain + b"data: [DONE]\n\n") == plain + b"data: [DONE]\n\n"
    assert stream_needs_recovery({"tools": [TOOL]}, engine="mlx")
    assert not stream_needs_recovery({"tools": [TOOL]}, engine="llama.cpp")
    assert not stream_needs_recovery({}, engine="mlx")
