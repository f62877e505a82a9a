"""Request-shape helpers the translators share: tool-call arguments, and a named tool_choice in the form
llama.cpp enforces."""

from __future__ import annotations

import json
from typing import Any

from app.core.errors import BadRequestError


def parse_arguments(text: str) -> dict[str, Any]:
    """Tool arguments as an object; text that is not a JSON object is kept under 'arguments'."""
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {"arguments": text}
    return value if isinstance(value, dict) else {"arguments": value}


def pin_named_tool_choice(chat: dict[str, Any]) -> dict[str, Any] | None:
    """A chat body with a named tool_choice, as llama.cpp can honour it; None when there is none.

    llama.cpp takes tool_choice only as a string: `{"type": "function", "function": {"name": N}}`
    is dropped with a warning and the model may answer without a call. Offering only N and
    requiring a call is the same request in a form the engine enforces (with its tool grammar)."""
    choice = chat.get("tool_choice")
    if not isinstance(choice, dict) or choice.get("type") != "function":
        return None
    fn = choice.get("function")
    name = fn.get("name") if isinstance(fn, dict) else None
    tools = chat.get("tools")
    if not isinstance(name, str) or not isinstance(tools, list):
        return None
    keep = [
        t
        for t in tools
        if isinstance(t, dict) and isinstance(t.get("function"), dict) and t["function"].get("name") == name
    ]
    if not keep:
        raise BadRequestError(
            f"tool_choice names function {name!r}, which is not among 'tools'", param="tool_choice"
        )
    return {**chat, "tools": keep, "tool_choice": "required"}
