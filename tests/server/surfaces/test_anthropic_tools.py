"""Anthropic tool use and structured output: a cut-off call is not a runnable tool_use,
disable_parallel_tool_use means one call, ids are `toolu_` and round-trip, output_config is enforced.

The real-engine half runs the official anthropic client against `switchyard serve` with a tools-aware
tiny model; its random weights are forced into a call by the template, an assistant prefill and
llama.cpp's tool grammar (see test_anthropic_api.test_named_tool_choice_reaches_the_engine_enforced).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import anthropic
import httpx
import jsonschema
import pydantic
import pytest

from app.chat.deltas import chunk_deltas
from app.core.errors import BadRequestError
from app.server.surfaces.anthropic.translate import MessageTranslator, anthropic_tool_id, to_openai
from tests.conftest import ServerProcess, link_models, running_server
from tests.support.tinymodels import HERMES_TOOLS, TinySpec, write_tiny_gguf


def _feed(tr: MessageTranslator, chunk: dict[str, Any]) -> list[Any]:
    """An OpenAI chunk through the one delta reader, into the translator."""
    return [e for d in chunk_deltas(chunk) for e in tr.feed(d)]


HI = [{"role": "user", "content": "hi"}]
# a long forced argument: a call cut by a small max_tokens stops inside it, whatever whitespace
# the random weights choose around the keys
LONG_CITY = "Paris " * 40
WEATHER_TOOL = {
    "name": "get_weather",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": [LONG_CITY]}},
        "required": ["city"],
    },
}
CLOCK_TOOL = {
    "name": "get_time",
    "input_schema": {
        "type": "object",
        "properties": {"tz": {"type": "string", "enum": ["UTC"]}},
        "required": ["tz"],
    },
}
PREFILL = [
    {"role": "user", "content": "weather in Paris?"},
    {"role": "assistant", "content": "<tool_call>\n"},
]
SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer"}, "color": {"enum": ["red", "green"]}},
    "required": ["n", "color"],
    "additionalProperties": False,
}


def _chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {"object": "chat.completion.chunk", "choices": choices, **extra}


def _call(index: int, args: str, *, tid: str | None = None, name: str | None = None) -> dict[str, Any]:
    fn: dict[str, Any] = {"arguments": args}
    if name is not None:
        fn["name"] = name
    call: dict[str, Any] = {"index": index, "function": fn}
    if tid is not None:
        call |= {"id": tid, "type": "function"}
    return _chunk({"tool_calls": [call]})


def _run(tr: MessageTranslator, chunks: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    events = tr.start()
    for c in chunks:
        events += _feed(tr, c)
    return events + tr.finish()


def _starts(events: list[tuple[str, dict[str, Any]]]) -> list[str]:
    return [d["content_block"]["type"] for name, d in events if name == "content_block_start"]


# ---- the translator, fed by hand -----------------------------------------------------------------
def test_call_cut_by_max_tokens_is_not_a_tool_use() -> None:
    tr = MessageTranslator(model="m")
    events = _run(
        tr,
        [
            _chunk({"content": "Let me check"}),
            _call(0, '{ "city"', tid="call_1", name="get_weather"),
            _chunk({}, "length"),
        ],
    )
    assert _starts(events) == ["text"], "the text streams; the broken call never opens a block"
    assert not [d for _, d in events if d.get("delta", {}).get("type") == "input_json_delta"]
    msg = tr.message()
    assert msg["content"] == [{"type": "text", "text": "Let me check"}]
    assert msg["stop_reason"] == "max_tokens" and events[-2][1]["delta"]["stop_reason"] == "max_tokens"


def test_whole_calls_survive_a_later_cut_and_stop_reason_is_max_tokens() -> None:
    tr = MessageTranslator(model="m")
    _run(
        tr,
        [
            _call(0, '{"tz": ', tid="call_a", name="get_time"),
            _call(0, '"UTC"}'),
            _call(1, '{"city": "Par', tid="call_b", name="get_weather"),
            _chunk({}, "length"),
        ],
    )
    msg = tr.message()
    assert msg["content"] == [
        {"type": "tool_use", "id": "toolu_a", "name": "get_time", "input": {"tz": "UTC"}}
    ]
    assert msg["stop_reason"] == "max_tokens"


def test_a_call_opens_only_when_its_arguments_are_whole() -> None:
    tr = MessageTranslator(model="m")
    tr.start()
    assert _feed(tr, _call(0, '{"tz": "U', tid="x1", name="get_time")) == []
    events = _feed(tr, _call(0, 'TC"}'))
    assert [name for name, _ in events] == [
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
    ]
    assert events[1][1]["delta"]["partial_json"] == '{"tz": "UTC"}'
    assert _feed(tr, _call(0, "  ")) == [], "pieces after a whole call are ignored"


def test_argumentless_call_is_whole_only_when_the_engine_ended_normally() -> None:
    done = MessageTranslator(model="m")
    _run(done, [_call(0, "", tid="c", name="now"), _chunk({}, "tool_calls")])
    assert done.message()["content"] == [{"type": "tool_use", "id": "toolu_c", "name": "now", "input": {}}]
    assert done.message()["stop_reason"] == "tool_use"
    cut = MessageTranslator(model="m")
    _run(cut, [_call(0, "", tid="c", name="now"), _chunk({}, "length")])
    assert cut.message()["content"] == [] and cut.message()["stop_reason"] == "max_tokens"


def test_single_tool_call_keeps_the_first_whole_call_and_stops_reading() -> None:
    tr = MessageTranslator(model="m", single_tool_call=True)
    tr.start()
    _feed(tr, _call(0, '{"tz": "UTC"}', tid="call_1", name="get_time"))
    assert tr.stopped, "the one call allowed is whole: the route stops reading the engine"
    assert _feed(tr, _call(1, '{"tz": "UTC"}', tid="call_2", name="get_time")) == []
    tr.finish()
    msg = tr.message()
    assert [b["id"] for b in msg["content"]] == ["toolu_1"] and msg["stop_reason"] == "tool_use"
    parallel = MessageTranslator(model="m")
    _run(
        parallel,
        [
            _call(0, '{"tz": "UTC"}', tid="call_1", name="get_time"),
            _call(1, '{"tz": "UTC"}', tid="call_2", name="get_time"),
            _chunk({}, "tool_calls"),
        ],
    )
    assert [b["id"] for b in parallel.message()["content"]] == ["toolu_1", "toolu_2"]


def test_tool_ids_take_the_toolu_form() -> None:
    assert anthropic_tool_id("call_abc") == "toolu_abc"
    assert anthropic_tool_id("toolu_01XY") == "toolu_01XY"
    assert anthropic_tool_id("mkvgVmoCF5lbeLbm") == "toolu_mkvgVmoCF5lbeLbm"
    assert anthropic_tool_id("a.b/c d") == "toolu_a_b_c_d"
    fresh = anthropic_tool_id(None)
    assert fresh.startswith("toolu_") and len(fresh) == 30 and fresh != anthropic_tool_id("")
    taken: set[str] = set()
    first, second = anthropic_tool_id("call_0", taken=taken), anthropic_tool_id("call_0", taken=taken)
    assert first == "toolu_0" and second.startswith("toolu_0_") and taken == {first, second}


def test_tool_ids_round_trip_into_the_next_request() -> None:
    tr = MessageTranslator(model="m")
    _run(tr, [_call(0, '{"tz": "UTC"}', tid="call_9", name="get_time"), _chunk({}, "tool_calls")])
    answer = tr.message()["content"]
    tid = answer[0]["id"]
    body = {
        "model": "m",
        "max_tokens": 8,
        "messages": [
            *HI,
            {"role": "assistant", "content": answer},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tid, "content": "12:00"}]},
        ],
    }
    messages = to_openai(body).openai["messages"]
    assert messages[1]["tool_calls"][0]["id"] == messages[2]["tool_call_id"] == tid == "toolu_9"
    stray = json.loads(json.dumps(body))
    stray["messages"][2]["content"][0]["tool_use_id"] = "toolu_other"
    with pytest.raises(BadRequestError, match="no tool_use with id 'toolu_other'") as exc:
        to_openai(stray)
    assert exc.value.param == "messages[2].content[0].tool_use_id"


# ---- the request translation -----------------------------------------------------------------
def _body(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 8, "messages": HI, **extra}


def test_disable_parallel_tool_use_reaches_engine_and_translator() -> None:
    for kind in ({"type": "auto"}, {"type": "any"}, {"type": "tool", "name": "get_time"}):
        call = to_openai(_body(tools=[CLOCK_TOOL], tool_choice={**kind, "disable_parallel_tool_use": True}))
        assert call.openai["parallel_tool_calls"] is False and call.single_tool_call is True
    allowed = to_openai(_body(tools=[CLOCK_TOOL], tool_choice={"type": "auto"}))
    assert "parallel_tool_calls" not in allowed.openai and allowed.single_tool_call is False
    with pytest.raises(BadRequestError) as exc:
        to_openai(_body(tools=[CLOCK_TOOL], tool_choice={"type": "auto", "disable_parallel_tool_use": "yes"}))
    assert exc.value.param == "tool_choice.disable_parallel_tool_use"


def test_output_config_becomes_a_json_schema_response_format() -> None:
    want = {"type": "json_schema", "json_schema": {"name": "output", "schema": SCHEMA, "strict": True}}
    fmt = {"type": "json_schema", "schema": SCHEMA}
    assert to_openai(_body(output_config={"format": fmt})).openai["response_format"] == want
    assert to_openai(_body(output_format=fmt)).openai["response_format"] == want  # the older beta field
    assert "response_format" not in to_openai(_body(output_config={"effort": "low"})).openai
    assert "response_format" not in to_openai(_body(output_config={"format": None})).openai


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"output_config": "json"}, "output_config"),
        ({"output_config": {"format": "json"}}, "output_config.format"),
        ({"output_config": {"format": {"type": "json", "schema": SCHEMA}}}, "output_config.format.type"),
        ({"output_config": {"format": {"type": "json_schema"}}}, "output_config.format.schema"),
        ({"output_config": {"format": {"type": "json_schema", "schema": []}}}, "output_config.format.schema"),
        ({"output_format": {"type": "text"}}, "output_format.type"),
        (
            {"output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}, "grammar": "root ::= x"},
            "output_config",
        ),
    ],
)
def test_invalid_output_config_names_the_field(extra: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequestError) as exc:
        to_openai(_body(**extra))
    assert exc.value.param == param and param in exc.value.message


# ---- against a real server -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("anthropic-tools")
    models = link_models(base / "models", model_store / "tiny.gguf")
    write_tiny_gguf(models / "tools.gguf", TinySpec(seed=3, chat_template=HERMES_TOOLS))
    with running_server(base / "home", models) as s:
        yield s


@pytest.fixture
def client(server: ServerProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=120)


CUT = {"model": "tools", "max_tokens": 80, "messages": PREFILL, "tools": [WEATHER_TOOL]}


def _engine_arguments(server: ServerProcess) -> tuple[str, str | None]:
    """What the engine itself streams for the cut request: (arguments text, finish_reason)."""
    tool = {
        "type": "function",
        "function": {"name": "get_weather", "parameters": WEATHER_TOOL["input_schema"]},
    }
    body = {**CUT, "tools": [tool], "tool_choice": "required", "stream": True}
    args, finish = "", None
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            for choice in json.loads(line[6:]).get("choices") or ():
                for call in choice["delta"].get("tool_calls") or ():
                    args += call["function"].get("arguments") or ""
                finish = choice.get("finish_reason") or finish
    return args, finish


def test_cut_off_call_is_max_tokens_without_tool_use(
    server: ServerProcess, client: anthropic.Anthropic
) -> None:
    args, finish = _engine_arguments(server)
    assert finish == "length" and args.startswith("{"), "the engine must be cut inside the arguments"
    with pytest.raises(ValueError):
        json.loads(args)
    m = client.messages.create(**CUT, tool_choice={"type": "any"})
    assert m.stop_reason == "max_tokens"
    assert [b for b in m.content if b.type == "tool_use"] == []
    with client.messages.stream(**CUT, tool_choice={"type": "any"}) as stream:
        events = list(stream)
        final = stream.get_final_message()
    started = [e.content_block.type for e in events if e.type == "content_block_start"]
    assert "tool_use" not in started and final.stop_reason == "max_tokens"


def test_disable_parallel_tool_use_gives_one_toolu_call(client: anthropic.Anthropic) -> None:
    m = client.messages.create(
        model="tools",
        max_tokens=300,
        messages=PREFILL,
        tools=[CLOCK_TOOL, {**CLOCK_TOOL, "name": "get_time2"}],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    )
    calls = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and len(calls) == 1
    assert calls[0].id.startswith("toolu_") and calls[0].input == {"tz": "UTC"}
    # the id goes back in a tool_result and the next turn is accepted; a stray id is refused
    turn = [
        *PREFILL[:1],
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": calls[0].id, "name": calls[0].name, "input": calls[0].input}
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": calls[0].id, "content": "12:00"}],
        },
    ]
    again = client.messages.create(model="tools", max_tokens=3, messages=turn, tools=[CLOCK_TOOL])
    assert again.usage.input_tokens > 0 and again.stop_reason in ("max_tokens", "end_turn", "tool_use")
    turn[2]["content"][0]["tool_use_id"] = "toolu_stray"
    with pytest.raises(anthropic.BadRequestError, match="tool_use_id"):
        client.messages.create(model="tools", max_tokens=3, messages=turn, tools=[CLOCK_TOOL])


def test_streamed_call_has_a_toolu_id(client: anthropic.Anthropic) -> None:
    with client.messages.stream(
        model="tools", max_tokens=300, messages=PREFILL, tools=[CLOCK_TOOL], tool_choice={"type": "any"}
    ) as stream:
        final = stream.get_final_message()
    calls = [b for b in final.content if b.type == "tool_use"]
    assert calls and all(b.id.startswith("toolu_") and b.input == {"tz": "UTC"} for b in calls)
    assert final.stop_reason in ("tool_use", "max_tokens")


def test_output_config_schema_is_enforced(client: anthropic.Anthropic) -> None:
    fmt = {"format": {"type": "json_schema", "schema": SCHEMA}}
    m = client.messages.create(model="tiny", max_tokens=400, messages=HI, output_config=fmt)
    assert m.stop_reason == "end_turn" and [b.type for b in m.content] == ["text"]
    jsonschema.validate(json.loads(m.content[0].text), SCHEMA)
    with client.messages.stream(model="tiny", max_tokens=400, messages=HI, output_config=fmt) as stream:
        text = "".join(stream.text_stream)
    jsonschema.validate(json.loads(text), SCHEMA)


class Reading(pydantic.BaseModel):
    n: int
    color: Literal["red", "green"]


def test_sdk_parse_with_a_pydantic_model(client: anthropic.Anthropic) -> None:
    m = client.messages.parse(model="tiny", max_tokens=400, messages=HI, output_format=Reading)
    assert isinstance(m.parsed_output, Reading) and m.parsed_output.color in ("red", "green")


def test_invalid_output_config_is_a_400(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError, match=r"output_config\.format\.type") as exc:
        client.messages.create(
            model="tiny",
            max_tokens=8,
            messages=HI,
            output_config={"format": {"type": "xml", "schema": SCHEMA}},
        )
    assert isinstance(exc.value.body, dict) and exc.value.body["error"]["type"] == "invalid_request_error"
