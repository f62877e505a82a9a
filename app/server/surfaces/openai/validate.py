"""Request body checks for the OpenAI routes: a malformed body is a 400 that names the field."""

from __future__ import annotations

from typing import Any

from app.core.errors import BadRequestError
from app.server.gateway.request_input import parse_json_object

_NUM = (int, float)
# field -> (accepted types, description); absent fields are fine unless listed in REQUIRED
_COMMON: dict[str, tuple[tuple[type, ...], str]] = {
    "model": ((str,), "a string"),
    "stream": ((bool,), "true or false"),
    "max_tokens": ((int,), "an integer"),
    "max_completion_tokens": ((int,), "an integer"),
    "n": ((int,), "an integer"),
    "temperature": (_NUM, "a number"),
    "top_p": (_NUM, "a number"),
    "seed": ((int,), "an integer"),
    "stop": ((str, list), "a string or a list of strings"),
    "stream_options": ((dict,), "an object"),
}
ROUTES: dict[str, dict[str, Any]] = {
    "chat": {
        "required": ("model", "messages"),
        "fields": {
            "messages": ((list,), "a list of message objects"),
            "tools": ((list,), "a list of tool objects"),
            "tool_choice": ((str, dict), "'none', 'auto', 'required' or a named function object"),
            "parallel_tool_calls": ((bool,), "true or false"),
            "response_format": ((dict,), "an object"),
        },
    },
    "completions": {
        "required": ("model", "prompt"),
        "fields": {"prompt": ((str, list), "a string or a list")},
    },
    "embeddings": {
        "required": ("model", "input"),
        "fields": {
            "input": ((str, list), "a string or a list"),
            "encoding_format": ((str,), '"float" or "base64"'),
        },
    },
}


def parse_body(raw: bytes) -> dict[str, Any]:
    """The JSON object a route was sent, with every value checked (app/server/gateway/request_input.py)."""
    return parse_json_object(raw)


def check(body: dict[str, Any], route: str) -> str:
    """Validate `body` for `route`; returns the model id."""
    spec = ROUTES[route]
    for name in spec["required"]:
        if name not in body or body[name] is None:
            raise BadRequestError(f"missing required field {name!r}", param=name)
    fields = {**_COMMON, **spec["fields"]}
    for name, (types, desc) in fields.items():
        if name in body and body[name] is not None:
            v = body[name]
            if not isinstance(v, types) or (isinstance(v, bool) and bool not in types):
                raise BadRequestError(f"field {name!r} must be {desc}, got {type(v).__name__}", param=name)
    usage = (body.get("stream_options") or {}).get("include_usage")
    if usage is not None and not isinstance(usage, bool):
        raise BadRequestError("stream_options.include_usage must be true or false", param="stream_options")
    model = body["model"]
    if not model.strip():
        raise BadRequestError("field 'model' is empty; name a model from GET /v1/models", param="model")
    if route == "chat":
        msgs = body["messages"]
        if not msgs:
            raise BadRequestError("'messages' is empty; send at least one message", param="messages")
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise BadRequestError(
                    f"messages[{i}] must be an object with a string 'role'", param=f"messages[{i}]"
                )
            _check_message_fields(i, m)
        _check_tool_shapes(body)
    if route == "embeddings":
        fmt = body.get("encoding_format")
        if fmt is not None and fmt not in ("float", "base64"):
            raise BadRequestError('encoding_format must be "float" or "base64"', param="encoding_format")
        if isinstance(body["input"], list) and not body["input"]:
            raise BadRequestError("'input' is empty", param="input")
    return str(model)


# message fields llama.cpp reads as text: anything else is a 500 from its JSON library, so refuse it here
_TEXT_FIELDS = ("name", "tool_call_id", "reasoning_content")


def _check_message_fields(i: int, m: dict[str, Any]) -> None:
    """`content` is text, null or a list of typed parts; the other text fields are text."""
    where = f"messages[{i}]"
    for name in _TEXT_FIELDS:
        if m.get(name) is not None and not isinstance(m[name], str):
            raise BadRequestError(f"{where}.{name} must be a string", param=where)
    content = m.get("content")
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise BadRequestError(
            f"{where}.content must be a string, null, or a list of parts such as "
            '{"type": "text", "text": "..."}',
            param=where,
        )
    for j, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise BadRequestError(f'{where}.content[{j}] must be an object with a string "type"', param=where)
        if part["type"] == "text" and not isinstance(part.get("text"), str):
            raise BadRequestError(
                f'{where}.content[{j}] is a text part: its "text" must be a string', param=where
            )


def _check_tool_shapes(body: dict[str, Any]) -> None:
    """`tools` and `messages[i].tool_calls` in the OpenAI shape: llama.cpp answers 500 to others."""
    for i, tool in enumerate(body.get("tools") or ()):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not _named(fn):
            raise BadRequestError(
                f'tools[{i}] must be {{"type": "function", "function": {{"name": "...", ...}}}}',
                param=f"tools[{i}]",
            )
    for i, m in enumerate(body["messages"]):
        calls = m.get("tool_calls")
        if calls is None:
            continue
        if not isinstance(calls, list):
            raise BadRequestError(f"messages[{i}].tool_calls must be a list", param=f"messages[{i}]")
        for j, call in enumerate(calls):
            fn = call.get("function") if isinstance(call, dict) else None
            args = fn.get("arguments") if isinstance(fn, dict) else None
            if (
                not isinstance(call, dict)
                or call.get("type") != "function"
                or not _named(fn)
                or not isinstance(args, str | None)
            ):
                raise BadRequestError(
                    f'messages[{i}].tool_calls[{j}] must be {{"id": "...", "type": "function", '
                    f'"function": {{"name": "...", "arguments": "<JSON text>"}}}}',
                    param=f"messages[{i}]",
                )


def _named(fn: Any) -> bool:
    return isinstance(fn, dict) and isinstance(fn.get("name"), str)


def bad(message: str, param: str) -> BadRequestError:
    return BadRequestError(message, param=param)


def typed_field(body: dict[str, Any], name: str, types: tuple[type, ...], desc: str) -> Any:
    """`body[name]` when present and of `types` (bool is never a number here), else None."""
    v = body.get(name)
    if v is None:
        return None
    if not isinstance(v, types) or (isinstance(v, bool) and bool not in types):
        raise bad(f"field {name!r} must be {desc}, got {type(v).__name__}", name)
    return v


def text_field(body: dict[str, Any], name: str, *, required: bool = False) -> str | None:
    """A string field of an admin body, stripped; absent or empty is None (a 400 when `required`)."""
    value = body.get(name)
    if value is None or value == "":
        if required:
            raise BadRequestError(f"missing required field {name!r}", param=name)
        return None
    if not isinstance(value, str):
        raise BadRequestError(f"{name!r} must be a string", param=name)
    return value.strip()
