"""The OpenAI Responses surface: the official openai client against a real `switchyard serve`, every
streamed event validated against the client's own types, and the translator field by field."""

from __future__ import annotations

import json
import time
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pydantic
import pytest
from openai.types.responses import ResponseStreamEvent

from app.chat.deltas import chunk_deltas
from app.core.errors import EngineCrashedError
from app.server.surfaces.responses.translate import ResponseTranslator, to_chat
from tests.conftest import ServerProcess, link_models, running_server
from tests.support.tinymodels import HERMES_TOOLS, TinySpec, write_tiny_gguf

GRAMMAR = 'root ::= "the answer is 42"'
PIN = {"grammar": GRAMMAR}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}
CLOCK = {
    "type": "function",
    "name": "get_time",
    "parameters": {
        "type": "object",
        "properties": {"tz": {"type": "string", "enum": ["UTC"]}},
        "required": ["tz"],
    },
}
# How a random-weights model is made to call a tool (see tests/server/surfaces/test_tools_and_formats.py for
# why):
# tool_choice "required", an assistant prefill that opens the call, end-of-text favoured and the
# whitespace bytes (0x20, 0x0A, 0x09 and the SentencePiece space) suppressed.
FORCE_INPUT = [
    {"role": "user", "content": "weather in Paris?"},
    {"role": "assistant", "content": "<tool_call>\n"},
]
FORCE_BIAS = {"logit_bias": {"2": 30, "35": -100, "13": -100, "12": -100, "259": -100}}
# every event type the installed client knows -> its model, for a strict check of each event
_EVENT_MODELS: dict[str, type[pydantic.BaseModel]] = {
    typing.get_args(cls.model_fields["type"].annotation)[0]: cls
    for cls in typing.get_args(typing.get_args(ResponseStreamEvent)[0])
}


def check_event(data: dict[str, Any]) -> None:
    """Validate one event strictly against the openai package's own type for it."""
    assert data["type"] in _EVENT_MODELS, f"the openai client knows no event {data['type']!r}"
    _EVENT_MODELS[data["type"]].model_validate(data)


# ---- against a real server -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("responses")
    models = link_models(base / "models", model_store / "tiny.gguf", model_store / "embed.gguf")
    write_tiny_gguf(models / "tools.gguf", TinySpec(seed=3, chat_template=HERMES_TOOLS))
    with running_server(base / "home", models, "--max-loaded", "2") as s:
        yield s


@pytest.fixture
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=60)


