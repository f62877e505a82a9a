"""Tool calls, `response_format` and `stream_options.include_usage` on /v1/chat/completions, where the
gateway passes the engine's bytes through: the official openai client against a real lane.

Forcing a tool call from a random-weights model. llama.cpp refuses a custom `grammar` beside `tools`
("Cannot use custom grammar constraints with tools"), so the pin used elsewhere is out. Instead the
model's GGUF carries a tools-aware chat template (Hermes 2 Pro style, tests.support.tinymodels.HERMES_TOOLS);
llama.cpp analyses the template, derives the `<tool_call>{"name": ..., "arguments": ...}</tool_call>`
format from it, and with `tool_choice: "required"` samples under a grammar built from the tools'
schemas. That grammar still admits free text *before* the first `<tool_call>` (content may precede
calls), and a random model never happens to write the marker, so `required` alone does not end in a
call. Two more pieces make it certain:
- an assistant prefill: the last message is an assistant turn holding `<tool_call>\\n`, which llama.cpp
  continues; from there the grammar admits only a call to a listed tool, arguments per its schema
  (enums keep the values finite), and the engine parses it into `tool_calls`;
- `logit_bias`: end-of-text favoured (stop after the call) and the whitespace byte tokens suppressed
  (the grammar allows up to 22 whitespace characters at each of a dozen places).
`parallel_tool_calls: false` keeps it to one call. `tool_choice: "auto"` cannot be forced this way: its
grammar is lazy, triggered by the marker in generated text, and the prefilled marker does not trigger it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import ServerProcess, link_models, running_server
from tests.support.tinymodels import HERMES_TOOLS, TinySpec, write_tiny_gguf

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
            "required": ["city"],
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"tz": {"type": "string", "enum": ["UTC"]}},
            "required": ["tz"],
        },
    },
}
FORCE_MESSAGES: list[Any] = [
    {"role": "user", "content": "weather in Paris?"},
    {"role": "assistant", "content": "<tool_call>\n"},
]
FORCE_BIAS = {"2": 30, "35": -100, "13": -100, "12": -100, "259": -100}
SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"type": "integer", "minimum": 0, "maximum": 99},
        "unit": {"type": "string", "enum": ["cm", "m"]},
        "exact": {"type": "boolean"},
    },
    "required": ["answer", "unit", "exact"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("tools")
    models = link_models(base / "models", model_store / "tiny.gguf")
    write_tiny_gguf(models / "tools.gguf", TinySpec(seed=3, chat_template=HERMES_TOOLS))
    with running_server(base / "home", models, "--max-loaded", "2") as s:
        yield s


@pytest.fixture
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=60)


def forced(client: openai.OpenAI, **kw: Any) -> Any:
    args: dict[str, Any] = {
        "model": "tools",
        "messages": FORCE_MESSAGES,
        "tools": [WEATHER],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "max_tokens": 300,
        "logit_bias": FORCE_BIAS,
    }
    return client.chat.completions.create(**{**args, **kw})


def check_schema(value: Any) -> None:
    assert isinstance(value, dict) and set(value) == {"answer", "unit", "exact"}
    assert isinstance(value["answer"], int) and not isinstance(value["answer"], bool)
    assert 0 <= value["answer"] <= 99 and value["unit"] in ("cm", "m") and isinstance(value["exact"], bool)


# ---- tool calls ----------------------------------------------------------------------------------
def test_forced_tool_call(client: openai.OpenAI) -> None:
    r = forced(client)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) in ({"city": "Paris"}, {"city": "Rome"})
    assert r.usage is not None and r.usage.completion_tokens > 0


def test_streamed_tool_call_deltas(client: openai.OpenAI) -> None:
    stream = forced(client, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or ())]
    first, rest = calls[0], calls[1:]
    assert first.index == 0 and first.id and first.type == "function" and first.function is not None
    assert first.function.name == "get_weather"
    assert rest and all(tc.index == 0 and tc.id is None and tc.function.name is None for tc in rest)
    arguments = "".join(tc.function.arguments or "" for tc in calls)
    assert json.loads(arguments) in ({"city": "Paris"}, {"city": "Rome"})
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["tool_calls"]
    assert (
        chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    )


def test_named_tool_choice_is_enforced(client: openai.OpenAI) -> None:
    # llama.cpp would drop the named choice (it takes tool_choice as a string only); the gateway sends
    # it as "only this tool, call required", so the call is to get_time although get_weather is first
    for _ in range(3):
        r = forced(
            client, tools=[WEATHER, CLOCK], tool_choice={"type": "function", "function": {"name": "get_time"}}
        )
        [call] = r.choices[0].message.tool_calls
        assert call.function.name == "get_time" and json.loads(call.function.arguments) == {"tz": "UTC"}
    with pytest.raises(openai.BadRequestError) as exc:
        forced(client, tool_choice={"type": "function", "function": {"name": "nope"}})
    assert isinstance(exc.value.body, dict) and exc.value.body["param"] == "tool_choice"


def test_parallel_tool_calls(client: openai.OpenAI) -> None:
    assert {len(forced(client).choices[0].message.tool_calls) for _ in range(4)} == {1}
    # allowed, the model may go on to another call after each one (about 4 times in 10 here): the
    # streamed deltas of several calls keep their own index and id
    for _ in range(20):
        stream = forced(client, parallel_tool_calls=True, max_tokens=1500, stream=True)
        calls: dict[int, list[Any]] = {}
        for c in stream:
            for tc in (c.choices[0].delta.tool_calls or ()) if c.choices else ():
                calls.setdefault(tc.index, []).append(tc)
        if len(calls) > 1:
            break
    assert sorted(calls) == list(range(len(calls))) and len(calls) > 1
    ids = [parts[0].id for parts in calls.values()]
    assert all(ids) and len(set(ids)) == len(ids)
    for parts in calls.values():
        assert parts[0].function.name == "get_weather"
        assert json.loads("".join(p.function.arguments or "" for p in parts)) in (
            {"city": "Paris"},
            {"city": "Rome"},
        )


def test_tool_history_reaches_the_prompt(client: openai.OpenAI) -> None:
    def prompt_tokens(result: str) -> int:
        messages: list[Any] = [
            {"role": "user", "content": "weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": result},
        ]
        r = client.chat.completions.create(model="tools", messages=messages, tools=[WEATHER], max_tokens=1)  # type: ignore[list-item]
        assert r.usage is not None
        return r.usage.prompt_tokens

    assert prompt_tokens("sunny, 24 degrees, light wind from the west") > prompt_tokens("sunny")


def test_grammar_beside_tools_is_the_engines_refusal_in_our_envelope(server: ServerProcess) -> None:
    body = {
        "model": "tools",
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 2,
        "tools": [WEATHER],
        "grammar": 'root ::= "a"',
    }
    r = httpx.post(server.api + "/chat/completions", json=body, timeout=60)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["source"] == "engine" and "grammar" in err["message"]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": {"type": "function"}}, "tools"),
        ({"tool_choice": 5}, "tool_choice"),
        ({"parallel_tool_calls": "no"}, "parallel_tool_calls"),
        ({"response_format": "json"}, "response_format"),
        ({"stream_options": {"include_usage": "yes"}}, "stream_options"),
    ],
)
def test_malformed_tool_and_format_fields_are_400(
    server: ServerProcess, extra: dict[str, Any], param: str
) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "x"}], **extra}
    r = httpx.post(server.api + "/chat/completions", json=body, timeout=30)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "invalid_request" and err["param"] == param


# ---- response_format -----------------------------------------------------------------------------
def test_response_format_json_schema(client: openai.OpenAI) -> None:
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "length", "schema": SCHEMA, "strict": True}}
    for _ in range(3):
        r = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "how long?"}],
            max_tokens=300,
            response_format=fmt,
        )
        assert r.choices[0].finish_reason == "stop"
        check_schema(json.loads(r.choices[0].message.content or ""))
    stream = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "how long?"}],
        max_tokens=300,
        response_format=fmt,
        stream=True,
    )
    pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert len([p for p in pieces if p]) > 1
    check_schema(json.loads("".join(pieces)))


# ---- stream_options.include_usage ----------------------------------------------------------------
def test_stream_options_include_usage(client: openai.OpenAI) -> None:
    args: Any = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 32,
        "extra_body": {"grammar": 'root ::= "the answer is 42"'},
    }
    plain = client.chat.completions.create(**args)
    with_usage = list(
        client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True})
    )
    last = with_usage[-1]
    assert last.choices == [] and last.usage is not None
    assert plain.usage is not None and last.usage.prompt_tokens == plain.usage.prompt_tokens
    pieces = [c.choices[0].delta.content for c in with_usage if c.choices and c.choices[0].delta.content]
    assert "".join(pieces) == "the answer is 42"
    # one chunk per generated token, and the end-of-text token counted too
    assert len(pieces) <= last.usage.completion_tokens <= len(pieces) + 1
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens
    assert all(c.usage is None for c in with_usage[:-1])
    without = list(client.chat.completions.create(**args, stream=True))
    assert all(c.usage is None for c in without) and all(c.choices for c in without)
    off = list(client.chat.completions.create(**args, stream=True, stream_options={"include_usage": False}))
    assert all(c.usage is None for c in off)
