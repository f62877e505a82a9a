"""Anthropic Messages <-> OpenAI chat completions: the request, the answer, and the event stream.

The engine is always asked to stream; `MessageTranslator` turns each OpenAI chunk into the Anthropic
events it implies (and, for a non-streaming client, also builds the final message from them).
Stop sequences are matched here, not by the engine: llama.cpp drops the matched string and does not
say which one matched, and Anthropic's answer names it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app.chat.deltas import Delta, Finish, Reasoning, Text, ToolCallPart, Usage
from app.core.errors import SwitchyardError
from app.server.surfaces.anthropic.errors import error_body
from app.server.surfaces.openai.validate import bad as _bad
from app.server.surfaces.openai.validate import typed_field as _field
from app.server.surfaces.translation import TranslatorDefaults
from app.server.surfaces.wire import json_text

Event = tuple[str, dict[str, Any]]
# a text delta as sse_events frames {"type": "content_block_delta", "index": I, "delta": {...}}, byte for
# byte (the encoder's default separators), written without building the event (framed_text)
_TEXT_DELTA = (
    'event: content_block_delta\ndata: {"type": "content_block_delta", "index": %d, '
    '"delta": {"type": "text_delta", "text": %s}}\n\n'
)
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
    # tool_choice.disable_parallel_tool_use: the answer carries at most one tool_use block
    single_tool_call: bool = False


def new_message_id() -> str:
    return "msg_" + uuid.uuid4().hex[:24]


def anthropic_tool_id(engine_id: Any, *, taken: set[str] | None = None) -> str:
    """The engine's tool-call id in Anthropic's `toolu_` form (a fresh one when it sent none).

    The id travels back verbatim in tool_use and tool_result blocks, and to_openai passes both
    through unchanged, so the engine sees one consistent id per call on the next turn."""
    raw = engine_id if isinstance(engine_id, str) else ""
    raw = raw.removeprefix("toolu_").removeprefix("call_")
    # Anthropic's own API accepts only these characters in a tool_use id
    safe = "".join(c if c.isascii() and (c.isalnum() or c in "_-") else "_" for c in raw)
    tid = "toolu_" + (safe or uuid.uuid4().hex[:24])
    if taken is not None:
        while tid in taken:  # an engine that numbers calls per turn repeats ids across them
            tid += "_" + uuid.uuid4().hex[:4]
        taken.add(tid)
    return tid


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
        raise _bad(f"{where}.role must be 'user', 'assistant' or 'system', got {role!r}", f"{where}.role")
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
    # Claude Code sends system messages inside `messages` (a mid-conversation system beta); chat
    # templates want one system turn first, so each is folded into the system prompt, in order
    texts = [_system(system)] if system is not None else []
    images = False
    for i, msg in enumerate(messages):
        if isinstance(msg, dict) and msg.get("role") == "system":
            texts.append(_inline_system(i, msg))
            continue
        converted, has = _message(i, msg)
        out.extend(converted)
        images = images or has
    if not out:
        raise _bad("'messages' holds only system messages; send at least one user message", "messages")
    if text := "\n\n".join(t for t in texts if t):
        out.insert(0, {"role": "system", "content": text})
    _check_tool_results(messages)
    return out, images


def _inline_system(i: int, msg: dict[str, Any]) -> str:
    """The text of a system message found inside `messages` (a string or text blocks)."""
    where = f"messages[{i}].content"
    content = msg.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"{where} must be a string or a list of text blocks", where)
    texts = []
    for j, block in enumerate(content):
        if not isinstance(block, dict) or block.get("type") != "text":
            raise _bad(f"{where}[{j}]: a system message holds only text blocks", f"{where}[{j}]")
        texts.append(_text_of(block, f"{where}[{j}]"))
    return "\n".join(texts)


def _check_tool_results(messages: list[dict[str, Any]]) -> None:
    """Each tool_result must answer a tool_use of the latest assistant message, as Anthropic requires:
    the engine's template pairs them by id, and a stray id would reach the model as an orphan answer."""
    offered: set[str] = set()
    for i, msg in enumerate(messages):
        if msg["role"] == "system":  # folded into the system prompt: between a call and its result is fine
            continue
        blocks = msg["content"] if isinstance(msg["content"], list) else []
        if msg["role"] == "assistant":
            offered = {b["id"] for b in blocks if b["type"] == "tool_use"}
            continue
        for j, block in enumerate(blocks):
            if block["type"] == "tool_result" and block["tool_use_id"] not in offered:
                w = f"messages[{i}].content[{j}].tool_use_id"
                raise _bad(
                    f"{w}: no tool_use with id {block['tool_use_id']!r} in the assistant message before "
                    "it; send each tool_result right after the assistant turn that made the call",
                    w,
                )


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
    disable = choice.get("disable_parallel_tool_use")
    if disable is not None and not isinstance(disable, bool):
        w = "tool_choice.disable_parallel_tool_use"
        raise _bad(f"{w} must be true or false", w)
    parallel = None if disable is None else not disable
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
    # llama.cpp's other generation extension: generate all max_tokens, never stopping at end-of-text
    if (ignore_eos := _field(body, "ignore_eos", (bool,), "true or false")) is not None:
        out["ignore_eos"] = ignore_eos
    if (response_format := to_openai_response_format(body)) is not None:
        if grammar is not None:
            raise _bad("send either 'grammar' or 'output_config.format', not both", "output_config")
        out["response_format"] = response_format
    stream = _field(body, "stream", (bool,), "true or false") or False
    if not for_count:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    return MessagesCall(
        model=model,
        stream=stream,
        stop_sequences=tuple(stops),
        has_images=images,
        openai=out,
        single_tool_call=out.get("parallel_tool_calls") is False,
    )


