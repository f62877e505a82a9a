"""OpenAI Responses API -> the engine's chat completions: the request, the answer, the event stream.

llama.cpp has a /v1/responses of its own, but its events carry no `sequence_number`, `output_index` or
`content_index`, its lifecycle events carry a bare response, and an answer cut off by
`max_output_tokens` is reported `completed`; the official client's stream helper needs all of those.
So, as for the Anthropic surface, the gateway asks the engine's chat endpoint to stream and
`ResponseTranslator` turns each chat chunk into the Responses events it implies as it arrives (for a
non-streaming client it builds the final response object from the same events).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from app.chat.deltas import Delta, Finish, Reasoning, Text, ToolCallPart, Usage
from app.core.errors import ContextLengthExceededError, SwitchyardError
from app.server.surfaces.openai.validate import bad as _bad
from app.server.surfaces.openai.validate import typed_field as _field
from app.server.surfaces.responses.tools import ChatTools, engine_name, to_chat_tools
from app.server.surfaces.shapes import pin_named_tool_choice
from app.server.surfaces.thinking import effort_kwargs
from app.server.surfaces.translation import TranslatorDefaults

Event = tuple[str, dict[str, Any]]
_NUM = (int, float)
# stateful or hosted features a local server cannot offer: refused with what to do instead
_REFUSED = {
    "conversation": "conversation is not supported: Switchyard does not store conversations; "
    "send the whole conversation in 'input'",
    "prompt": "stored prompt templates are not available on a local server; send 'instructions' and 'input'",
}
# llama.cpp sampling extensions accepted beside the Responses fields and passed on unchanged
_ENGINE_EXTRAS: dict[str, tuple[tuple[type, ...], str]] = {
    "grammar": ((str,), "a string (a llama.cpp GBNF grammar)"),
    "seed": ((int,), "an integer"),
    "top_k": ((int,), "an integer"),
    "min_p": (_NUM, "a number"),
    "repeat_penalty": (_NUM, "a number"),
    "presence_penalty": (_NUM, "a number"),
    "frequency_penalty": (_NUM, "a number"),
    "logit_bias": ((dict,), "an object mapping token ids to biases"),
    "stop": ((str, list), "a string or a list of strings"),
    "ignore_eos": ((bool,), "true or false"),
}
_SKIPPED_ITEMS = {"reasoning"}  # earlier reasoning sent back as input: the engine cannot take it in
# request fields a response object echoes, as they read when the request left them out
ECHO_DEFAULTS: dict[str, Any] = {
    "instructions": None,
    "max_output_tokens": None,
    "temperature": None,
    "top_p": None,
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "tools": [],
    "text": {"format": {"type": "text"}},
    "metadata": {},
    "user": None,
}


@dataclass(frozen=True)
class ResponsesCall:
    """A validated Responses request, the chat body that carries it to the engine, and the request
    fields the response object echoes back."""

    model: str
    stream: bool
    chat: dict[str, Any]
    echo: dict[str, Any]
    # namespaced names to answer in, and the tools left out
    tools: ChatTools = field(default_factory=lambda: ChatTools(tools=[]))


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


# ---- request: input items ------------------------------------------------------------------------
def _parts(content: list[Any], where: str, *, role: str) -> str | list[dict[str, Any]]:
    """A content list as chat content: its text joined, or (when a user part is an image) chat parts with
    the images as `image_url` parts, which a lane with a vision projector reads."""
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        w = f"{where}[{j}]"
        ptype = part.get("type") if isinstance(part, dict) else None
        if ptype in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif ptype == "refusal" and role == "assistant" and isinstance(part.get("refusal"), str):
            parts.append({"type": "text", "text": part["refusal"]})
        elif ptype == "input_image" and role == "user":
            url = part.get("image_url")
            if not isinstance(url, str) or not url.startswith(("data:image/", "http://", "https://")):
                raise _bad(
                    f"{w}.image_url must be a data:image/...;base64 URL or an http(s) URL "
                    "(file_id is not supported: Switchyard stores no files)",
                    f"{w}.image_url",
                )
            parts.append({"type": "image_url", "image_url": {"url": url}})
        elif ptype in ("input_image", "input_file", "input_audio"):
            raise _bad(
                f"{w}: {ptype} is not supported on /v1/responses yet"
                + (" in a non-user message" if ptype == "input_image" else "")
                + "; send text parts (and images in user messages)",
                w,
            )
        else:
            raise _bad(f"{w} must be a text part ({{'type': 'input_text', 'text': ...}})", w)
    if any(p["type"] == "image_url" for p in parts):
        return parts
    return "".join(p["text"] for p in parts)


def _message_item(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        raise _bad(
            f"{where}.role must be 'user', 'assistant', 'system' or 'developer', got {role!r}",
            f"{where}.role",
        )
    content = item.get("content")
    text: str | list[dict[str, Any]]
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        text = _parts(content, f"{where}.content", role=role)
    else:
        raise _bad(f"{where}.content must be a string or a list of text parts", f"{where}.content")
    return {"role": "system" if role == "developer" else role, "content": text}


def _function_call(item: dict[str, Any], where: str) -> dict[str, Any]:
    call_id, name, args = item.get("call_id"), item.get("name"), item.get("arguments", "")
    if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(args, str):
        raise _bad(f"{where}: function_call needs string 'call_id', 'name' and 'arguments'", where)
    namespace = item.get("namespace")
    if namespace is not None and not isinstance(namespace, str):
        raise _bad(f"{where}.namespace must be a string", f"{where}.namespace")
    # the engine knows a namespaced tool by its flattened name (responses/tools.py)
    name = engine_name(name, namespace)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def _function_output(item: dict[str, Any], where: str) -> dict[str, Any]:
    call_id, output = item.get("call_id"), item.get("output")
    if not isinstance(call_id, str):
        raise _bad(f"{where}: function_call_output needs a string 'call_id'", where)
    if isinstance(output, list):
        output = _parts(output, f"{where}.output", role="tool")
    if not isinstance(output, str):
        raise _bad(f"{where}.output must be a string or a list of text parts", f"{where}.output")
    return {"role": "tool", "tool_call_id": call_id, "content": output}


def to_chat_messages(instructions: str | None, input_: Any) -> list[dict[str, Any]]:
    """`instructions` and `input` as chat messages; consecutive function_call items join the
    assistant message before them, as one assistant turn with several tool calls."""
    out: list[dict[str, Any]] = []
    if instructions:
        out.append({"role": "system", "content": instructions})
    if isinstance(input_, str):
        return [*out, {"role": "user", "content": input_}]
    if not isinstance(input_, list):
        raise _bad("field 'input' must be a string or a list of input items", "input")
    if not input_:
        raise _bad("'input' is empty; send a string or at least one message", "input")
    for i, item in enumerate(input_):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise _bad(f"{where} must be an object", where)
        itype = item.get("type", "message")
        if itype == "message":
            out.append(_message_item(item, where))
        elif itype == "function_call":
            call = _function_call(item, where)
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
                last["content"] = last["content"] or None
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif itype == "function_call_output":
            out.append(_function_output(item, where))
        elif itype in _SKIPPED_ITEMS:
            continue
        elif itype == "item_reference":
            raise _bad(f"{where}: item_reference needs stored items, which Switchyard does not keep", where)
        else:
            raise _bad(
                f"{where}: input items of type {itype!r} are not supported; send message, "
                "function_call or function_call_output items",
                where,
            )
    return out


# ---- request: tools, tool_choice, text.format ----------------------------------------------------
def to_chat_tool_choice(choice: Any, tools: list[dict[str, Any]]) -> tuple[Any, list[dict[str, Any]]]:
    """(chat tool_choice, the tools offered). A named function or an allowed_tools list narrows
    the tools; llama.cpp's own handling of a named choice is applied by pin_named_tool_choice."""
    if choice in ("none", "auto", "required"):
        return choice, tools
    if not isinstance(choice, dict):
        raise _bad("tool_choice must be 'none', 'auto', 'required' or an object", "tool_choice")
    names = {t["function"]["name"] for t in tools}
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        if choice["name"] not in names:
            raise _bad(f"tool_choice names {choice['name']!r}, which is not among 'tools'", "tool_choice")
        return {"type": "function", "function": {"name": choice["name"]}}, tools
    if choice.get("type") == "allowed_tools" and isinstance(choice.get("tools"), list):
        mode = choice.get("mode", "auto")
        if mode not in ("auto", "required"):
            raise _bad("tool_choice.mode must be 'auto' or 'required'", "tool_choice.mode")
        allowed = {str(t.get("name")) for t in choice["tools"] if isinstance(t, dict)}
        if not allowed or not allowed <= names:
            raise _bad(f"tool_choice allows {sorted(allowed - names)}, not among 'tools'", "tool_choice")
        return mode, [t for t in tools if t["function"]["name"] in allowed]
    raise _bad(
        "tool_choice must be 'none', 'auto', 'required', {'type': 'function', 'name': ...} or "
        "{'type': 'allowed_tools', 'mode': ..., 'tools': [...]}",
        "tool_choice",
    )