def raw_events(server: ServerProcess, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(SSE event name, data) for every event of a streamed /v1/responses answer."""
    out: list[tuple[str, dict[str, Any]]] = []
    with httpx.stream("POST", server.api + "/responses", json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        name = ""
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                out.append((name, json.loads(line[6:])))
    return out


def chat_prompt_tokens(client: openai.OpenAI, model: str, messages: list[dict[str, Any]], **kw: Any) -> int:
    r = client.chat.completions.create(model=model, messages=messages, max_tokens=1, **kw)  # type: ignore[arg-type]
    assert r.usage is not None
    return r.usage.prompt_tokens


def test_create_pinned_by_grammar(client: openai.OpenAI) -> None:
    r = client.responses.create(model="tiny", input="hi", max_output_tokens=32, extra_body=PIN)
    assert r.output_text == "the answer is 42"
    assert r.id.startswith("resp_") and r.object == "response" and r.model == "tiny"
    assert r.status == "completed" and r.incomplete_details is None and r.error is None
    [item] = r.output
    assert item.type == "message" and item.role == "assistant" and item.status == "completed"
    assert item.id.startswith("msg_") and [p.type for p in item.content] == ["output_text"]
    assert r.usage is not None and r.usage.output_tokens > 0
    assert r.usage.input_tokens == chat_prompt_tokens(client, "tiny", [{"role": "user", "content": "hi"}])
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.tool_choice == "auto" and r.tools == [] and r.parallel_tool_calls is True
    assert r.max_output_tokens == 32


def test_input_forms_and_instructions_reach_the_prompt(client: openai.OpenAI) -> None:
    def tokens(**kw: Any) -> int:
        r = client.responses.create(model="tiny", max_output_tokens=1, **kw)
        assert r.usage is not None
        return r.usage.input_tokens

    as_str = tokens(input="hello there")
    as_msg = tokens(input=[{"role": "user", "content": "hello there"}])
    as_parts = tokens(
        input=[
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello there"}]}
        ]
    )
    assert as_str == as_msg == as_parts
    with_instructions = tokens(input="hello there", instructions="Answer briefly.")
    as_developer = tokens(
        input=[
            {"role": "developer", "content": "Answer briefly."},
            {"role": "user", "content": "hello there"},
        ]
    )
    expected = chat_prompt_tokens(
        client,
        "tiny",
        [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "hello there"}],
    )
    assert with_instructions == as_developer == expected > as_str
    # an earlier answer sent back as an output message item is an assistant turn
    turns = tokens(
        input=[
            {"role": "user", "content": "hi"},
            {
                "type": "message",
                "role": "assistant",
                "id": "msg_1",
                "status": "completed",
                "content": [{"type": "output_text", "text": "the answer is 42", "annotations": []}],
            },
            {"role": "user", "content": "again"},
        ]
    )
    assert turns == chat_prompt_tokens(
        client,
        "tiny",
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "the answer is 42"},
            {"role": "user", "content": "again"},
        ],
    )


def test_max_output_tokens_makes_it_incomplete(client: openai.OpenAI) -> None:
    r = client.responses.create(model="tiny", input="hi", max_output_tokens=3, extra_body=PIN)
    assert r.status == "incomplete"
    assert r.incomplete_details is not None and r.incomplete_details.reason == "max_output_tokens"
    assert r.output_text == "the" and r.output[0].status == "incomplete"
    assert r.usage is not None and r.usage.output_tokens == 3


def test_stream_events_parse_as_the_clients_types(server: ServerProcess) -> None:
    events = raw_events(server, {"model": "tiny", "input": "hi", "max_output_tokens": 32, **PIN})
    for name, data in events:
        assert name == data["type"]
        check_event(data)  # strict: every field the client's types require is there
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    kinds = [d["type"] for _, d in events]
    deltas = [d for d in (d for _, d in events) if d["type"] == "response.output_text.delta"]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[4 : 4 + len(deltas)] == ["response.output_text.delta"] * len(deltas) and len(deltas) > 1
    assert kinds[4 + len(deltas) :] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    item_id = events[2][1]["item"]["id"]
    assert all(d["item_id"] == item_id and d["output_index"] == 0 and d["content_index"] == 0 for d in deltas)
    assert "".join(d["delta"] for d in deltas) == "the answer is 42" == events[-4][1]["text"]
    created, done = events[0][1]["response"], events[-1][1]["response"]
    assert created["status"] == "in_progress" and created["output"] == [] and created["usage"] is None
    assert done["id"] == created["id"] and done["status"] == "completed"
    assert done["output"] == [events[-2][1]["item"]] and done["usage"]["output_tokens"] > 0


def test_stream_with_the_official_client(client: openai.OpenAI) -> None:
    stream = client.responses.create(
        model="tiny", input="hi", max_output_tokens=32, stream=True, extra_body=PIN
    )
    types = [e.type for e in stream]
    assert types[0] == "response.created" and types[-1] == "response.completed"
    with client.responses.stream(
        model="tiny", input=[{"role": "user", "content": "hi"}], max_output_tokens=32, extra_body=PIN
    ) as s:
        pieces = [e.delta for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()
    assert "".join(pieces) == "the answer is 42" == final.output_text and len(pieces) > 1
    assert final.status == "completed" and final.usage is not None and final.usage.output_tokens > 0


def test_stream_cut_by_max_output_tokens_ends_incomplete(server: ServerProcess) -> None:
    events = raw_events(server, {"model": "tiny", "input": "hi", "max_output_tokens": 3, **PIN})
    last = events[-1][1]
    assert last["type"] == "response.incomplete"
    check_event(last)
    assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert last["response"]["output"][0]["status"] == "incomplete"
    assert last["response"]["output"][0]["content"][0]["text"] == "the"


def test_text_format_json_schema(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {
            "answer": {"type": "integer", "minimum": 0, "maximum": 99},
            "unit": {"type": "string", "enum": ["cm", "m"]},
        },
        "required": ["answer", "unit"],
        "additionalProperties": False,
    }
    r = client.responses.create(
        model="tiny",
        input="how long?",
        max_output_tokens=300,
        text={"format": {"type": "json_schema", "name": "length", "schema": schema, "strict": True}},
    )
    value = json.loads(r.output_text)
    assert set(value) == {"answer", "unit"}
    assert isinstance(value["answer"], int) and 0 <= value["answer"] <= 99 and value["unit"] in ("cm", "m")
    assert r.text is not None and r.text.format is not None and r.text.format.type == "json_schema"


def test_function_call_item(client: openai.OpenAI) -> None:
    r = client.responses.create(
        model="tools",
        input=FORCE_INPUT,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=300,
        extra_body=FORCE_BIAS,
    )
    assert r.status == "completed" and r.output_text == ""
    [call] = r.output
    assert call.type == "function_call" and call.status == "completed"
    assert call.name == "get_weather" and call.id is not None and call.id.startswith("fc_") and call.call_id
    assert json.loads(call.arguments) in ({"city": "Paris"}, {"city": "Rome"})
    assert r.tools[0].type == "function" and r.tools[0].name == "get_weather" and r.tool_choice == "required"


def test_function_call_streamed_through_the_client_helper(
    server: ServerProcess, client: openai.OpenAI
) -> None:
    body = {
        "model": "tools",
        "input": FORCE_INPUT,
        "tools": [WEATHER],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "max_output_tokens": 300,
        **FORCE_BIAS,
    }
    events = raw_events(server, body)
    for _, data in events:
        check_event(data)
    kinds = [d["type"] for _, d in events]
    n = kinds.count("response.function_call_arguments.delta")
    assert (
        kinds
        == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            *["response.function_call_arguments.delta"] * n,
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
        and n > 1
    )
    added, done = events[2][1]["item"], events[-2][1]["item"]
    assert added["type"] == "function_call" and added["status"] == "in_progress" and added["arguments"] == ""
    assert done["id"] == added["id"] and done["call_id"] == added["call_id"] and done["status"] == "completed"
    streamed = "".join(d["delta"] for _, d in events if d["type"] == "response.function_call_arguments.delta")
    assert streamed == done["arguments"] == events[-3][1]["arguments"]
    with client.responses.stream(
        model="tools",
        input=FORCE_INPUT,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=300,
        extra_body=FORCE_BIAS,
    ) as s:
        final = s.get_final_response()
    [call] = final.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.parsed_arguments in ({"city": "Paris"}, {"city": "Rome"})  # strict tool: parsed by the client


def test_named_tool_choice_and_allowed_tools_pick_the_tool(client: openai.OpenAI) -> None:
    choices: list[Any] = [
        {"type": "function", "name": "get_time"},
        {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "get_time"}]},
    ]
    for choice in choices:
        r = client.responses.create(
            model="tools",
            input=FORCE_INPUT,  # type: ignore[arg-type]
            tools=[WEATHER, CLOCK],  # type: ignore[list-item]
            tool_choice=choice,
            parallel_tool_calls=False,
            max_output_tokens=300,
            extra_body=FORCE_BIAS,
        )
        [call] = r.output
        assert call.type == "function_call" and call.name == "get_time"
        assert json.loads(call.arguments) == {"tz": "UTC"}


def test_tool_results_sent_back_as_input_items(client: openai.OpenAI) -> None:
    def items(result: str) -> list[dict[str, Any]]:
        return [
            {"role": "user", "content": "weather in Paris?"},
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "get_weather",
                "arguments": '{"city":"Paris"}',
            },
            {"type": "function_call_output", "call_id": "call_1", "output": result},
        ]

    def tokens(result: str) -> int:
        r = client.responses.create(
            model="tools",
            input=items(result),
            tools=[WEATHER],
            max_output_tokens=1,  # type: ignore[arg-type,list-item]
        )
        assert r.usage is not None
        return r.usage.input_tokens

    short, longer = tokens("sunny"), tokens("sunny, 24 degrees, light wind from the west")
    assert longer > short
    chat_tools = [
        {"type": "function", "function": {k: WEATHER[k] for k in ("name", "description", "parameters")}}
    ]
    same = chat_prompt_tokens(
        client,
        "tools",
        [
            {"role": "user", "content": "weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ],
        tools=chat_tools,
    )
    assert short == same


def test_an_unknown_previous_response_id_is_a_clear_404(client: openai.OpenAI) -> None:
    # stored responses themselves: tests/mcp/test_responses_stored.py
    with pytest.raises(openai.NotFoundError) as exc:
        client.responses.create(model="tiny", input="hi", previous_response_id="resp_123")
    err = exc.value.body
    assert isinstance(err, dict) and err["param"] == "previous_response_id"
    assert "no stored response 'resp_123'" in err["message"] and "whole conversation" in err["message"]


@pytest.mark.parametrize(
    ("body", "param", "needle"),
    [
        ({"model": "tiny"}, "input", "missing required field 'input'"),
        ({"input": "hi"}, "model", "missing required field 'model'"),
        ({"model": "tiny", "input": 5}, "input", "a string or a list"),
        ({"model": "tiny", "input": []}, "input", "empty"),
        ({"model": "tiny", "input": [{"role": "robot", "content": "x"}]}, "input[0].role", "'user'"),
        ({"model": "tiny", "input": [{"type": "web_search_call"}]}, "input[0]", "not supported"),
        (
            {
                "model": "tiny",
                "input": [{"role": "user", "content": [{"type": "input_file", "file_id": "file-1"}]}],
            },
            "input[0].content[0]",
            "input_file",
        ),
        (
            {
                "model": "tiny",
                "input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}],
            },
            "input[0].content[0].image_url",
            "file_id is not supported",
        ),
        (
            {
                "model": "tiny",
                "input": [
                    {"role": "assistant", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}
                ],
            },
            "input[0].content[0]",
            "non-user message",
        ),
        # a hosted tool (web_search) is dropped on its own now
        # (tests/server/surfaces/test_agent_protocols.py); a type
        # nobody defines is still refused
        ({"model": "tiny", "input": "x", "tools": [{"type": "no_such_tool"}]}, "tools[0]", "not available"),
        (
            {
                "model": "tiny",
                "input": "x",
                "tools": [WEATHER],
                "tool_choice": {"type": "function", "name": "nope"},
            },
            "tool_choice",
            "'nope'",
        ),
        ({"model": "tiny", "input": "x", "tool_choice": "required"}, "tool_choice", "'tools' is empty"),
        ({"model": "tiny", "input": "x", "max_output_tokens": 0}, "max_output_tokens", "at least 1"),
        ({"model": "tiny", "input": "x", "max_output_tokens": "8"}, "max_output_tokens", "an integer"),
        ({"model": "tiny", "input": "x", "stream": "yes"}, "stream", "true or false"),
        ({"model": "tiny", "input": "x", "text": {"format": {"type": "xml"}}}, "text.format", "json_schema"),
        ({"model": "tiny", "input": "x", "conversation": "conv_1"}, "conversation", "not supported"),
        ({"model": "tiny", "input": "x", "background": True}, "background", "not supported"),
    ],
)
def test_bad_requests_are_openai_400s(
    server: ServerProcess, body: dict[str, Any], param: str, needle: str
) -> None:
    r = httpx.post(server.api + "/responses", json=body, timeout=30)
    assert r.status_code == 400
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert err["param"] == param and needle in err["message"]


def test_model_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as nf:
        client.responses.create(model="gpt-9", input="x")
    assert isinstance(nf.value.body, dict) and nf.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError, match="embedding model"):
        client.responses.create(model="embed", input="x")


def test_overlong_prompt_is_refused_before_the_stream(server: ServerProcess) -> None:
    # a prompt far longer than a slot's context: refused before any event is sent, as a plain error
    body = {"model": "tiny", "input": "z " * 5000, "max_output_tokens": 2, "stream": True}
    r = httpx.post(server.api + "/responses", json=body, timeout=60)
    assert r.status_code == 400 and r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["param"] == "input"
    assert err["type"] == "invalid_request_error" and "tokens" in err["message"]


def test_engine_dying_mid_stream_ends_with_error_then_failed(
    start_server: Any, tmp_path: Path, large_model: Path
) -> None:
    s: ServerProcess = start_server(link_models(tmp_path / "m", large_model))
    body = {"model": "large", "input": "go", "max_output_tokens": 4000, "ignore_eos": True, "stream": True}
    events: list[dict[str, Any]] = []
    killed = False
    with httpx.stream("POST", s.api + "/responses", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            events.append(json.loads(line[6:]))
            if not killed and [e["type"] for e in events].count("response.output_text.delta") == 5:
                lanes = httpx.get(s.url + "/api/lanes", timeout=10).json()["lanes"]
                pid = {ln["id"]: ln for ln in lanes}["large"]["pid"]
                assert isinstance(pid, int)  # psutil.Process(None) would be this very process
                psutil.Process(pid).kill()
                killed = True
    assert killed
    for data in events:
        check_event(data)
    error, failed = events[-2], events[-1]
    assert (
        error["type"] == "error"
        and error["code"] == "engine_crashed"
        and "failed mid-request" in error["message"]
    )
    assert failed["type"] == "response.failed" and failed["response"]["status"] == "failed"
    assert failed["response"]["output"][0]["status"] == "incomplete"
    assert [d["sequence_number"] for d in events] == list(range(len(events)))


def test_client_leaving_mid_stream_frees_the_lane(server: ServerProcess) -> None:
    body = {"model": "tiny", "input": "go on", "max_output_tokens": 1500, "stream": True}
    with httpx.stream("POST", server.api + "/responses", json=body, timeout=60) as r:
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data: ")
            if seen >= 6:
                break
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        lanes = {ln["id"]: ln for ln in httpx.get(server.url + "/api/lanes", timeout=10).json()["lanes"]}
        if lanes["tiny"]["in_flight"] == 0:
            break
        time.sleep(0.05)
    assert lanes["tiny"]["in_flight"] == 0 and lanes["tiny"]["state"] == "ready"


# ---- the translation, field by field -------------------------------------------------------------
def test_request_translation_field_by_field() -> None:
    call = to_chat(
        {
            "model": "m",
            "instructions": "Be brief.",
            "input": [
                {
                    "role": "user",
                    "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
                },
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "let me see"}],
                },
                {
                    "type": "function_call",
                    "call_id": "c1",
                    "name": "get_weather",
                    "arguments": '{"city":"Rome"}',
                },
                {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
                {
                    "type": "function_call_output",
                    "call_id": "c2",
                    "output": [{"type": "input_text", "text": "noon"}],
                },
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"role": "developer", "content": "Use metric units."},
            ],
            "max_output_tokens": 64,
            "temperature": 0.5,
            "top_p": 0.9,
            "tools": [WEATHER, CLOCK],
            "tool_choice": "auto",
            "parallel_tool_calls": False,
            "text": {
                "format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}, "strict": True}
            },
            "stream": True,
            "seed": 7,
            "store": True,
            "metadata": {"k": "v"},
        }
    )
    assert call.model == "m" and call.stream is True
    assert call.chat == {
        "model": "m",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "ab"},
            {
                "role": "assistant",
                "content": "let me see",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'},
                    },
                    {"id": "c2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            {"role": "tool", "tool_call_id": "c2", "content": "noon"},
            {"role": "system", "content": "Use metric units."},
        ],
        "max_tokens": 64,
        "temperature": 0.5,
        "top_p": 0.9,
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "parameters": WEATHER["parameters"],
                    "description": "Weather for a city",
                    "strict": True,
                },
            },
            {"type": "function", "function": {"name": "get_time", "parameters": CLOCK["parameters"]}},
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "w", "schema": {"type": "object"}, "strict": True},
        },
        "seed": 7,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    assert call.echo["tools"] == [WEATHER, CLOCK] and call.echo["metadata"] == {"k": "v"}
    assert call.echo["instructions"] == "Be brief." and call.echo["max_output_tokens"] == 64


def test_request_translation_of_tool_choices() -> None:
    base = {"model": "m", "input": "x", "tools": [WEATHER, CLOCK]}
    named = to_chat({**base, "tool_choice": {"type": "function", "name": "get_time"}}).chat
    # llama.cpp drops a named choice, so it is sent as: only that tool, and a call required
    assert named["tool_choice"] == "required" and [t["function"]["name"] for t in named["tools"]] == [
        "get_time"
    ]
    allowed = to_chat(
        {
            **base,
            "tool_choice": {
                "type": "allowed_tools",
                "mode": "auto",
                "tools": [{"type": "function", "name": "get_weather"}],
            },
        }
    ).chat
    assert allowed["tool_choice"] == "auto" and [t["function"]["name"] for t in allowed["tools"]] == [
        "get_weather"
    ]
    assert to_chat({**base, "tool_choice": "none"}).chat["tool_choice"] == "none"
    plain = to_chat({"model": "m", "input": "x", "text": {"format": {"type": "text"}}}).chat
    assert (
        "response_format" not in plain
        and "tools" not in plain
        and plain["messages"] == [{"role": "user", "content": "x"}]
    )
    assert to_chat({"model": "m", "input": "x", "text": {"format": {"type": "json_object"}}}).chat[
        "response_format"
    ] == {"type": "json_object"}


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def test_stream_translation_of_reasoning_text_then_tool_calls() -> None:
    tr = ResponseTranslator(model="m", echo={"tools": [], "tool_choice": "auto"})
    chunks = [
        _chunk({"role": "assistant", "content": None}),
        _chunk({"reasoning_content": "thinking"}),
        _chunk({"content": "Let me "}),
        _chunk({"content": "check."}),
        _chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_a",
                        "type": "function",
                        "function": {"name": "f", "arguments": ""},
                    }
                ]
            }
        ),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"x": '}}]}),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}),
        _chunk({"tool_calls": [{"index": 1, "id": "call_b", "function": {"name": "g", "arguments": "{}"}}]}),
        _chunk({}, "tool_calls"),
        {
            "choices": [],
            "usage": {
                "prompt_tokens": 11,
                "completion_tokens": 7,
                "prompt_tokens_details": {"cached_tokens": 4},
            },
        },
    ]
    events = tr.start()
    for c in chunks:
        events += [e for d in chunk_deltas(c) for e in tr.feed(d)]
    events += tr.finish()
    for _, data in events:
        check_event(data)
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    summary = [(d["type"], d.get("output_index")) for _, d in events]
    assert summary == [
        ("response.created", None),
        ("response.in_progress", None),
        ("response.output_item.added", 0),
        ("response.content_part.added", 0),
        ("response.reasoning_text.delta", 0),
        ("response.reasoning_text.done", 0),
        ("response.content_part.done", 0),
        ("response.output_item.done", 0),
        ("response.output_item.added", 1),
        ("response.content_part.added", 1),
        ("response.output_text.delta", 1),
        ("response.output_text.delta", 1),
        ("response.output_text.done", 1),
        ("response.content_part.done", 1),
        ("response.output_item.done", 1),
        ("response.output_item.added", 2),
        ("response.function_call_arguments.delta", 2),
        ("response.function_call_arguments.delta", 2),
        ("response.function_call_arguments.done", 2),
        ("response.output_item.done", 2),
        ("response.output_item.added", 3),
        ("response.function_call_arguments.delta", 3),
        ("response.function_call_arguments.done", 3),
        ("response.output_item.done", 3),
        ("response.completed", None),
    ]
    final = tr.response()
    reasoning, message, call_a, call_b = final["output"]
    assert reasoning["type"] == "reasoning" and reasoning["content"] == [
        {"type": "reasoning_text", "text": "thinking"}
    ]
    assert message["content"][0]["text"] == "Let me check." and message["status"] == "completed"
    assert (call_a["call_id"], call_a["name"], call_a["arguments"]) == ("call_a", "f", '{"x": 1}')
    assert (call_b["call_id"], call_b["name"], call_b["arguments"]) == ("call_b", "g", "{}")
    assert final["status"] == "completed" and final["completed_at"] is not None
    assert final["usage"] == {
        "input_tokens": 11,
        "input_tokens_details": {"cached_tokens": 4, "cache_write_tokens": 0},
        "output_tokens": 7,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 18,
    }


def test_stream_translation_of_a_failure_mid_stream() -> None:
    tr = ResponseTranslator(model="m", echo={})
    events = [*tr.start(), *[e for d in chunk_deltas(_chunk({"content": "par"})) for e in tr.feed(d)]]
    events += tr.fail(EngineCrashedError("the engine for 'm' exited with code -9; it will be restarted"))
    for _, data in events:
        check_event(data)
    error, failed = events[-2][1], events[-1][1]
    assert error["type"] == "error" and error["code"] == "engine_crashed" and "exited" in error["message"]
    assert failed["type"] == "response.failed" and failed["response"]["status"] == "failed"
    assert failed["response"]["error"]["code"] == "server_error"
    assert failed["response"]["output"][0]["status"] == "incomplete"
    assert failed["response"]["output"][0]["content"][0]["text"] == "par"


def test_tokens_are_counted_in_metrics(server: ServerProcess, client: openai.OpenAI) -> None:
    def counted() -> tuple[float, float]:
        text = httpx.get(server.url + "/metrics", timeout=10).text
        values = {}
        for name in ("switchyard_input_tokens_total", "switchyard_output_tokens_total"):
            values[name] = sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith(name + "{") and 'model="tiny"' in line
            )
        return values["switchyard_input_tokens_total"], values["switchyard_output_tokens_total"]

    before = counted()
    plain = client.responses.create(model="tiny", input="hi", max_output_tokens=32, extra_body=PIN)
    with client.responses.stream(model="tiny", input="hi", max_output_tokens=32, extra_body=PIN) as s:
        streamed = s.get_final_response()
    assert plain.usage is not None and streamed.usage is not None
    expected = (
        before[0] + plain.usage.input_tokens + streamed.usage.input_tokens,
        before[1] + plain.usage.output_tokens + streamed.usage.output_tokens,
    )
    deadline = time.monotonic() + 5  # a request is recorded after its answer is sent
    while (after := counted()) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    assert after == expected
