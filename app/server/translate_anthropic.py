"""Anthropic Messages <-> OpenAI chat completions: the request, the answer, and the event stream.

The engine is always asked to stream; `MessageTranslator` turns each OpenAI chunk into the Anthropic
events it implies (and, for a non-streaming client, also builds the final message from them).
Stop sequences are matched here, not by the engine: llama.cpp drops the matched string and does not
say which one matched, and Anthropic's answer names it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app.core.errors import LaneBusyError, SwitchyardError
from app.server.translate_engine import parse_arguments
from app.server.validate import bad as _bad
from app.server.validate import typed_field as _field

Event = tuple[str, dict[str, Any]]
_NUM = (int, float)
_SKIPPED_BLOCKS = {"thinking", "redacted_thinking"}  # the engine cannot take a signed thought back


@dataclass(frozen=True)
class MessagesCall:
    """A validated Anthropic request and the OpenAI body that carries it to the engine."""

    model: str
    stream: bool
    stop_sequences: tuple[str, ...]
    has_images: bool
    openai: dict[str, Any]


def new_message_id() -> str:
    return "msg_" + uuid.uuid4().hex[:24]


# ---- request -------------------------------------------------------------------------------------
def image_url(block: dict[str, Any], where: str) -> str:
    """An Anthropic image block's source as the URL an OpenAI image part carries."""
    src = block.get("source")
    if not isinstance(src, dict):
        raise _bad(f"{where}.source must be an object", f"{where}.source")
    if src.get("type") == "base64":
        media, data = src.get("media_type"), src.get("data")
        if not isinstance(media, str) or not isinstance(data, str):
            raise _bad(f"{where}.source needs string 'media_type' and 'data'", f"{where}.source")
        return f"data:{media};base64,{data}"
    if src.get("type") == "url" and isinstance(src.get("url"), str):
        return str(src["url"])
    raise _bad(f"{where}.source.type must be 'base64' or 'url'", f"{where}.source")