def to_template_kwargs(reasoning: Any) -> dict[str, Any] | None:
    """`reasoning.effort` as the chat template's thinking switches (surfaces/thinking.py); None when no
    effort is named (Codex sends only `summary`), so the template's default stands."""
    if reasoning is None:
        return None
    if not isinstance(reasoning, dict):
        raise _bad("field 'reasoning' must be an object such as {'effort': 'low'}", "reasoning")
    if reasoning.get("effort") is None:
        return None
    return effort_kwargs(reasoning["effort"], param="reasoning.effort")


def to_response_format(text: Any) -> dict[str, Any] | None:
    """`text.format` as the chat `response_format` (None for plain text)."""
    if not isinstance(text, dict):
        raise _bad("field 'text' must be an object", "text")
    fmt = text.get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        assert isinstance(fmt, dict)
        schema = fmt.get("schema")
        if not isinstance(schema, dict):
            raise _bad("text.format.schema must be a JSON schema object", "text.format.schema")
        spec: dict[str, Any] = {"name": fmt.get("name") or "response", "schema": schema}
        if isinstance(fmt.get("strict"), bool):
            spec["strict"] = fmt["strict"]
        return {"type": "json_schema", "json_schema": spec}
    raise _bad("text.format.type must be 'text', 'json_schema' or 'json_object'", "text.format")


