"""The Anthropic Messages surface: the official anthropic client against a real `switchyard serve`,
and the translator functions field by field."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from app.chat.deltas import chunk_deltas
from app.core.errors import BadRequestError, EngineCrashedError, LaneBusyError, ModelNotFoundError
from app.server.surfaces.anthropic.translate import (
    MessageTranslator,
    StopScanner,
    error_body,
    thinking_signature,
    to_openai,
)
from app.server.surfaces.shapes import pin_named_tool_choice
from tests.conftest import ServerProcess, link_models, running_server
from tests.support.tinymodels import HERMES_TOOLS, TinySpec, write_tiny_gguf


def _feed(tr: MessageTranslator, chunk: dict[str, Any]) -> list[Any]:
    """An OpenAI chunk through the one delta reader, into the translator."""
    return [e for d in chunk_deltas(chunk) for e in tr.feed(d)]


GRAMMAR = 'root ::= "the answer is 42"'
PIN = {"grammar": GRAMMAR}
HI = [{"role": "user", "content": "hi"}]
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


CLOCK_TOOL = {
    "name": "get_time",
    "input_schema": {
        "type": "object",
        "properties": {"tz": {"type": "string", "enum": ["UTC"]}},
        "required": ["tz"],
    },
}


def tool_history(result: str, *, is_error: bool = False) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "weather in Paris?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01", "content": result, "is_error": is_error}
            ],
        },
    ]


# ---- against a real server -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("anthropic")
    models = link_models(base / "models", model_store / "tiny.gguf", model_store / "embed.gguf")
    with running_server(base / "home", models) as s:
        yield s


@pytest.fixture
def client(server: ServerProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=60)


def post(
    server: ServerProcess, path: str, body: bytes, headers: dict[str, str] | None = None
) -> httpx.Response:
    return httpx.post(
        server.url + path,
        content=body,
        headers={"content-type": "application/json", **(headers or {})},
        timeout=60,
    )


def test_create_pinned_by_grammar(client: anthropic.Anthropic) -> None:
    m = client.messages.create(model="tiny", max_tokens=32, messages=HI, extra_body=PIN)
    assert [b.type for b in m.content] == ["text"]
    assert m.content[0].text == "the answer is 42"
    assert m.id.startswith("msg_") and m.type == "message" and m.role == "assistant" and m.model == "tiny"
    assert m.stop_reason == "end_turn" and m.stop_sequence is None
    counted = client.messages.count_tokens(model="tiny", messages=HI).input_tokens
    assert m.usage.input_tokens == counted > 0
    assert m.usage.output_tokens > 0


def test_stream_text_arrives_in_pieces(client: anthropic.Anthropic) -> None:
    with client.messages.stream(model="tiny", max_tokens=32, messages=HI, extra_body=PIN) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(pieces) == "the answer is 42"
    assert len([p for p in pieces if p]) > 1, "the answer should come as several deltas"
    assert final.stop_reason == "end_turn"
    assert final.usage.input_tokens == client.messages.count_tokens(model="tiny", messages=HI).input_tokens
    assert final.usage.output_tokens > 0


def test_stream_event_sequence_on_the_wire(server: ServerProcess) -> None:
    body = {"model": "tiny", "max_tokens": 8, "stream": True, "messages": HI, "grammar": 'root ::= "ab"'}
    with httpx.stream("POST", server.url + "/v1/messages", json=body, timeout=60) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        names = [ln.split(": ", 1)[1] for ln in r.iter_lines() if ln.startswith("event: ")]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[3:-3] == ["content_block_delta"] * (len(names) - 6) and len(names) > 6
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]


def test_system_prompt_string_and_blocks(client: anthropic.Anthropic) -> None:
    plain = client.messages.count_tokens(model="tiny", messages=HI).input_tokens
    as_str = client.messages.count_tokens(model="tiny", messages=HI, system="Answer briefly.").input_tokens
    as_blocks = client.messages.count_tokens(
        model="tiny", messages=HI, system=[{"type": "text", "text": "Answer briefly."}]
    ).input_tokens
    assert as_str == as_blocks > plain
    m = client.messages.create(
        model="tiny", max_tokens=32, system="Answer briefly.", messages=HI, extra_body=PIN
    )
    assert m.content[0].text == "the answer is 42"
    assert m.usage.input_tokens == as_str


def test_stop_sequences(client: anthropic.Anthropic) -> None:
    m = client.messages.create(
        model="tiny", max_tokens=32, stop_sequences=["is"], messages=HI, extra_body=PIN
    )
    assert m.content[0].text == "the answer "
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == "is"
    assert m.usage.input_tokens == client.messages.count_tokens(model="tiny", messages=HI).input_tokens
    with client.messages.stream(
        model="tiny", max_tokens=32, stop_sequences=["nope", "42"], messages=HI, extra_body=PIN
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "the answer is "
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == "42"


def test_max_tokens_stop_reason(client: anthropic.Anthropic) -> None:
    m = client.messages.create(model="tiny", max_tokens=3, messages=HI, extra_body=PIN)
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 3
    assert "the answer is 42".startswith(m.content[0].text)


def test_tool_history_is_accepted_and_reaches_the_prompt(client: anthropic.Anthropic) -> None:
    # the engine refuses a grammar beside tools, so the answer is not pinned: three tokens of anything
    # (ignore_eos: random weights may end the answer early)
    m = client.messages.create(
        model="tiny",
        max_tokens=3,
        messages=tool_history("sunny"),
        tools=[WEATHER_TOOL],
        extra_body={"ignore_eos": True},
    )
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 3
    short = client.messages.count_tokens(
        model="tiny",
        messages=tool_history("sunny"),
        tools=[WEATHER_TOOL],
    ).input_tokens
    assert m.usage.input_tokens == short
    longer = client.messages.count_tokens(
        model="tiny",
        messages=tool_history("sunny, 24 degrees, light wind from the west"),
    ).input_tokens
    failed = client.messages.count_tokens(
        model="tiny",
        messages=tool_history("sunny", is_error=True),
    ).input_tokens
    assert longer > short and failed > short  # the tool result's text and its error mark are in the prompt


def test_named_tool_choice_reaches_the_engine_enforced(tmp_path: Path) -> None:
    """{"type": "tool", "name": N} becomes OpenAI's named object, which the route pins (only N, call
    required) so llama.cpp enforces it: get_time is called although get_weather is listed first. A
    random-weights model is forced into the call by a tools-aware template and an assistant prefill
    (see tests/server/surfaces/test_tools_and_formats.py)."""
    models = tmp_path / "m"
    models.mkdir()
    write_tiny_gguf(models / "tools.gguf", TinySpec(seed=3, chat_template=HERMES_TOOLS))
    weather = {
        **WEATHER_TOOL,
        "input_schema": {**WEATHER_TOOL["input_schema"], "properties": {"city": {"enum": ["Paris"]}}},
    }
    prefill = [
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": "<tool_call>\n"},
    ]
    with running_server(tmp_path / "home", models) as s:
        c = anthropic.Anthropic(base_url=s.url, api_key="unused", max_retries=0, timeout=120)
        for _ in range(2):
            m = c.messages.create(
                model="tools",
                max_tokens=300,
                tools=[weather, CLOCK_TOOL],
                tool_choice={"type": "tool", "name": "get_time", "disable_parallel_tool_use": True},
                messages=prefill,
            )
            calls = [b for b in m.content if b.type == "tool_use"]
            assert m.stop_reason == "tool_use" and calls
            assert {b.name for b in calls} == {"get_time"} and calls[0].input == {"tz": "UTC"}
        # streamed: content_block_start (tool_use), input_json_delta pieces, stop_reason tool_use
        with c.messages.stream(
            model="tools",
            max_tokens=300,
            tools=[weather, CLOCK_TOOL],
            tool_choice={"type": "tool", "name": "get_time", "disable_parallel_tool_use": True},
            messages=prefill,
        ) as stream:
            kinds = [(e.type, getattr(getattr(e, "delta", None), "type", None)) for e in stream]
            final = stream.get_final_message()
        assert ("content_block_delta", "input_json_delta") in kinds and final.stop_reason == "tool_use"
        streamed = [b for b in final.content if b.type == "tool_use"]
        assert streamed[0].name == "get_time" and streamed[0].input == {"tz": "UTC"}
        with pytest.raises(anthropic.BadRequestError) as exc:
            c.messages.create(
                model="tools",
                max_tokens=8,
                tools=[weather],
                tool_choice={"type": "tool", "name": "nope"},
                messages=HI,
            )
        assert "not among 'tools'" in str(exc.value)


def test_unknown_model_is_not_found(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as exc:
        client.messages.create(model="claude-sonnet-9", max_tokens=8, messages=HI)
    body = exc.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "not_found_error"
    assert "claude-sonnet-9" in body["error"]["message"] and "tiny" in body["error"]["message"]


def test_bad_requests_are_invalid_request_errors(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError, match="'document' block is not supported"):
        client.messages.create(
            model="tiny",
            max_tokens=8,
            messages=[{"role": "user", "content": [{"type": "document", "source": {}}]}],
        )
    with pytest.raises(anthropic.BadRequestError, match="no vision projector") as exc:
        image = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}
        client.messages.create(
            model="tiny",
            max_tokens=8,
            messages=[{"role": "user", "content": [{"type": "image", "source": image}]}],
        )
    assert isinstance(exc.value.body, dict) and exc.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError, match="embedding model"):
        client.messages.create(model="embed", max_tokens=8, messages=HI)


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"{not json", "not valid JSON"),
        (b"", "empty"),
        (b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}]}', "'max_tokens'"),
        (b'{"model": "tiny", "max_tokens": 4, "messages": []}', "'messages' is empty"),
        (
            b'{"model": "tiny", "max_tokens": "4", "messages": [{"role": "user", "content": "x"}]}',
            "an integer",
        ),
        (
            b'{"model": "tiny", "max_tokens": 4, "messages": [{"role": "robot", "content": "x"}]}',
            "messages[0].role",
        ),
        (
            b'{"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": 5}]}',
            "messages[0].content",
        ),
    ],
)
def test_malformed_bodies_are_anthropic_400s(server: ServerProcess, body: bytes, needle: str) -> None:
    r = post(server, "/v1/messages", body)
    assert r.status_code == 400
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert needle in err["error"]["message"]


def test_either_key_header_is_accepted(server: ServerProcess) -> None:
    body = json.dumps({"model": "tiny", "max_tokens": 2, "messages": HI}).encode()
    for headers in ({"x-api-key": "sk-local"}, {"authorization": "Bearer sk-local"}, {}):
        r = post(server, "/v1/messages", body, {"anthropic-version": "2023-06-01", **headers})
        assert r.status_code == 200 and r.json()["type"] == "message", headers


def test_engine_refusal_keeps_anthropic_shape(server: ServerProcess) -> None:
    # a grammar the engine cannot parse: its refusal, in Anthropic's shape (an overlong prompt is the
    # gateway's own 400 now: see test_limits)
    body = {"model": "tiny", "max_tokens": 2, "messages": HI, "grammar": "root ::= ("}
    r = post(server, "/v1/messages", json.dumps(body).encode())
    assert 400 <= r.status_code < 600
    err = r.json()
    assert err["type"] == "error" and "refused the request" in err["error"]["message"]
    assert err["error"]["type"] in ("invalid_request_error", "api_error")


# ---- translator functions ------------------------------------------------------------------------
def test_request_translation_field_by_field() -> None:
    body = {
        "model": "tiny",
        "max_tokens": 100,
        "system": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                    {"type": "text", "text": "calling"},
                    {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"x": 1}},
                    {"type": "tool_use", "id": "toolu_2", "name": "g", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": [{"type": "text", "text": "r1"}],
                    },
                    {"type": "tool_result", "tool_use_id": "toolu_2", "content": "bad", "is_error": True},
                    {"type": "text", "text": "go on"},
                ],
            },
        ],
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 7,
        "stop_sequences": ["END"],
        "stream": True,
        "tools": [WEATHER_TOOL],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "metadata": {"user_id": "u"},
        "grammar": "root ::= x",
    }
    call = to_openai(body)
    assert call.model == "tiny" and call.stream is True and call.stop_sequences == ("END",)
    assert call.has_images is False
    o = call.openai
    assert o["messages"] == [
        {"role": "system", "content": "one\ntwo"},
        {"role": "user", "content": "a\nb"},
        {
            "role": "assistant",
            "content": "calling",
            "tool_calls": [
                {"id": "toolu_1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
                {"id": "toolu_2", "type": "function", "function": {"name": "g", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "r1"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: bad"},
        {"role": "user", "content": "go on"},
    ]
    assert o["max_tokens"] == 100 and o["temperature"] == 0.5 and o["top_p"] == 0.9 and o["top_k"] == 7
    assert "stop" not in o, "stop sequences are matched by the gateway, which names the one that hit"
    assert o["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": WEATHER_TOOL["input_schema"],
                "description": "Weather for a city",
            },
        }
    ]
    assert o["tool_choice"] == "required" and o["parallel_tool_calls"] is False
    assert o["grammar"] == "root ::= x"
    assert o["stream"] is True and o["stream_options"] == {"include_usage": True}
    assert "metadata" not in o


def test_request_translation_choices_images_and_count() -> None:
    base = {"model": "m", "max_tokens": 1, "messages": HI, "tools": [WEATHER_TOOL]}
    assert to_openai({**base, "tool_choice": {"type": "auto"}}).openai["tool_choice"] == "auto"
    assert to_openai({**base, "tool_choice": {"type": "none"}}).openai["tool_choice"] == "none"
    two = {**base, "tools": [WEATHER_TOOL, CLOCK_TOOL]}
    named = to_openai({**two, "tool_choice": {"type": "tool", "name": "get_weather"}}).openai
    # OpenAI's object form of a named choice; the route then pins it as llama.cpp enforces it
    assert named["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert "parallel_tool_calls" not in named
    pinned = pin_named_tool_choice(named)
    assert pinned is not None and pinned["tool_choice"] == "required"
    assert [t["function"]["name"] for t in pinned["tools"]] == ["get_weather"]
    with pytest.raises(BadRequestError):
        pin_named_tool_choice(to_openai({**two, "tool_choice": {"type": "tool", "name": "nope"}}).openai)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "QUJD"}}
    call = to_openai({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": [image]}]})
    assert call.has_images is True
    assert call.openai["messages"][0]["content"] == [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,QUJD"}}
    ]
    counted = to_openai({"model": "m", "messages": HI, "system": "s"}, for_count=True).openai
    assert counted == {"model": "m", "messages": [{"role": "system", "content": "s"}, *HI]}
    thinking = to_openai({"model": "m", "max_tokens": 1, "messages": HI, "thinking": {"type": "disabled"}})
    assert thinking.openai["chat_template_kwargs"] == {"enable_thinking": False}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m", "messages": HI}, "max_tokens"),
        ({"model": "m", "max_tokens": 0, "messages": HI}, "max_tokens"),
        ({"max_tokens": 1, "messages": HI}, "model"),
        ({"model": "m", "max_tokens": 1, "messages": HI, "system": 3}, "system"),
        ({"model": "m", "max_tokens": 1, "messages": HI, "stop_sequences": [""]}, "stop_sequences"),
        (
            {"model": "m", "max_tokens": 1, "messages": HI, "tools": [{"type": "web_search_20250305"}]},
            "tools[0]",
        ),
        (
            {
                "model": "m",
                "max_tokens": 1,
                "messages": [{"role": "assistant", "content": [{"type": "tool_result"}]}],
            },
            "messages[0].content[0]",
        ),
        (
            {
                "model": "m",
                "max_tokens": 1,
                "messages": HI,
                "tools": [WEATHER_TOOL],
                "tool_choice": {"type": "x"},
            },
            "tool_choice",
        ),
    ],
)
def test_request_translation_refusals_name_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequestError) as exc:
        to_openai(body)
    assert exc.value.param == param


def test_stop_scanner_holds_back_a_possible_start() -> None:
    s = StopScanner(["</end>", "STOP"])
    assert s.feed("hello <") == ("hello ", None)
    assert s.feed("/e") == ("", None)
    assert s.feed("nd> tail") == ("", "</end>")
    s = StopScanner(["ab"])
    assert s.feed("xa") == ("x", None)
    assert s.feed("c") == ("ac", None)  # not a stop after all: released
    assert s.feed("a") == ("", None)
    assert s.flush() == "a"
    assert StopScanner(["lo", "hel"]).feed("hello") == ("", "hel")  # the earliest match wins


def _chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {"object": "chat.completion.chunk", "choices": choices, **extra}


def test_stream_translation_of_text_then_tool_calls() -> None:
    tr = MessageTranslator(model="tiny")
    events = tr.start()
    for chunk in [
        _chunk({"role": "assistant", "content": None}),
        _chunk({"content": "Checking"}),
        _chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_a",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": ""},
                    }
                ]
            }
        ),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
        _chunk(
            {"tool_calls": [{"index": 1, "id": "call_b", "function": {"name": "now", "arguments": "{}"}}]}
        ),
        _chunk({}, "tool_calls"),
        _chunk(usage={"prompt_tokens": 11, "completion_tokens": 9}),
    ]:
        events += _feed(tr, chunk)
    events += tr.finish()
    kinds = [
        (name, d.get("index"), (d.get("delta") or d.get("content_block") or {}).get("type"))
        for name, d in events
    ]
    assert kinds == [
        ("message_start", None, None),
        ("ping", None, None),
        ("content_block_start", 0, "text"),
        ("content_block_delta", 0, "text_delta"),
        ("content_block_stop", 0, None),
        ("content_block_start", 1, "tool_use"),  # held until its arguments were whole JSON
        ("content_block_delta", 1, "input_json_delta"),
        ("content_block_stop", 1, None),
        ("content_block_start", 2, "tool_use"),
        ("content_block_delta", 2, "input_json_delta"),
        ("content_block_stop", 2, None),
        ("message_delta", None, None),
        ("message_stop", None, None),
    ]
    assert events[5][1]["content_block"] == {
        "type": "tool_use",
        "id": "toolu_a",
        "name": "get_weather",
        "input": {},
    }
    assert events[6][1]["delta"] == {"type": "input_json_delta", "partial_json": '{"city": "Paris"}'}
    assert events[-2][1]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert events[-2][1]["usage"] == {"input_tokens": 11, "output_tokens": 9}
    msg = tr.message()
    assert msg["content"] == [
        {"type": "text", "text": "Checking"},
        {"type": "tool_use", "id": "toolu_a", "name": "get_weather", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "toolu_b", "name": "now", "input": {}},
    ]
    assert msg["stop_reason"] == "tool_use" and msg["usage"] == {"input_tokens": 11, "output_tokens": 9}


def test_stream_translation_of_reasoning_stop_and_length() -> None:
    tr = MessageTranslator(model="m", stop_sequences=["##"])
    for c in [
        _chunk({"reasoning_content": "think"}),
        _chunk({"content": "an"}),
        _chunk({"content": "swer #"}),
    ]:
        _feed(tr, c)
    assert _feed(tr, _chunk({"content": "# more"})) == []  # the hidden "#" and the match: nothing after it
    assert tr.stopped and _feed(tr, _chunk({"content": "ignored"})) == []
    tr.finish()
    msg = tr.message()
    assert msg["content"] == [
        {"type": "thinking", "thinking": "think", "signature": thinking_signature("think")},
        {"type": "text", "text": "answer "},
    ]
    assert msg["stop_reason"] == "stop_sequence" and msg["stop_sequence"] == "##"
    assert msg["usage"] == {"input_tokens": 0, "output_tokens": 3}  # no usage report: the chunks seen
    tr = MessageTranslator(model="m")
    _feed(tr, _chunk({"content": "x"}, "length"))
    tr.finish()
    assert tr.message()["stop_reason"] == "max_tokens"
    tr = MessageTranslator(model="m", stop_sequences=["zz"])
    _feed(tr, _chunk({"content": "end z"}, "stop"))
    events = tr.finish()
    assert events[0][1]["delta"] == {"type": "text_delta", "text": "z"}  # a held tail is released at the end
    assert (
        tr.message()["content"] == [{"type": "text", "text": "end z"}]
        and tr.message()["stop_reason"] == "end_turn"
    )


def test_error_shapes() -> None:
    assert error_body(ModelNotFoundError("no such model")) == {
        "type": "error",
        "error": {"type": "not_found_error", "message": "no such model"},
    }
    assert error_body(BadRequestError("x"))["error"]["type"] == "invalid_request_error"
    assert error_body(LaneBusyError("busy"))["error"]["type"] == "overloaded_error"
    assert error_body(EngineCrashedError("boom"))["error"]["type"] == "api_error"
