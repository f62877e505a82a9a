"""A tool request's answer taken without llama.cpp's chat-output parser, when that parser refused it.

llama.cpp (the xllamacpp build we ship) parses every answer to a request with `tools` through its
"peg-native" chat format, and refuses the whole answer with a 500 ("does not match the expected peg-native
format") when the text holds malformed UTF-8: a model that writes raw byte tokens, or an answer cut inside
a multi-byte character. A custom grammar cannot be sent beside `tools`, and `parse_tool_calls: false`
does not skip the parser (issue 31, defect 6). So a whole answer that the parser refused is asked again on
the raw path: the engine renders the same prompt (`/apply-template`, messages and tools), `/completion`
generates from it with the request's own sampling (seed included), and the calls are read from the text
by tool_recovery.parse_calls.

Only where a free answer was allowed (`tool_choice` absent, "auto" or "none"): a required or named call
was enforced by the engine's grammar, which the raw path would not keep, so that refusal stays an error.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

from app.chat.deltas import Delta, Finish, Text, ToolCallPart, Usage
from app.core.errors import SwitchyardError, UpstreamRefusedError
from app.lanes.lane_requests import speaks_llama_server
from app.lanes.target import Target
from app.server.gateway.tool_recovery import parse_calls

UNPARSED = "engine_output_unparsed"
# chat-only fields: the prompt carries the messages and tools once rendered; the rest is sampling and slot
_CHAT_ONLY = (
    "messages",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "stream",
    "stream_options",
    "response_format",
    "json_schema",
    "parse_tool_calls",
    "chat_template_kwargs",
    "reasoning_format",
    "max_completion_tokens",
)
_STOP_REASONS = {"limit": "length"}

PostJson = Callable[[Target, str, dict[str, Any]], Awaitable[Any]]


def takes_raw_path(exc: SwitchyardError, body: dict[str, Any], *, engine: str) -> bool:
    """Whether a refused chat `body` is asked again raw: the engine's own parser rejected an answer to a
    llama.cpp request with tools that allowed a free answer."""
    refused = isinstance(exc, UpstreamRefusedError) and exc.code == UNPARSED
    free = body.get("tool_choice") in (None, "auto", "none")
    return refused and bool(body.get("tools")) and free and speaks_llama_server(engine)


def completion_body(body: dict[str, Any], *, prompt: str) -> dict[str, Any]:
    """The `/completion` body for chat `body` rendered as `prompt`: its sampling, seed, slot and adapter
    fields kept, its output limit as `n_predict`."""
    out = {k: v for k, v in body.items() if k not in _CHAT_ONLY}
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is not None and "n_predict" not in out:
        out["n_predict"] = limit
    out.pop("max_tokens", None)
    out["prompt"] = prompt
    return out


def chat_answer(raw: dict[str, Any], *, model: str, allow_calls: bool = True) -> dict[str, Any]:
    """A Chat Completions answer from llama.cpp's `/completion` answer `raw`: the calls written in its
    text as `tool_calls` (finish_reason "tool_calls"), else the text as content. `allow_calls` False (the
    request's `tool_choice: "none"`): the text is the answer whatever it holds."""
    text = str(raw.get("content") or "")
    calls, content = parse_calls(text) if allow_calls else ([], text)
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = calls
        finish = "tool_calls"
    else:
        message["content"] = text
        finish = _STOP_REASONS.get(str(raw.get("stop_type")), "stop")
    prompt, completion = int(raw.get("tokens_evaluated") or 0), int(raw.get("tokens_predicted") or 0)
    answer: dict[str, Any] = {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }
    if isinstance(raw.get("timings"), dict):
        answer["timings"] = raw["timings"]
    return answer


async def raw_chat(post_json: PostJson, target: Target, body: dict[str, Any]) -> dict[str, Any]:
    """The Chat Completions answer to `body` (a dict), generated on the raw path (module docstring)."""
    rendered = await post_json(
        target, "/apply-template", {"messages": body.get("messages") or [], "tools": body["tools"]}
    )
    prompt = rendered.get("prompt") if isinstance(rendered, dict) else None
    if not isinstance(prompt, str):
        raise target.garbled("/apply-template")
    raw = await post_json(target, "/completion", completion_body(body, prompt=prompt))
    if not isinstance(raw, dict):
        raise target.garbled("/completion")
    return chat_answer(
        raw, model=str(body.get("model") or target.model_id), allow_calls=body.get("tool_choice") != "none"
    )


async def raw_tool_answer(post_json: PostJson, target: Target, body: dict[str, Any]) -> bytes:
    """The whole Chat Completions answer to `body` as the OpenAI surface sends it."""
    return json.dumps(await raw_chat(post_json, target, body), ensure_ascii=False).encode()


def answer_deltas(answer: dict[str, Any]) -> list[Delta]:
    """A whole Chat Completions answer as the deltas a translated surface folds: its text, its calls,
    its finish, then its usage (the order llama.cpp streams them in)."""
    choice = answer["choices"][0]
    message = choice["message"]
    out: list[Delta] = [Text(message["content"])] if message.get("content") else []
    for i, call in enumerate(message.get("tool_calls") or ()):
        fn = call["function"]
        out.append(ToolCallPart(index=i, id=call["id"], name=fn["name"], arguments=fn["arguments"]))
    out.append(Finish(choice["finish_reason"]))
    usage = answer["usage"]
    out.append(Usage(usage["prompt_tokens"], usage["completion_tokens"], timings=answer.get("timings")))
    return out


async def raw_tool_deltas(
    post_json: PostJson, target: Target, body: dict[str, Any]
) -> AsyncGenerator[Delta, None]:
    """The raw path's answer to `body` as deltas, for the translated surfaces (gateway/runner.py)."""
    for delta in answer_deltas(await raw_chat(post_json, target, body)):
        yield delta