def to_chat(body: dict[str, Any]) -> ResponsesCall:
    """Validate a Responses body and build the (always streaming) chat body for the engine."""
    for name, why in _REFUSED.items():
        if body.get(name) is not None:
            raise _bad(why, name)
    if body.get("background") is True:
        raise _bad("background responses are not supported; stream instead", "background")
    model = _field(body, "model", (str,), "a string")
    if model is None:
        raise _bad("missing required field 'model'", "model")
    if not model.strip():
        raise _bad("field 'model' is empty; name a model from GET /v1/models", "model")
    if body.get("input") is None:
        raise _bad("missing required field 'input'", "input")
    instructions = _field(body, "instructions", (str,), "a string")
    chat: dict[str, Any] = {"model": model, "messages": to_chat_messages(instructions, body["input"])}
    max_out = _field(body, "max_output_tokens", (int,), "an integer")
    if max_out is not None:
        if max_out < 1:
            raise _bad("'max_output_tokens' must be at least 1", "max_output_tokens")
        chat["max_tokens"] = max_out
    for name in ("temperature", "top_p"):
        if (v := _field(body, name, _NUM, "a number")) is not None:
            chat[name] = v
    if (thinking := to_template_kwargs(body.get("reasoning"))) is not None:
        chat["chat_template_kwargs"] = thinking
    parallel = _field(body, "parallel_tool_calls", (bool,), "true or false")
    offered = to_chat_tools(body["tools"]) if body.get("tools") is not None else ChatTools(tools=[])
    tools = offered.tools
    choice: Any = body.get("tool_choice")
    if tools:
        chat["tools"] = tools
        if choice is not None:
            chat["tool_choice"], chat["tools"] = to_chat_tool_choice(choice, tools)
        if parallel is not None:
            chat["parallel_tool_calls"] = parallel
    elif choice not in (None, "none", "auto"):
        raise _bad("tool_choice asks for a tool but 'tools' is empty", "tool_choice")
    if body.get("text") is not None and (fmt := to_response_format(body["text"])) is not None:
        chat["response_format"] = fmt
    for name, (types, desc) in _ENGINE_EXTRAS.items():
        if (v := _field(body, name, types, desc)) is not None:
            chat[name] = v
    stream = _field(body, "stream", (bool,), "true or false") or False
    chat["stream"] = True
    chat["stream_options"] = {"include_usage": True}
    metadata = _field(body, "metadata", (dict,), "an object")
    echo = {
        "instructions": instructions,
        "max_output_tokens": max_out,
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "parallel_tool_calls": True if parallel is None else parallel,
        "tool_choice": choice if choice is not None else "auto",
        "tools": body.get("tools") or [],
        "text": body.get("text") or {"format": {"type": "text"}},
        "metadata": metadata or {},
        "user": body.get("user") if isinstance(body.get("user"), str) else None,
    }
    return ResponsesCall(
        model=model, stream=stream, chat=pin_named_tool_choice(chat) or chat, echo=echo, tools=offered
    )