def to_openai_response_format(body: dict[str, Any]) -> dict[str, Any] | None:
    """`output_config.format` (or the older beta's top-level `output_format`) as OpenAI's json_schema
    response_format, which llama.cpp turns into a grammar; None when the body asks for no format."""
    config = _field(body, "output_config", (dict,), "an object")
    where, fmt = "output_config.format", (config or {}).get("format")
    if fmt is None and body.get("output_format") is not None:
        where, fmt = "output_format", body["output_format"]
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise _bad(f"{where} must be an object with 'type' and 'schema'", where)
    if fmt.get("type") != "json_schema":
        raise _bad(f"{where}.type must be 'json_schema', got {fmt.get('type')!r}", f"{where}.type")
    schema = fmt.get("schema")
    if not isinstance(schema, dict) or not schema:
        raise _bad(f"{where}.schema must be a JSON Schema object", f"{where}.schema")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": schema, "strict": True}}


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


@dataclass
class _PendingCall:
    """A tool call still arriving from the engine: the client sees it once its arguments are whole."""

    engine_id: str = ""
    name: str = ""
    args: str = ""


class MessageTranslator(TranslatorDefaults):
    """OpenAI chat chunks in, Anthropic stream events out; `message()` is the same answer, whole.

    A tool call is held back until its arguments parse as one JSON object, then sent as a whole
    tool_use block: a call cut off by max_tokens never reaches the client as a runnable tool_use.
    `single_tool_call` (disable_parallel_tool_use): the first whole call ends the answer."""

    def __init__(
        self, *, model: str, stop_sequences: Sequence[str] = (), single_tool_call: bool = False
    ) -> None:
        self.id = new_message_id()
        self.model = model
        self._scanner = StopScanner(stop_sequences) if stop_sequences else None
        self._single = single_tool_call
        self.blocks: list[dict[str, Any]] = []
        self._open: int | None = None
        # the open text or thinking block's pieces, joined into it when it closes: a string grown by `+=`
        # in a dict is copied whole per piece, quadratic in the answer's length
        self._parts: list[str] = []
        self._text_open = False  # the open block is a text block (framed_text may write into it)
        self._pending: dict[int, _PendingCall] = {}  # OpenAI tool_call index -> call still arriving
        self._settled: set[int] = set()  # indices sent or dropped: later pieces of them are ignored
        self._ids: set[str] = set()
        self.tool_calls = 0  # tool_use blocks sent
        self.finish_reason: str | None = None
        self.stop_sequence: str | None = None
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None
        self.pieces = 0  # content chunks seen: llama.cpp sends one per token

    @property
    def stopped(self) -> bool:
        """A stop sequence matched, or the one tool call allowed is whole: nothing more is read."""
        return self.stop_sequence is not None or (self._single and self.tool_calls > 0)

    def start(self) -> list[Event]:
        message: dict[str, Any] = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            # the prompt as the runner counted it before the stream began (0 where it could not);
            # message_delta carries the engine's own counts at the end
            "usage": {"input_tokens": self.input_tokens or 0, "output_tokens": 0},
        }
        return [("message_start", {"type": "message_start", "message": message}), ("ping", {"type": "ping"})]

    def framed_text(self, text: str) -> bytes | None:
        """The common piece, a text delta continuing an open text block without stop sequences to watch,
        as the bytes `feed` then `sse_events` would make; None where `feed` must decide."""
        if not self._text_open or self._scanner is not None or not text or self.stopped:
            return None
        self.pieces += 1
        self._parts.append(text)
        return (_TEXT_DELTA % (self._open, json_text(text))).encode()

    def feed(self, delta: Delta) -> list[Event]:
        if self.stopped:
            return []
        match delta:
            case Text(text):
                self.pieces += 1
                return self._content(text)
            case Reasoning(text):
                return self._append("thinking", text)
            case ToolCallPart():
                self.pieces += 1
                return self._tool_call(delta)
            case Finish(reason):
                self.finish_reason = reason
            case Usage():
                if delta.prompt_tokens is not None:
                    self.input_tokens = delta.prompt_tokens
                if delta.completion_tokens is not None:
                    self.output_tokens = delta.completion_tokens
        return []

    def finish(self) -> list[Event]:
        """Close what is open and end the message (call once, after the last chunk)."""
        events: list[Event] = []
        if self._scanner is not None and self.stop_sequence is None:
            events += self._append("text", self._scanner.flush())
        events += self._settle_pending()
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
        if self.finish_reason == "content_filter":
            return "refusal"  # the safety policy cut the answer (app/server/gateway/safety_gate.py)
        if self._single and self.tool_calls:
            return "tool_use"  # reading stopped at the one call allowed: the engine's reason is unknown
        if self.finish_reason == "length":
            return "max_tokens"  # even beside whole calls: the answer was cut, as Anthropic reports it
        if self.tool_calls:
            return "tool_use"
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

    # ---- as the runner drives it (app/server/surfaces/translation.py Translator) ---------------------
    def fail(self, exc: SwitchyardError) -> list[Event]:
        return [("error", error_body(exc))]

    def whole(self) -> dict[str, Any]:
        self.finish()
        return self.message()

    def counts(self) -> tuple[int, int] | None:
        u = self.usage()
        return u["input_tokens"], u["output_tokens"]

    def wants_prompt_count(self) -> bool:
        return self.input_tokens is None

    def prompt_counted(self, tokens: int) -> None:
        self.input_tokens = tokens

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
        self._text_open = block["type"] == "text"
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
        self._parts.append(text)
        delta = {"type": "content_block_delta", "index": self._open, "delta": {"type": dtype, key: text}}
        return [*events, ("content_block_delta", delta)]

    def _tool_call(self, part: ToolCallPart) -> list[Event]:
        if part.index in self._settled:
            return []
        events: list[Event] = []
        pending = self._pending.get(part.index)
        if pending is None:
            if self._scanner is not None:  # the text before a call is whole: release its held tail
                events += self._append("text", self._scanner.flush())
            pending = self._pending[part.index] = _PendingCall()
        if part.id and not pending.engine_id:
            pending.engine_id = part.id
        if part.name and not pending.name:
            pending.name = part.name
        pending.args += part.arguments
        if (whole := _json_object(pending.args)) is not None:
            events += self._send_call(part.index, whole)
        return events

    def _send_call(self, index: int, arguments: dict[str, Any]) -> list[Event]:
        """A whole call as one tool_use block: start, its JSON as one delta, stop."""
        call = self._pending.pop(index)
        self._settled.add(index)
        tid = anthropic_tool_id(call.engine_id, taken=self._ids)
        events = self._open_block({"type": "tool_use", "id": tid, "name": call.name, "input": {}})
        assert self._open is not None
        at = self._open
        if call.args.strip():
            delta = {"type": "input_json_delta", "partial_json": call.args}
            events.append(
                ("content_block_delta", {"type": "content_block_delta", "index": at, "delta": delta})
            )
        self.blocks[at]["input"] = arguments
        self.tool_calls += 1
        return [*events, *self._close()]

    def _settle_pending(self) -> list[Event]:
        """At the end: a call without arguments is whole if the engine ended normally; any other call
        still open was cut off (max_tokens, a stop sequence) and is dropped, not sent half-built."""
        events: list[Event] = []
        for index in sorted(self._pending):
            call = self._pending[index]
            if not self.stopped and not call.args.strip() and self.finish_reason in ("tool_calls", "stop"):
                events += self._send_call(index, {})
        self._settled.update(self._pending)
        self._pending.clear()
        return events

    def _close(self) -> list[Event]:
        if self._open is None:
            return []
        at, self._open = self._open, None
        self._text_open = False
        events: list[Event] = []
        block = self.blocks[at]
        if self._parts:
            key = "text" if block["type"] == "text" else "thinking"
            block[key] = "".join(self._parts)
            self._parts = []
        if block["type"] == "thinking":  # a thinking block ends with its signature, as Anthropic's do
            block["signature"] = thinking_signature(block["thinking"])
            delta = {"type": "signature_delta", "signature": block["signature"]}
            events.append(
                ("content_block_delta", {"type": "content_block_delta", "index": at, "delta": delta})
            )
        return [*events, ("content_block_stop", {"type": "content_block_stop", "index": at})]


def thinking_signature(thinking: str) -> str:
    """A thinking block's `signature`: a digest of its text, so a client that must send one back has it.
    It is no secret and proves nothing beyond the text; thought sent back is not shown to the engine."""
    digest = hashlib.sha256(thinking.encode()).digest()
    return "switchyard-sha256:" + base64.b64encode(digest).decode()


def _json_object(text: str) -> dict[str, Any] | None:
    """The arguments as an object once they are whole JSON; None while they are still arriving."""
    if not text.rstrip().endswith("}"):  # cheap: a whole object ends with its brace
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _int_or(value: Any, default: int | None) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else default
