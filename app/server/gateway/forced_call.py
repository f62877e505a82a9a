"""A required tool call for a model whose chat template renders no tools.

llama.cpp enforces `tool_choice: "required"` (and a named tool_choice, which the gateway sends as
"required") only through the model's chat template: a template that never mentions tools renders none,
and the engine then drops the tools and answers in plain text (SmolLM2's template is one). For such a
model the gateway asks for the call itself: the tools are described in a system message, and the answer
is held to a JSON schema `{"name": <a listed tool>, "arguments": <its parameters>}` (llama.cpp's
`json_schema`, a grammar); the answer is then read back into tool calls (tool_recovery.py, forced mode)
with `finish_reason: "tool_calls"` on every surface.
"""

from __future__ import annotations

import json
from typing import Any

from app.core.errors import UpstreamRefusedError
from app.lanes.lane_requests import speaks_llama_server

_DROPPED = ("tools", "tool_choice", "parallel_tool_calls", "response_format", "json_schema", "grammar")


def template_renders_tools(chat_template: str | None) -> bool:
    """The rule llama.cpp follows (request_defaults.model_limits says the same to /v1/models)."""
    return "tools" in (chat_template or "")


def needs_forced_call(body: dict[str, Any], *, engine: str, chat_template: str | None) -> bool:
    """A chat body that requires a call, for a llama.cpp lane whose template cannot offer the tools."""
    required = body.get("tool_choice") == "required" and bool(_functions(body))
    return required and speaks_llama_server(engine) and not template_renders_tools(chat_template)


def forced_call_body(body: dict[str, Any]) -> dict[str, Any]:
    """The body the engine gets instead: the tools described in the system message, the answer held to
    one call's JSON. Each tool's `parameters` schema is its arguments' schema."""
    functions = _functions(body)
    shapes = [
        {
            "type": "object",
            "properties": {
                "name": {"const": fn["name"]},
                "arguments": fn.get("parameters") or {"type": "object"},
            },
            "required": ["name", "arguments"],
        }
        for fn in functions
    ]
    listed = "\n".join(
        json.dumps(
            {"name": fn["name"], "description": fn.get("description", ""), "parameters": fn.get("parameters")}
        )
        for fn in functions
    )
    note = (
        "Answer by calling exactly one of these tools. Reply with only a JSON object "
        '{"name": <tool name>, "arguments": <its arguments>}.\nTools:\n' + listed
    )
    messages = list(body.get("messages") or [])
    first = messages[0] if messages else None
    if isinstance(first, dict) and first.get("role") == "system" and isinstance(first.get("content"), str):
        messages[0] = {**first, "content": f"{first['content']}\n\n{note}"}  # templates may allow one
    else:
        messages.insert(0, {"role": "system", "content": note})
    out = {k: v for k, v in body.items() if k not in _DROPPED}
    out["messages"] = messages
    out["json_schema"] = shapes[0] if len(shapes) == 1 else {"anyOf": shapes}
    return out


def unreadable_call_error(model: str, *, finish: str) -> UpstreamRefusedError:
    why = (
        "it was cut off by max_tokens: raise max_tokens"
        if finish == "length"
        else "its answer was not the call the grammar asked for; retry the request"
    )
    return UpstreamRefusedError(
        f"{model!r} was required to call a tool (its chat template renders none, so the gateway held its "
        f"answer to a call's JSON), but {why}",
        status=502,
        source="engine",
        code="tool_call_unreadable",
    )


def _functions(body: dict[str, Any]) -> list[dict[str, Any]]:
    tools = body.get("tools")
    out: list[dict[str, Any]] = []
    for t in tools if isinstance(tools, list) else ():
        fn = t.get("function") if isinstance(t, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            out.append(fn)
    return out