# ---- answer --------------------------------------------------------------------------------------
class ResponseTranslator(TranslatorDefaults):
    """Chat chunks in, Responses events out (each numbered); `response()` is the answer, whole.

    Output items open as their first piece arrives and close when another kind begins or the answer
    ends: text is a `message` item, reasoning a `reasoning` item, each tool call a `function_call`."""

    def __init__(
        self,
        *,
        model: str,
        echo: dict[str, Any],
        tools: ChatTools | None = None,
        keep: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.id = new_id("resp")
        # called with the finished response before its last event goes out (stored.py), so a client that
        # continues from it at once finds it
        self.keep = keep
        self.tools = tools or ChatTools(tools=[])
        self.model = model
        self.echo = {**ECHO_DEFAULTS, **echo}
        self.created_at = int(time.time())
        self.output: list[dict[str, Any]] = []
        self._open: int | None = None  # output index of the item receiving pieces
        self._calls: dict[int, int] = {}  # engine tool_call index -> output index
        self._seq = 0
        self.status = "in_progress"
        self.finish_reason: str | None = None
        self.input_tokens: int | None = None
        self.cached_tokens = 0
        self.output_tokens: int | None = None
        self.pieces = 0  # content chunks seen: llama.cpp sends one per token
        self.error: dict[str, Any] | None = None

    # ---- lifecycle -------------------------------------------------------------------------------
    def start(self) -> list[Event]:
        return [
            self._ev("response.created", response=self.response()),
            self._ev("response.in_progress", response=self.response()),
        ]

    def feed(self, delta: Delta) -> list[Event]:
        match delta:
            case Text(text):
                self.pieces += 1
                return self._append("message", text)
            case Reasoning(text):
                return self._append("reasoning", text)
            case ToolCallPart():
                return self._tool_call(delta)
            case Finish(reason):
                self.finish_reason = reason
            case Usage():
                self.input_tokens = (
                    delta.prompt_tokens if delta.prompt_tokens is not None else self.input_tokens
                )
                self.output_tokens = (
                    delta.completion_tokens if delta.completion_tokens is not None else self.output_tokens
                )
                if delta.cached_tokens is not None:
                    self.cached_tokens = delta.cached_tokens
        return []

    def finish(self) -> list[Event]:
        """Close what is open and end the response (call once, after the last chunk)."""
        cut = self.finish_reason in ("length", "content_filter")  # content_filter: the safety policy
        self.status = "incomplete" if cut else "completed"
        events = self._close("incomplete" if self.status == "incomplete" else "completed")
        name = "response.incomplete" if self.status == "incomplete" else "response.completed"
        final = self.response()
        if self.keep is not None:
            self.keep(final)
        return [*events, self._ev(name, response=final)]

    def fail(self, exc: SwitchyardError) -> list[Event]:
        """The engine failed after the stream began: an `error` event, then `response.failed`."""
        if self._open is not None:
            self.output[self._open]["status"] = "incomplete"
            self._open = None
        self.status = "failed"
        self.error = {"code": failure_code(exc), "message": exc.message}
        return [
            self._ev("error", code=exc.code, message=exc.message, param=exc.param),
            self._ev("response.failed", response=self.response()),
        ]

    def usage(self) -> dict[str, Any]:
        out = self.output_tokens if self.output_tokens is not None else self.pieces
        inp = self.input_tokens or 0
        return {
            "input_tokens": inp,
            "input_tokens_details": {"cached_tokens": self.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": out,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": inp + out,
        }

    # ---- as the runner drives it (app/server/surfaces/translation.py Translator) ---------------------
    opens_before_error = True  # a stream that fails before it began still says created, then failed

    def whole(self) -> dict[str, Any]:
        self.finish()
        return self.response()

    def counts(self) -> tuple[int, int] | None:
        u = self.usage()
        return int(u["input_tokens"]), int(u["output_tokens"])

    def prompt_counted(self, tokens: int) -> None:
        self.input_tokens = tokens

    def _incomplete_reason(self) -> str:
        return "content_filter" if self.finish_reason == "content_filter" else "max_output_tokens"

    def response(self) -> dict[str, Any]:
        done = self.status in ("completed", "incomplete", "failed")
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "completed_at": int(time.time()) if self.status == "completed" else None,
            "status": self.status,
            "background": False,
            "error": self.error,
            "incomplete_details": (
                {"reason": self._incomplete_reason()} if self.status == "incomplete" else None
            ),
            "model": self.model,
            "output": [_copy(item) for item in self.output],
            "previous_response_id": None,
            "reasoning": None,
            "store": False,
            "truncation": "disabled",
            "usage": self.usage() if done and self.status != "failed" else None,
            **self.echo,
        }

    # ---- items -----------------------------------------------------------------------------------
    def _ev(self, etype: str, **fields: Any) -> Event:
        data = {"type": etype, "sequence_number": self._seq, **fields}
        self._seq += 1
        return etype, data

    def _append(self, kind: str, text: str) -> list[Event]:
        events: list[Event] = []
        if self._open is None or self.output[self._open]["type"] != kind:
            events += self._close("completed")
            events += self._open_text_item(kind)
        assert self._open is not None
        at = self._open
        item = self.output[at]
        item["content"][0]["text"] += text
        name = "response.output_text.delta" if kind == "message" else "response.reasoning_text.delta"
        extra: dict[str, Any] = {"logprobs": []} if kind == "message" else {}
        events.append(
            self._ev(name, item_id=item["id"], output_index=at, content_index=0, delta=text, **extra)
        )
        return events

    def _open_text_item(self, kind: str) -> list[Event]:
        if kind == "message":
            item: dict[str, Any] = {
                "id": new_id("msg"),
                "type": "message",
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
            part: dict[str, Any] = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        else:
            item = {
                "id": new_id("rs"),
                "type": "reasoning",
                "status": "in_progress",
                "summary": [],
                "content": [],
            }
            part = {"type": "reasoning_text", "text": ""}
        self.output.append(item)
        at = self._open = len(self.output) - 1
        added = self._ev("response.output_item.added", output_index=at, item=_copy(item))
        item["content"].append(part)
        part_added = self._ev(
            "response.content_part.added",
            item_id=item["id"],
            output_index=at,
            content_index=0,
            part=dict(part),
        )
        return [added, part_added]

    def _tool_call(self, part: ToolCallPart) -> list[Event]:
        events: list[Event] = []
        if part.index not in self._calls:
            events += self._close("completed")
            name, namespace = self.tools.client_name(part.name or "")
            item = {
                "id": new_id("fc"),
                "type": "function_call",
                "status": "in_progress",
                "call_id": part.id or new_id("call"),
                "name": name,
                "arguments": "",
            }
            if namespace is not None:  # a flattened namespace tool: answered the way the client named it
                item["namespace"] = namespace
            self.output.append(item)
            self._open = self._calls[part.index] = len(self.output) - 1
            events.append(self._ev("response.output_item.added", output_index=self._open, item=_copy(item)))
        at = self._calls[part.index]
        if part.arguments:
            self.output[at]["arguments"] += part.arguments
            if at == self._open:  # a closed item cannot take more events; its arguments still grow
                delta = self._ev(
                    "response.function_call_arguments.delta",
                    item_id=self.output[at]["id"],
                    output_index=at,
                    delta=part.arguments,
                )
                events.append(delta)
        return events

    def _close(self, status: str) -> list[Event]:
        if self._open is None:
            return []
        at, self._open = self._open, None
        item = self.output[at]
        item["status"] = status
        events: list[Event] = []
        if item["type"] == "function_call":
            events.append(
                self._ev(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=at,
                    name=item["name"],
                    arguments=item["arguments"],
                )
            )
        else:
            part = item["content"][0]
            if item["type"] == "message":
                text_done = self._ev(
                    "response.output_text.done",
                    item_id=item["id"],
                    output_index=at,
                    content_index=0,
                    text=part["text"],
                    logprobs=[],
                )
            else:
                text_done = self._ev(
                    "response.reasoning_text.done",
                    item_id=item["id"],
                    output_index=at,
                    content_index=0,
                    text=part["text"],
                )
            part_done = self._ev(
                "response.content_part.done",
                item_id=item["id"],
                output_index=at,
                content_index=0,
                part=dict(part),
            )
            events += [text_done, part_done]
        events.append(self._ev("response.output_item.done", output_index=at, item=_copy(item)))
        return events


def failure_code(exc: SwitchyardError) -> str:
    """The `response.failed` error code: Codex compacts its history only on `context_length_exceeded`
    and retries on `server_error`, so an overflow must not be reported as a server error."""
    if isinstance(exc, ContextLengthExceededError):
        return "context_length_exceeded"
    if exc.status == 429:
        return "rate_limit_exceeded"
    return "server_error"


def _copy(item: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(item))
