"""OpenAI request bodies -> mistralrs request fields, and mistralrs answers -> OpenAI JSON, for our worker.

Standard library only: the worker may run in the engine's own virtual environment (workers/params.py).
Fields this lane cannot honour are refused with a 400 that says so, never dropped silently; the one
exception is `seed`, which clients send by habit: the Python Runner takes a seed only when it loads.
The grammar field has mistral.rs's own server's shape, `{"type": "regex"|"lark"|"json_schema"|
"llguidance", "value": ...}`; `response_format` json_object / json_schema is turned into one.
`LaneParams` is what the worker is started with: MistralRsParams and the Runner's speculation.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from app.lanes.workers.params import MistralRsParams

GRAMMAR_TYPES = ("regex", "lark", "json_schema", "llguidance")
_FINISH = {"stop", "length", "tool_calls", "content_filter"}
_ROLES = ("system", "developer", "user", "assistant")


@dataclass(frozen=True)
class LaneParams(MistralRsParams):
    """The worker's params: the model, and the speculation the Runner loads with (docs/engines.md, the
    mistral.rs lane): an MTP assistant's folder, `mtp_model` ("": none), and the tokens it proposes per
    step, `mtp_n_predict` (0: the assistant's own default)."""

    mtp_model: str = ""
    mtp_n_predict: int = 0


class BadBody(ValueError):
    """A request the worker refuses with 400; the message says what to send instead."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


@dataclass(frozen=True)
class Call:
    """What a request asks of the Runner: the request's keyword arguments and how to answer."""

    fields: dict[str, Any]
    stream: bool
    include_usage: bool


@dataclass(frozen=True)
class Reply:
    """The identity every answer (and every chunk of one stream) carries."""

    id: str
    model: str
    created: int

    @classmethod
    def new(cls, prefix: str, model: str) -> Reply:
        return cls(f"{prefix}-{uuid.uuid4().hex}", model, int(time.time()))


def _number(body: dict[str, Any], name: str, low: float, high: float) -> float | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not low <= v <= high:
        raise BadBody(f"`{name}` must be a number from {low:g} to {high:g}", param=name)
    return float(v)


def _int(body: dict[str, Any], name: str, low: int) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise BadBody(f"`{name}` must be an integer of at least {low}", param=name)
    return v


def _flag(body: dict[str, Any], name: str) -> bool:
    v = body.get(name, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise BadBody(f"`{name}` must be true or false", param=name)
    return v


def _stop(body: dict[str, Any]) -> list[str] | None:
    v = body.get("stop")
    if v is None:
        return None
    seqs = [v] if isinstance(v, str) else v
    if not isinstance(seqs, list) or not all(isinstance(s, str) and s for s in seqs):
        raise BadBody("`stop` must be a non-empty string or a list of them", param="stop")
    return seqs or None


def _logit_bias(body: dict[str, Any]) -> dict[int, float] | None:
    v = body.get("logit_bias")
    if v is None:
        return None
    bad = BadBody("`logit_bias` must map token ids to numbers", param="logit_bias")
    if not isinstance(v, dict):
        raise bad
    out: dict[int, float] = {}
    for key, bias in v.items():
        if isinstance(bias, bool) or not isinstance(bias, int | float):
            raise bad
        try:
            out[int(key)] = float(bias)
        except ValueError:
            raise bad from None
    return out or None


def _grammar(body: dict[str, Any]) -> dict[str, Any]:
    grammar, fmt = body.get("grammar"), body.get("response_format")
    if grammar is not None and fmt not in (None, {"type": "text"}):
        raise BadBody("send either `grammar` or `response_format`, not both", param="grammar")
    if isinstance(grammar, str):
        raise BadBody(
            'mistral.rs does not read GBNF grammars; send `grammar` as {"type": "lark" (or "regex", '
            '"json_schema", "llguidance"), "value": ...}',
            param="grammar",
        )
    if grammar is not None:
        kind = grammar.get("type") if isinstance(grammar, dict) else None
        value = grammar.get("value") if isinstance(grammar, dict) else None
        if kind not in GRAMMAR_TYPES or value is None:
            raise BadBody(
                f'`grammar` must be {{"type": one of {", ".join(GRAMMAR_TYPES)}, "value": ...}}',
                param="grammar",
            )
        text = value if isinstance(value, str) else json.dumps(value)
        return {"grammar": text, "grammar_type": kind}
    if fmt is None:
        return {}
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return {}
    if kind == "json_object":
        return {"grammar": json.dumps({"type": "object"}), "grammar_type": "json_schema"}
    spec = fmt.get("json_schema") if isinstance(fmt, dict) else None
    if kind == "json_schema" and isinstance(spec, dict) and isinstance(spec.get("schema"), dict):
        return {"grammar": json.dumps(spec["schema"]), "grammar_type": "json_schema"}
    raise BadBody(
        '`response_format` must be {"type": "text"}, {"type": "json_object"} or '
        '{"type": "json_schema", "json_schema": {"schema": {...}}}',
        param="response_format",
    )


def _refuse_unsupported(body: dict[str, Any]) -> None:
    if body.get("tools"):
        raise BadBody(
            "tool calling is not available on the mistral.rs lane; run this model on llama.cpp for tools",
            param="tools",
        )
    if body.get("logprobs") or body.get("top_logprobs"):
        raise BadBody("logprobs are not available on the mistral.rs lane", param="logprobs")
    if body.get("n", 1) not in (1, None):
        raise BadBody("the mistral.rs lane answers one choice per request (`n` = 1)", param="n")


def _sampling(body: dict[str, Any]) -> dict[str, Any]:
    _refuse_unsupported(body)
    if body.get("seed") is not None:
        _int(body, "seed", -(2**63))  # accepted and checked, but the Runner only takes a seed at load
    max_tokens = _int(body, "max_tokens", 1)
    if max_tokens is None:
        max_tokens = _int(body, "max_completion_tokens", 1)
    fields: dict[str, Any] = {
        "max_tokens": max_tokens,
        "temperature": _number(body, "temperature", 0, 2),
        "top_p": _number(body, "top_p", 0, 1),
        "min_p": _number(body, "min_p", 0, 1),
        "presence_penalty": _number(body, "presence_penalty", -2, 2),
        "frequency_penalty": _number(body, "frequency_penalty", -2, 2),
        # llama.cpp (and the Ollama surface) name it repeat_penalty
        "repetition_penalty": _number(body, "repetition_penalty", 0, 10)
        or _number(body, "repeat_penalty", 0, 10),
        "top_k": _int(body, "top_k", 0),
        "stop_seqs": _stop(body),
        "logit_bias": _logit_bias(body),
        "ignore_eos": _flag(body, "ignore_eos"),
        **_grammar(body),
    }
    return {k: v for k, v in fields.items() if v is not None}


def _stream_flags(body: dict[str, Any]) -> tuple[bool, bool]:
    stream = _flag(body, "stream")
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise BadBody("`stream_options` must be an object", param="stream_options")
    usage = (opts or {}).get("include_usage", False)
    if not isinstance(usage, bool):
        raise BadBody("`stream_options.include_usage` must be true or false", param="stream_options")
    return stream, usage


def _content(message: dict[str, Any], i: int) -> str:
    content = message.get("content")
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        texts = []
        for part in content:
            text = part.get("text") if isinstance(part, dict) and part.get("type") == "text" else None
            if not isinstance(text, str):
                raise BadBody(
                    f"messages[{i}].content: the mistral.rs lane reads text parts only "
                    '({"type": "text", "text": ...}); images and audio are not supported here',
                    param=f"messages[{i}].content",
                )
            texts.append(text)
        return "".join(texts)
    raise BadBody(f"messages[{i}].content must be a string or a list of text parts", param="messages")


def chat_call(body: dict[str, Any]) -> Call:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadBody("`messages` must be a non-empty list of {role, content} objects", param="messages")
    out: list[dict[str, str]] = []
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        if role == "tool":
            raise BadBody(
                "tool messages are not available on the mistral.rs lane (no tool calling here)",
                param=f"messages[{i}]",
            )
        if role not in _ROLES or not isinstance(m, dict):
            raise BadBody(
                f"messages[{i}] must be an object with a role ({', '.join(_ROLES)}) and a content",
                param=f"messages[{i}]",
            )
        out.append({"role": "system" if role == "developer" else role, "content": _content(m, i)})
    stream, usage = _stream_flags(body)
    fields: dict[str, Any] = {"messages": out, **_sampling(body)}
    kwargs = body.get("chat_template_kwargs")
    if isinstance(kwargs, dict) and isinstance(kwargs.get("enable_thinking"), bool):
        fields["enable_thinking"] = kwargs["enable_thinking"]  # what the Anthropic and Ollama surfaces send
    return Call(fields, stream, usage)


def completion_call(body: dict[str, Any]) -> Call:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise BadBody(
            "`prompt` must be one string here (the mistral.rs lane takes one prompt, as text, per request)",
            param="prompt",
        )
    if body.get("best_of", 1) not in (1, None):
        raise BadBody("the mistral.rs lane does not do `best_of`; leave it at 1", param="best_of")
    suffix = body.get("suffix")
    if suffix is not None and not isinstance(suffix, str):
        raise BadBody("`suffix` must be a string", param="suffix")
    stream, usage = _stream_flags(body)
    fields = {"prompt": prompt, "echo_prompt": _flag(body, "echo"), **_sampling(body)}
    if suffix:
        fields["suffix"] = suffix
    return Call(fields, stream, usage)


# ---- answers ---------------------------------------------------------------------------------------


def finish_reason(reason: str | None) -> str | None:
    if reason is None:
        return None
    return reason if reason in _FINISH else "stop"  # e.g. "canceled": the engine stopped the sequence


def usage_json(usage: Any) -> dict[str, Any] | None:
    if usage is None:
        return None
    out: dict[str, Any] = {
        "prompt_tokens": int(usage.prompt_tokens),
        "completion_tokens": int(usage.completion_tokens),
        "total_tokens": int(usage.total_tokens),
    }
    details = getattr(usage, "prompt_tokens_details", None)
    if details is not None and getattr(details, "cached_tokens", None) is not None:
        out["prompt_tokens_details"] = {"cached_tokens": int(details.cached_tokens)}
    return out


def chat_response(
    reply: Reply, *, content: str, reasoning: str, finish: str | None, usage: dict[str, Any] | None
) -> dict:
    message = {"role": "assistant", "content": content}
    if reasoning:
        message["reasoning_content"] = reasoning
    return {
        "id": reply.id,
        "object": "chat.completion",
        "created": reply.created,
        "model": reply.model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish or "stop",
            }
        ],
        "usage": usage,
    }


def chat_chunk(
    reply: Reply, *, delta: dict[str, Any] | None, finish: str | None = None, usage: dict | None = None
) -> dict[str, Any]:
    """One event of a chat stream; `delta=None` makes the usage-only event (no choices)."""
    choices = (
        [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
    )
    out: dict[str, Any] = {
        "id": reply.id,
        "object": "chat.completion.chunk",
        "created": reply.created,
        "model": reply.model,
        "choices": choices,
    }
    if usage is not None:
        out["usage"] = usage
    return out


def completion_response(reply: Reply, *, text: str, finish: str | None, usage: dict | None) -> dict:
    return {
        "id": reply.id,
        "object": "text_completion",
        "created": reply.created,
        "model": reply.model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish or "stop"}],
        "usage": usage,
    }


def completion_chunk(
    reply: Reply, *, text: str | None, finish: str | None = None, usage: dict | None = None
) -> dict[str, Any]:
    """One event of a completion stream; `text=None` makes the usage-only event (no choices)."""
    out = completion_response(reply, text=text or "", finish=finish, usage=usage)
    out["choices"][0]["finish_reason"] = finish
    if text is None:
        out["choices"] = []
    if usage is None:
        del out["usage"]
    return out


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"
