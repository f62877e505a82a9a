"""A non-streamed chat or completion for a local llama.cpp engine, asked of it as a stream and answered whole.

llama.cpp keeps generating a non-streamed answer to the end after its client has gone: only a stream's
failed write stops it. So the gateway asks for a stream, reads its events until `[DONE]` and builds the
answer llama.cpp would have sent whole (the same fields: message or text, logprobs, finish_reason, usage,
timings); when the client goes away the stream's connection is dropped and the engine frees its slot.
"""

from __future__ import annotations

import json
from typing import Any

from app.chat.deltas import StreamReader
from app.server.gateway.completion_ids import completion_id

_OBJECT = {"chat": "chat.completion", "completions": "text_completion"}


class WholeAnswer:
    """Folds the events of an OpenAI chat or completion stream into the non-streamed answer. The events are
    read by the one stream reader (app/chat/deltas.py); the folding keeps what deltas leave out (logprobs,
    timings, every top-level field)."""

    def __init__(self, route: str) -> None:
        self.route = route
        self._reader = StreamReader()
        self._top: dict[str, Any] = {}
        self._choices: dict[int, dict[str, Any]] = {}

    @property
    def done(self) -> bool:
        return self._reader.done

    def feed(self, data: bytes) -> None:
        """Take the stream's bytes as they come (events may be cut anywhere); raises StreamRefusal."""
        for chunk in self._reader.chunks(data):
            for key, value in chunk.items():
                if key not in ("choices", "object"):
                    self._top[key] = value
            for choice in chunk.get("choices") or ():
                if isinstance(choice, dict):
                    self._choice(choice)

    def _choice(self, choice: dict[str, Any]) -> None:
        index = choice.get("index", 0)
        got = self._choices.setdefault(index if isinstance(index, int) else 0, _blank())
        if choice.get("finish_reason") is not None:
            got["finish_reason"] = choice["finish_reason"]
        logprobs = choice.get("logprobs")
        if isinstance(logprobs, dict) and isinstance(logprobs.get("content"), list):
            got["logprobs"].extend(logprobs["content"])
        if isinstance(choice.get("text"), str):
            got["text"] += choice["text"]
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return
        if isinstance(delta.get("content"), str):
            got["text"] += delta["content"]
        if isinstance(delta.get("reasoning_content"), str):
            got["reasoning"] += delta["reasoning_content"]
        for call in delta.get("tool_calls") or ():
            if isinstance(call, dict):
                _merge_call(got["calls"], call)

    def answer(self) -> dict[str, Any]:
        """The whole answer, as the engine would have sent it unstreamed."""
        choices = [self._whole_choice(i, c) for i, c in sorted(self._choices.items())]
        out = {"choices": choices, **self._top, "object": _OBJECT[self.route]}
        if self.route == "completions":
            completion_id(out)
        return out

    def _whole_choice(self, index: int, got: dict[str, Any]) -> dict[str, Any]:
        logprobs = {"content": got["logprobs"]} if got["logprobs"] else None
        if self.route == "completions":
            return {
                "text": got["text"],
                "index": index,
                "logprobs": logprobs,
                "finish_reason": got["finish_reason"],
            }
        message: dict[str, Any] = {"role": "assistant", "content": got["text"] or None}
        if got["calls"]:
            message["tool_calls"] = [got["calls"][k] for k in sorted(got["calls"])]
        elif message["content"] is None:
            message["content"] = ""
        if got["reasoning"]:
            message["reasoning_content"] = got["reasoning"]
        out: dict[str, Any] = {"finish_reason": got["finish_reason"], "index": index, "message": message}
        if logprobs is not None:
            out["logprobs"] = logprobs
        return out


def _blank() -> dict[str, Any]:
    return {"text": "", "reasoning": "", "calls": {}, "logprobs": [], "finish_reason": None}


def _merge_call(calls: dict[int, dict[str, Any]], part: dict[str, Any]) -> None:
    """One streamed piece of a tool call into the call of its index: id, type and name once, the
    arguments appended."""
    index = part.get("index", len(calls))
    call = calls.setdefault(
        index if isinstance(index, int) else len(calls),
        {"type": "function", "function": {"name": "", "arguments": ""}},
    )
    if part.get("id"):
        call["id"] = part["id"]
    if part.get("type"):
        call["type"] = part["type"]
    fn = part.get("function")
    if isinstance(fn, dict):
        if fn.get("name"):
            call["function"]["name"] += fn["name"]
        if isinstance(fn.get("arguments"), str):
            call["function"]["arguments"] += fn["arguments"]


def stream_body(body: dict[str, Any]) -> bytes:
    """The request as a stream, with the usage report a whole answer carries."""
    return json.dumps({**body, "stream": True, "stream_options": {"include_usage": True}}).encode()