def _text_of(block: dict[str, Any], where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise _bad(f"{where} is a text block without a string 'text'", where)
    return text


def _tool_result_text(block: dict[str, Any], where: str) -> str:
    content = block.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts = []
        for j, sub in enumerate(content):
            w = f"{where}.content[{j}]"
            if not isinstance(sub, dict) or sub.get("type") != "text":
                raise _bad(f"{w}: only text blocks are supported inside tool_result", w)
            parts.append(_text_of(sub, w))
        text = "\n".join(parts)
    else:
        raise _bad(f"{where}.content must be a string or a list of text blocks", f"{where}.content")
    # OpenAI tool messages carry no error flag; the model has to read it
    return f"Error: {text}" if block.get("is_error") is True else text


def _user_content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    if all(p["type"] == "text" for p in parts):
        return "\n".join(p["text"] for p in parts)
    return parts


def _message(i: int, msg: Any) -> tuple[list[dict[str, Any]], bool]:
    """One Anthropic message as OpenAI messages (tool results become `tool` messages first)."""
    where = f"messages[{i}]"
    if not isinstance(msg, dict):
        raise _bad(f"{where} must be an object with 'role' and 'content'", where)
    role, content = msg.get("role"), msg.get("content")
    if role not in ("user", "assistant"):
        raise _bad(f"{where}.role must be 'user' or 'assistant', got {role!r}", f"{where}.role")
    if isinstance(content, str):
        return [{"role": role, "content": content}], False
    if not isinstance(content, list):
        raise _bad(f"{where}.content must be a string or a list of content blocks", f"{where}.content")
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    images = False
    for j, block in enumerate(content):
        w = f"{where}.content[{j}]"
        btype = block.get("type") if isinstance(block, dict) else None
        if not isinstance(btype, str):
            raise _bad(f"{w} must be an object with a string 'type'", w)
        if btype == "text":
            parts.append({"type": "text", "text": _text_of(block, w)})
        elif btype == "image" and role == "user":
            parts.append({"type": "image_url", "image_url": {"url": image_url(block, w)}})
            images = True
        elif btype == "tool_use" and role == "assistant":
            tid, name, args = block.get("id"), block.get("name"), block.get("input", {})
            if not isinstance(tid, str) or not isinstance(name, str) or not isinstance(args, dict):
                raise _bad(f"{w}: tool_use needs a string 'id' and 'name' and an object 'input'", w)
            calls.append(
                {"id": tid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
            )
        elif btype == "tool_result" and role == "user":
            tid = block.get("tool_use_id")
            if not isinstance(tid, str):
                raise _bad(f"{w}: tool_result needs a string 'tool_use_id'", w)
            out.append({"role": "tool", "tool_call_id": tid, "content": _tool_result_text(block, w)})
        elif btype in _SKIPPED_BLOCKS and role == "assistant":
            continue
        else:
            raise _bad(
                f"{w}: a {btype!r} block is not supported in a {role} message here; "
                "send text, image (user), tool_use (assistant) or tool_result (user) blocks",
                w,
            )
    if role == "assistant":
        text = "\n".join(p["text"] for p in parts)
        m: dict[str, Any] = {"role": "assistant", "content": text or None}
        if calls:
            m["tool_calls"] = calls
        if text or calls:
            out.append(m)
    elif parts:
        out.append({"role": "user", "content": _user_content(parts)})
    return out, images


def _system(system: Any) -> str:
    if isinstance(system, str):
        return system
    if isinstance(system, list):
        texts = []
        for j, block in enumerate(system):
            if not isinstance(block, dict) or block.get("type") != "text":
                raise _bad(f"system[{j}] must be a text block", f"system[{j}]")
            texts.append(_text_of(block, f"system[{j}]"))
        return "\n".join(texts)
    raise _bad("field 'system' must be a string or a list of text blocks", "system")


def to_openai_messages(system: Any, messages: Any) -> tuple[list[dict[str, Any]], bool]:
    """(OpenAI messages, whether any image is among them)."""
    if not isinstance(messages, list):
        raise _bad("field 'messages' must be a list of message objects", "messages")
    if not messages:
        raise _bad("'messages' is empty; send at least one message", "messages")
    out: list[dict[str, Any]] = []
    if system is not None:
        text = _system(system)
        if text:
            out.append({"role": "system", "content": text})
    images = False
    for i, msg in enumerate(messages):
        converted, has = _message(i, msg)
        out.extend(converted)
        images = images or has
    return out, images


def to_openai_tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise _bad("field 'tools' must be a list of tool definitions", "tools")
    out = []
    for i, tool in enumerate(tools):
        w = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise _bad(f"{w} must be an object", w)
        if tool.get("type") not in (None, "custom"):
            raise _bad(
                f"{w}: server tool {tool.get('type')!r} is not available on a local model; "
                "define a client tool with 'name' and 'input_schema'",
                w,
            )
        name, schema = tool.get("name"), tool.get("input_schema")
        if not isinstance(name, str) or not isinstance(schema, dict):
            raise _bad(f"{w} needs a string 'name' and an object 'input_schema'", w)
        fn: dict[str, Any] = {"name": name, "parameters": schema}
        if isinstance(tool.get("description"), str):
            fn["description"] = tool["description"]
        out.append({"type": "function", "function": fn})
    return out


def to_openai_tool_choice(choice: Any) -> tuple[Any, bool | None]:
    """(OpenAI tool_choice, parallel_tool_calls or None when not said)."""
    if not isinstance(choice, dict):
        raise _bad("field 'tool_choice' must be an object with a 'type'", "tool_choice")
    kind = choice.get("type")
    parallel = (
        None if choice.get("disable_parallel_tool_use") is None else not choice["disable_parallel_tool_use"]
    )
    if kind == "auto":
        return "auto", parallel
    if kind == "any":
        return "required", parallel
    if kind == "none":
        return "none", parallel
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}, parallel
    raise _bad("tool_choice.type must be 'auto', 'any', 'none' or 'tool' (with a 'name')", "tool_choice")


def to_openai(body: dict[str, Any], *, for_count: bool = False) -> MessagesCall:
    """Validate an Anthropic Messages body and build the (always streaming) OpenAI chat body.

    `for_count`: the count_tokens body, where `max_tokens` is not required."""
    model = _field(body, "model", (str,), "a string")
    if model is None:
        raise _bad("missing required field 'model'", "model")
    if not model.strip():
        raise _bad("field 'model' is empty; name a model from GET /v1/models", "model")
    max_tokens = _field(body, "max_tokens", (int,), "an integer")
    if max_tokens is None and not for_count:
        raise _bad("missing required field 'max_tokens'", "max_tokens")
    if max_tokens is not None and max_tokens < 1:
        raise _bad("'max_tokens' must be at least 1", "max_tokens")
    messages, images = to_openai_messages(body.get("system"), body.get("messages"))
    out: dict[str, Any] = {"model": model, "messages": messages}
    if max_tokens is not None:
        out["max_tokens"] = max_tokens
    for name in ("temperature", "top_p"):
        v = _field(body, name, _NUM, "a number")
        if v is not None:
            out[name] = v
    top_k = _field(body, "top_k", (int,), "an integer")
    if top_k is not None:
        out["top_k"] = top_k
    stops = _field(body, "stop_sequences", (list,), "a list of strings") or []
    if not all(isinstance(s, str) and s for s in stops):
        raise _bad("'stop_sequences' must hold non-empty strings", "stop_sequences")
    if body.get("tools"):
        out["tools"] = to_openai_tools(body["tools"])
        if body.get("tool_choice") is not None:
            out["tool_choice"], parallel = to_openai_tool_choice(body["tool_choice"])
            if parallel is not None:
                out["parallel_tool_calls"] = parallel
    thinking = _field(body, "thinking", (dict,), "an object")
    if thinking is not None and thinking.get("type") in ("enabled", "disabled", "adaptive"):
        out["chat_template_kwargs"] = {"enable_thinking": thinking["type"] != "disabled"}
    grammar = _field(body, "grammar", (str,), "a string (a llama.cpp GBNF grammar)")
    if grammar is not None:
        out["grammar"] = grammar
    stream = _field(body, "stream", (bool,), "true or false") or False
    if not for_count:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    return MessagesCall(
        model=model, stream=stream, stop_sequences=tuple(stops), has_images=images, openai=out
    )


# ---- answer --------------------------------------------------------------------------------------
class StopScanner:
    """Finds the first stop sequence in streamed text, holding back a tail that may begin one."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(s for s in stops if s)
        self._held = ""

    def feed(self, text: str) -> tuple[str, str | None]:
        """(text safe to emit now, the stop sequence matched or None)."""
        buf = self._held + text
        hit: tuple[int, str] | None = None
        for s in self.stops:
            at = buf.find(s)
            if at >= 0 and (hit is None or at < hit[0]):
                hit = (at, s)
        if hit is not None:
            self._held = ""
            return buf[: hit[0]], hit[1]
        keep = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(buf)), keep, -1):
                if buf.endswith(s[:k]):
                    keep = k
                    break
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep], None

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held


class MessageTranslator:
    """OpenAI chat chunks in, Anthropic stream events out; `message()` is the same answer, whole."""

    def __init__(self, *, model: str, stop_sequences: Sequence[str] = ()) -> None:
        self.id = new_message_id()
        self.model = model
        self._scanner = StopScanner(stop_sequences) if stop_sequences else None
        self.blocks: list[dict[str, Any]] = []
        self._open: int | None = None
        self._tools: dict[int, int] = {}  # OpenAI tool_call index -> block index
        self._args: dict[int, str] = {}  # block index -> JSON text received so far
        self.finish_reason: str | None = None
        self.stop_sequence: str | None = None
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None
        self.pieces = 0  # content chunks seen: llama.cpp sends one per token

    @property
    def stopped(self) -> bool:
        """A stop sequence matched: nothing more is read from the engine."""
        return self.stop_sequence is not None

    def start(self) -> list[Event]:
        message: dict[str, Any] = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            # the engine reports prompt tokens at the end; message_delta carries the real counts
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return [("message_start", {"type": "message_start", "message": message}), ("ping", {"type": "ping"})]

    def feed(self, chunk: dict[str, Any]) -> list[Event]:
        if self.stopped:
            return []
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.input_tokens = _int_or(usage.get("prompt_tokens"), self.input_tokens)
            self.output_tokens = _int_or(usage.get("completion_tokens"), self.output_tokens)
        events: list[Event] = []
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if isinstance(delta.get("reasoning_content"), str) and delta["reasoning_content"]:
                events += self._append("thinking", delta["reasoning_content"])
            if isinstance(delta.get("content"), str) and delta["content"]:
                self.pieces += 1
                events += self._content(delta["content"])
                if self.stopped:
                    return events
            for call in delta.get("tool_calls") or ():
                if isinstance(call, dict):
                    events += self._tool_call(call)
            if isinstance(choice.get("finish_reason"), str):
                self.finish_reason = choice["finish_reason"]
        return events

    def finish(self) -> list[Event]:
        """Close what is open and end the message (call once, after the last chunk)."""
        events: list[Event] = []
        if self._scanner is not None and not self.stopped:
            events += self._append("text", self._scanner.flush())
        events += self._close()
        usage = self.usage()
        events.append(
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": self.stop_reason(), "stop_sequence": self.stop_sequence},
                    "usage": usage,
                },
            )
        )
        events.append(("message_stop", {"type": "message_stop"}))
        return events

    def stop_reason(self) -> str:
        if self.stop_sequence is not None:
            return "stop_sequence"
        if self._tools or self.finish_reason == "tool_calls":
            return "tool_use"
        if self.finish_reason == "length":
            return "max_tokens"
        return "end_turn"

    def usage(self) -> dict[str, int]:
        out = self.output_tokens if self.output_tokens is not None else self.pieces
        return {"input_tokens": self.input_tokens or 0, "output_tokens": out}

    def message(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": self.blocks,
            "stop_reason": self.stop_reason(),
            "stop_sequence": self.stop_sequence,
            "usage": self.usage(),
        }

    # ---- blocks ----------------------------------------------------------------------------------
    def _content(self, text: str) -> list[Event]:
        if self._scanner is None:
            return self._append("text", text)
        emit, matched = self._scanner.feed(text)
        events = self._append("text", emit) if emit else []
        if matched is not None:
            self.stop_sequence = matched
        return events

    def _open_block(self, block: dict[str, Any]) -> list[Event]:
        events = self._close()
        self.blocks.append(block)
        self._open = len(self.blocks) - 1
        start = {"type": "content_block_start", "index": self._open, "content_block": dict(block)}
        return [*events, ("content_block_start", start)]

    def _append(self, kind: str, text: str) -> list[Event]:
        if not text:
            return []
        events: list[Event] = []
        if self._open is None or self.blocks[self._open]["type"] != kind:
            empty = (
                {"type": "text", "text": ""}
                if kind == "text"
                else {"type": "thinking", "thinking": "", "signature": ""}
            )
            events += self._open_block(empty)
        assert self._open is not None
        key, dtype = ("text", "text_delta") if kind == "text" else ("thinking", "thinking_delta")
        self.blocks[self._open][key] += text
        delta = {"type": "content_block_delta", "index": self._open, "delta": {"type": dtype, key: text}}
        return [*events, ("content_block_delta", delta)]

    def _tool_call(self, call: dict[str, Any]) -> list[Event]:
        fn = call.get("function") if isinstance(call.get("function"), dict) else {}
        assert isinstance(fn, dict)
        index = call.get("index", 0) if isinstance(call.get("index"), int) else 0
        events: list[Event] = []
        if index not in self._tools:
            if self._scanner is not None:
                events += self._append("text", self._scanner.flush())
            tid = (
                call.get("id")
                if isinstance(call.get("id"), str) and call.get("id")
                else "toolu_" + uuid.uuid4().hex[:24]
            )
            name = fn.get("name") if isinstance(fn.get("name"), str) else ""
            events += self._open_block({"type": "tool_use", "id": tid, "name": name, "input": {}})
            self._tools[index] = len(self.blocks) - 1
            self._args[len(self.blocks) - 1] = ""
        at = self._tools[index]
        args = fn.get("arguments")
        if isinstance(args, str) and args:
            self._args[at] += args
            if at == self._open:  # a closed block cannot take more; its input still gets the text
                delta = {
                    "type": "content_block_delta",
                    "index": at,
                    "delta": {"type": "input_json_delta", "partial_json": args},
                }
                events.append(("content_block_delta", delta))
        return events

    def _close(self) -> list[Event]:
        if self._open is None:
            return []
        at, self._open = self._open, None
        if at in self._args:
            self.blocks[at]["input"] = parse_arguments(self._args[at])
        return [("content_block_stop", {"type": "content_block_stop", "index": at})]


def _int_or(value: Any, default: int | None) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def sse(events: Sequence[Event]) -> bytes:
    return b"".join(
        f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode() for name, data in events
    )


# ---- errors --------------------------------------------------------------------------------------
def error_type(exc: SwitchyardError) -> str:
    if exc.status == 404:
        return "not_found_error"
    if isinstance(exc, LaneBusyError) or exc.status == 529:
        return "overloaded_error"
    if exc.status == 401:
        return "authentication_error"
    if exc.status == 403:
        return "permission_error"
    if exc.status == 429:
        return "rate_limit_error"
    if 400 <= exc.status < 500:
        return "invalid_request_error"
    return "api_error"


def error_body(exc: SwitchyardError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type(exc), "message": exc.message}}
