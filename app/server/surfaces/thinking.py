"""A reasoning effort as the chat template's thinking switches, for the surfaces that name an effort
(Chat Completions' `reasoning_effort`, Responses' `reasoning.effort`).

llama.cpp hands `chat_template_kwargs` to the template: Qwen3-style templates read `enable_thinking`,
gpt-oss-style ones read `reasoning_effort`, so both are set. A template that reads neither is named in a
response header (app/server/gateway/tool_notice.py).
"""

from __future__ import annotations

from typing import Any

from app.core.errors import BadRequestError

EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
SWITCHES = ("enable_thinking", "reasoning_effort")  # the template variables effort_kwargs sets


def template_has_switch(template: str | None) -> bool | None:
    """Whether a chat template reads one of the thinking switches; None when no template was read (the
    engine then uses its own, which may have one)."""
    if template is None:
        return None
    return any(name in template for name in SWITCHES)


def effort_kwargs(effort: Any, *, param: str) -> dict[str, Any]:
    """`chat_template_kwargs` for `effort`; thinking is off for none and minimal."""
    if effort not in EFFORTS:
        raise BadRequestError(f"{param} must be one of {', '.join(EFFORTS)}, got {effort!r}", param=param)
    on, effort_name = SWITCHES
    return {on: effort not in ("none", "minimal"), effort_name: effort}


def with_reasoning_effort(body: dict[str, Any]) -> dict[str, Any] | None:
    """A chat body whose `reasoning_effort` is also set as the template's switches; None when it names
    no effort or already sets `chat_template_kwargs` itself (the client's own switches win)."""
    effort = body.get("reasoning_effort")
    if effort is None or body.get("chat_template_kwargs") is not None:
        return None
    return {**body, "chat_template_kwargs": effort_kwargs(effort, param="reasoning_effort")}
