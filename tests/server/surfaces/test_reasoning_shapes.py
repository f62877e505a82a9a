"""Reasoning comes back in each surface's own shape, streamed as it comes, through the official clients; and
the smaller agent gaps of issue 36: the thinking header on Chat Completions, message_start's input_tokens,
a max_tokens larger than the slot, and `/` answering."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest

from app.server.gateway.output_clamp import HEADER as CLAMPED
from app.server.gateway.output_clamp import clamp_output
from app.server.surfaces.anthropic.translate import thinking_signature
from tests.conftest import ServerProcess, link_models, running_server
from tests.support.thinkmodel import ANSWER, REASONED, THOUGHT, write_thinker

HI = [{"role": "user", "content": "hi"}]
PINNED = {"grammar": REASONED}
THOUGHT_SENT = THOUGHT + "\n"  # the engine keeps the newline before </think>
IGNORED = "switchyard-thinking-ignored"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("reasoning-shapes")
    models = link_models(base / "models", model_store / "tiny.gguf")
    write_thinker(models / "thinker.gguf")
    with running_server(base / "home", models, "--max-loaded", "2") as s:
        yield s


@pytest.fixture(scope="module")
def oa(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def claude(server: ServerProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def olla(server: ServerProcess) -> ollama.Client:
    return ollama.Client(host=server.url, timeout=60)


def _extra(obj: Any, name: str) -> Any:
    return (obj.model_extra or {}).get(name)


def test_chat_completions_pass_the_engines_reasoning_through(oa: openai.OpenAI) -> None:
    whole = oa.chat.completions.create(model="thinker", messages=HI, max_tokens=60, extra_body=PINNED)  # type: ignore[arg-type]
    message = whole.choices[0].message
    assert message.content == ANSWER and _extra(message, "reasoning_content") == THOUGHT_SENT
    stream = oa.chat.completions.create(
        model="thinker",
        messages=HI,  # type: ignore[arg-type]
        max_tokens=60,
        stream=True,
        extra_body=PINNED,
    )
    order: list[tuple[str, str]] = []
    for chunk in stream:
        for choice in chunk.choices:
            if think := _extra(choice.delta, "reasoning_content"):
                order.append(("reasoning", think))
            if choice.delta.content:
                order.append(("content", choice.delta.content))
    kinds = [k for k, _ in order]
    assert kinds.count("reasoning") > 1, "the reasoning arrives as it is made, not at the end"
    assert kinds.index("content") > max(i for i, k in enumerate(kinds) if k == "reasoning")
    assert "".join(t for k, t in order if k == "reasoning") == THOUGHT_SENT
    assert "".join(t for k, t in order if k == "content") == ANSWER


def test_responses_give_a_reasoning_item_and_its_events(oa: openai.OpenAI) -> None:
    whole = oa.responses.create(model="thinker", input="hi", max_output_tokens=60, extra_body=PINNED)
    assert [item.type for item in whole.output] == ["reasoning", "message"]
    reasoning = whole.output[0]
    assert reasoning.type == "reasoning" and reasoning.content is not None
    assert [(c.type, c.text) for c in reasoning.content] == [("reasoning_text", THOUGHT_SENT)]
    assert whole.output_text == ANSWER

    events = list(
        oa.responses.create(model="thinker", input="hi", max_output_tokens=60, stream=True, extra_body=PINNED)
    )
    types = [e.type for e in events]
    deltas = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
    assert len(deltas) > 1 and "".join(deltas) == THOUGHT_SENT
    # the reasoning item opens, streams and closes before the message item opens
    added = [e.item.type for e in events if e.type == "response.output_item.added"]
    assert added == ["reasoning", "message"]
    assert types.index("response.reasoning_text.done") < types.index("response.output_text.delta")
    done = events[-1]
    assert done.type == "response.completed" and done.response.output[0].type == "reasoning"


def test_anthropic_gives_signed_thinking_blocks(claude: anthropic.Anthropic) -> None:
    thinking = {"type": "enabled", "budget_tokens": 1024}
    whole = claude.messages.create(
        model="thinker",
        max_tokens=60,
        messages=HI,  # type: ignore[arg-type]
        thinking=thinking,  # type: ignore[arg-type]
        extra_body=PINNED,
    )
    first, second = whole.content
    assert first.type == "thinking" and first.thinking == THOUGHT_SENT
    assert first.signature == thinking_signature(THOUGHT_SENT)
    assert second.type == "text" and second.text == ANSWER

    with claude.messages.stream(
        model="thinker",
        max_tokens=60,
        messages=HI,  # type: ignore[arg-type]
        thinking=thinking,  # type: ignore[arg-type]
        extra_body=PINNED,
    ) as stream:
        events = [e for e in stream if e.type.startswith(("message_", "content_block_"))]  # the wire's
        final = stream.get_final_message()
    kinds = [(e.type, getattr(getattr(e, "delta", None), "type", None)) for e in events]
    assert kinds.count(("content_block_delta", "thinking_delta")) > 1
    starts = [e.content_block.type for e in events if e.type == "content_block_start"]
    assert starts == ["thinking", "text"]
    # the signature closes the thinking block: after its last thought, before its stop
    sig = kinds.index(("content_block_delta", "signature_delta"))
    assert kinds[sig + 1] == ("content_block_stop", None)
    assert final.content[0].type == "thinking" and final.content[0].thinking == THOUGHT_SENT
    assert final.content[0].signature == thinking_signature(THOUGHT_SENT)


def test_message_start_reports_the_prompts_tokens(claude: anthropic.Anthropic) -> None:
    with claude.messages.stream(model="tiny", max_tokens=4, messages=HI) as stream:  # type: ignore[arg-type]
        start = next(e for e in stream if e.type == "message_start")
        final = stream.get_final_message()
    # counted before the stream began, and the same count the engine reports at the end
    assert start.message.usage.input_tokens > 0
    assert start.message.usage.input_tokens == final.usage.input_tokens


def test_ollama_gives_thinking_on_chat_and_generate(olla: ollama.Client) -> None:
    chat = olla.chat(model="thinker", messages=HI, think=True, options=PINNED)
    assert chat.message.thinking == THOUGHT_SENT and chat.message.content == ANSWER
    pieces = list(olla.chat(model="thinker", messages=HI, think=True, options=PINNED, stream=True))
    thoughts = [p.message.thinking for p in pieces if p.message.thinking]
    assert len(thoughts) > 1 and "".join(thoughts) == THOUGHT_SENT
    assert "".join(p.message.content or "" for p in pieces) == ANSWER

    gen = olla.generate(model="thinker", prompt="hi", think=True, options=PINNED)
    assert gen.thinking == THOUGHT_SENT and gen.response == ANSWER
    pieces_g = list(olla.generate(model="thinker", prompt="hi", think=True, options=PINNED, stream=True))
    thoughts = [p.thinking for p in pieces_g if p.thinking]
    assert len(thoughts) > 1 and "".join(thoughts) == THOUGHT_SENT
    assert "".join(p.response for p in pieces_g) == ANSWER


def test_chat_completions_say_when_the_template_has_no_thinking_switch(oa: openai.OpenAI) -> None:
    def ask(model: str, **extra: Any) -> httpx.Headers:
        raw = oa.chat.completions.with_raw_response.create(
            model=model,
            messages=HI,  # type: ignore[arg-type]
            max_tokens=2,
            **extra,
        )
        return raw.headers

    assert "has no thinking switch" in ask("tiny", reasoning_effort="low")[IGNORED]
    assert IGNORED not in ask("thinker", reasoning_effort="low")
    assert IGNORED not in ask("tiny")  # no thinking asked for: nothing to say


def test_clamp_output_cuts_only_counts_above_the_slot() -> None:
    assert clamp_output({"max_tokens": 100}, slot=2048, model="m") is None
    assert (
        clamp_output({"max_tokens": True}, slot=1, model="m") is None
    )  # not a count: the engine's to refuse
    body, header = clamp_output({"max_tokens": 32000, "n_predict": 5}, slot=2048, model="m") or ({}, {})
    assert body == {"max_tokens": 2048, "n_predict": 5}
    assert "max_tokens 32000 is more than the 2048 tokens" in header[CLAMPED]


def test_a_max_tokens_above_the_slot_is_clamped_and_said(
    server: ServerProcess, oa: openai.OpenAI, claude: anthropic.Anthropic
) -> None:
    oa.chat.completions.create(model="tiny", messages=HI, max_tokens=1)  # type: ignore[arg-type]  # loaded
    big = oa.chat.completions.with_raw_response.create(
        model="tiny", messages=HI, max_tokens=32000, stop=["a"]
    )  # type: ignore[arg-type]
    assert big.http_response.status_code == 200
    assert "max_tokens 32000 is more than the 2048 tokens" in big.headers[CLAMPED]
    fits = oa.chat.completions.with_raw_response.create(model="tiny", messages=HI, max_tokens=2)  # type: ignore[arg-type]
    assert CLAMPED.lower() not in fits.headers

    with oa.chat.completions.with_streaming_response.create(
        model="tiny",
        messages=HI,  # type: ignore[arg-type]
        max_tokens=32000,
        stream=True,
        extra_body={"grammar": 'root ::= "ok"'},
    ) as streamed:
        assert "2048" in streamed.headers[CLAMPED]
        assert "ok" in streamed.read().decode()

    # Claude Code's 32000 on the Anthropic surface: the same
    raw = claude.messages.with_raw_response.create(
        model="tiny",
        max_tokens=32000,
        messages=HI,  # type: ignore[arg-type]
        extra_body={"grammar": 'root ::= "ok"'},
    )
    assert raw.parse().content[0].type == "text" and "2048" in raw.headers[CLAMPED]


def test_root_answers_head_and_get(server: ServerProcess) -> None:
    head = httpx.head(server.url + "/", timeout=10)
    assert head.status_code == 200
    got = httpx.get(server.url + "/", timeout=10)
    assert got.status_code == 200 and got.json()["api"] == "/v1"
    browser = httpx.get(server.url + "/", headers={"Accept": "text/html"}, timeout=10)
    assert browser.status_code == 302 and browser.headers["location"] == "/ui"
