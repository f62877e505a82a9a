"""The one reader of an engine's OpenAI chat/completion stream: bytes in, typed deltas out.

Every consumer of a token stream reads it here — the Anthropic, Responses and Ollama translators in the
server, and the desktop Chat page through `app/chat/client.py` — so that the shape of an OpenAI chunk is
known in one place. Pure: no I/O, no aiohttp; the caller feeds bytes as they arrive.

An SSE `data:` line is one JSON chunk; `[DONE]` ends the stream; llama.cpp's `error:` line (its way to fail
after the headers went out) and an `{"error": ...}` object are refusals, raised as `StreamRefusal` with the
payload so the caller can word it for its lane.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("switchyard.deltas")


@dataclass(frozen=True, slots=True)
class Text:
    text: str


@dataclass(frozen=True, slots=True)
class Reasoning:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallPart:
    """A piece of one tool call: the first piece of a call has its id and name, later ones add arguments."""

    index: int
    id: str | None
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Finish:
    reason: str  # "stop", "length", "tool_calls", ...


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None = None
    timings: dict[str, Any] | None = None  # llama.cpp's own figures (prompt_ms, predicted_ms, ...)


Delta = Text | Reasoning | ToolCallPart | Finish | Usage


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def timing_figures(timings: dict[str, Any] | None) -> dict[str, float | int]:
    """What a stats line shows of llama.cpp's `timings`: prompt and generation speed (tokens/s) and, when
    speculative decoding drafted anything, the drafted and accepted token counts (absent otherwise)."""
    t = timings or {}
    out: dict[str, float | int] = {}
    for key, name in (("prompt_per_second", "prompt_per_s"), ("predicted_per_second", "gen_per_s")):
        value = _number(t.get(key))
        if value is not None and value > 0:
            out[name] = round(value, 1)
    drafted, accepted = _int(t.get("draft_n")), _int(t.get("draft_n_accepted"))
    if drafted:  # llama.cpp leaves both out when nothing was drafted
        out["draft_n"] = drafted
        out["draft_accepted"] = accepted or 0
    return out


class StreamRefusal(Exception):
    """The engine failed inside the stream; `payload` is what it said (JSON or text)."""

    def __init__(self, payload: bytes) -> None:
        super().__init__(payload.decode("utf-8", "replace"))
        self.payload = payload


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def chunk_deltas(chunk: dict[str, Any]) -> list[Delta]:
    """The deltas of one chunk of choice 0, in the order a reader wants them: reasoning, text, tool call
    pieces, the finish reason, then the usage (llama.cpp sends usage and timings in the last chunk)."""
    out: list[Delta] = []
    for choice in chunk.get("choices") or ():
        if not isinstance(choice, dict) or choice.get("index", 0) != 0:
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict):
            think = delta.get("reasoning_content")
            if isinstance(think, str) and think:
                out.append(Reasoning(think))
            text = delta.get("content")
        else:
            text = choice.get("text")  # /v1/completions
        if isinstance(text, str) and text:
            out.append(Text(text))
        for call in (delta.get("tool_calls") if isinstance(delta, dict) else None) or ():
            if isinstance(call, dict):
                out.append(_tool_part(call))
        if isinstance(choice.get("finish_reason"), str):
            out.append(Finish(choice["finish_reason"]))
    usage = chunk.get("usage")
    timings = chunk.get("timings") if isinstance(chunk.get("timings"), dict) else None
    if isinstance(usage, dict) or timings is not None:
        usage = usage if isinstance(usage, dict) else {}
        details = usage.get("prompt_tokens_details")
        cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else None
        out.append(
            Usage(_int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens")), cached, timings)
        )
    elif isinstance(progress := chunk.get("prompt_progress"), dict) and _int(progress.get("total")):
        # llama.cpp's `return_progress`: the prompt's size as its first chunk, before the first token
        out.append(Usage(_int(progress["total"]), None))
    return out


def _tool_part(call: dict[str, Any]) -> ToolCallPart:
    fn = call.get("function") if isinstance(call.get("function"), dict) else {}
    assert isinstance(fn, dict)
    name, args = fn.get("name"), fn.get("arguments")
    return ToolCallPart(
        index=_int(call.get("index")) or 0,
        id=call["id"] if isinstance(call.get("id"), str) and call["id"] else None,
        name=name if isinstance(name, str) else "",
        # an engine that sends the arguments as an object (not a JSON string) gets them as JSON text
        arguments=args if isinstance(args, str) else json.dumps(args) if isinstance(args, dict) else "",
    )


def answer_deltas(answer: dict[str, Any]) -> list[Delta]:
    """A whole (non-streamed) chat or completion answer as the deltas a stream of it would carry."""
    out: list[Delta] = []
    for choice in answer.get("choices") or ():
        if not isinstance(choice, dict) or choice.get("index", 0) != 0:
            continue
        msg = choice.get("message")
        as_chunk: dict[str, Any] = {"finish_reason": choice.get("finish_reason")}
        if isinstance(msg, dict):
            calls = [
                {**c, "index": i} for i, c in enumerate(msg.get("tool_calls") or ()) if isinstance(c, dict)
            ]
            as_chunk["delta"] = {**msg, "tool_calls": calls}
        else:
            as_chunk["text"] = choice.get("text")
        out += chunk_deltas({"choices": [as_chunk]})
    out += chunk_deltas({"usage": answer.get("usage"), "timings": answer.get("timings")})
    return out


class StreamReader:
    """Feed the bytes of an event stream; get the JSON chunks of its `data:` lines until `[DONE]`."""

    __slots__ = ("_buf", "done")

    def __init__(self) -> None:
        self._buf = b""
        self.done = False

    def chunks(self, data: bytes) -> list[dict[str, Any]]:
        """The complete chunks in `data` (plus what an earlier call left unfinished). Raises StreamRefusal."""
        out: list[dict[str, Any]] = []
        for payload in self._payloads(data):
            if (obj := self._chunk(payload)) is not None:
                out.append(obj)
        return out

    def deltas(self, data: bytes) -> list[Delta]:
        """The deltas of the complete chunks in `data`. A chunk that carries only text (all but a stream's
        first and last few) becomes its Text without a JSON object built for it."""
        out: list[Delta] = []
        for payload in self._payloads(data):
            if (text := plain_text(payload)) is not None:
                out.append(Text(text))
            elif (obj := self._chunk(payload)) is not None:
                out += chunk_deltas(obj)
        return out

    def _payloads(self, data: bytes) -> list[bytes]:
        """The `data:` payloads of the complete lines in `data`, up to `[DONE]`. Raises StreamRefusal for an
        `error:` line."""
        buf = self._buf + data if self._buf else data
        out: list[bytes] = []
        start = 0
        while not self.done:
            end = buf.find(b"\n", start)
            if end < 0:
                break
            line = buf[start:end].strip()
            start = end + 1
            if line.startswith(b"error:"):
                self._buf = b""
                raise StreamRefusal(line[6:].strip())
            if not line.startswith(b"data:"):
                continue  # blank separators, comments, `event:` names
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
                break
            out.append(payload)
        self._buf = buf[start:]
        return out

    def _chunk(self, payload: bytes) -> dict[str, Any] | None:
        """One payload as its JSON chunk; None (logged) when it is not a JSON object. Raises StreamRefusal
        for an error object."""
        try:
            obj = json.loads(payload)
        except ValueError:
            log.warning("the engine sent a stream line that is not JSON: %r", payload[:200])
            return None
        if not isinstance(obj, dict):
            return None
        if "error" in obj and "choices" not in obj:
            self._buf = b""
            raise StreamRefusal(payload)
        return obj


# llama.cpp's chunk for one piece of text, up to the text itself; what follows the text's closing quote
# must close the delta, the choice and the list, and the chunk's other keys must carry no usage or timings
_TEXT_HEAD = b'{"choices":[{"finish_reason":null,"index":0,"delta":{"content":"'
_TEXT_END = b'"}}],'


def plain_text(payload: bytes) -> str | None:
    """The text of a chunk that carries nothing but text, read from its bytes; None for any other chunk
    (reasoning, a tool call, a finish, usage, an escaped character, another engine's layout), which is
    then read as JSON. Same answer as chunk_deltas for the chunks it accepts."""
    if not payload.startswith(_TEXT_HEAD):
        return None
    begin = len(_TEXT_HEAD)
    quote = payload.find(b'"', begin)
    if quote < 0 or payload.find(b"\\", begin, quote) >= 0:
        return None  # an escape: the closing quote may be elsewhere, and the text needs JSON's decoding
    if not payload.startswith(_TEXT_END, quote):
        return None
    if b'"usage"' in payload or b'"timings"' in payload or b'"prompt_progress"' in payload:
        return None  # what chunk_deltas reads as Usage
    if quote == begin or not payload.endswith(b"}"):
        return None  # empty text (no delta), or a truncated chunk: JSON says what it is
    try:
        return payload[begin:quote].decode()
    except UnicodeDecodeError:
        return None
