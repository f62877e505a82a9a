"""Saying what of a request a model's chat template cannot show: its tools, its thinking switch.

A chat template that never mentions tools renders none of them: llama.cpp then answers in plain text as
if no tools were offered, and a coding agent cannot tell why its tools are never called. A thinking
control (Anthropic's `thinking`, Responses' `reasoning.effort`, Ollama's `think`) reaches the template as
`chat_template_kwargs`; a template that reads none of those names ignores it. The answer is still given
(plain chat clients send both to any model), with a response header that names the cause; `switchyard
launch` refuses a model without tools up front (app/agents/plans.py).
"""

from __future__ import annotations

from typing import Any

from app.library.model import ModelEntry
from app.server.gateway.forced_call import template_renders_tools

HEADER = "Switchyard-Tools-Ignored"
THINKING_HEADER = "Switchyard-Thinking-Ignored"


def tools_ignored(body: dict[str, Any], entry: ModelEntry | None) -> dict[str, str]:
    """The header for a request with tools to a GGUF model whose template takes none; else empty."""
    if not body.get("tools") or entry is None or entry.facts is None:
        return {}
    if body.get("tool_choice") == "required":
        return {}  # a required call is asked in the prompt instead (forced_call.py)
    template = entry.facts.chat_template
    if template is None or template_renders_tools(template):
        return {}  # no template read (the engine's default), or one that renders tools
    return {
        HEADER: f"the chat template of {entry.id!r} renders no tools, so its {len(body['tools'])} tool(s) "
        'were not shown to the model; use a model whose /v1/models entry says "tools": true'
    }


def thinking_ignored(body: dict[str, Any], entry: ModelEntry | None) -> dict[str, str]:
    """The header for a thinking switch sent to a GGUF model whose template reads none of its names."""
    kwargs = body.get("chat_template_kwargs")
    if not isinstance(kwargs, dict) or entry is None or entry.facts is None:
        return {}
    template = entry.facts.chat_template
    if template is None or any(name in template for name in kwargs):
        return {}
    names = ", ".join(sorted(kwargs))
    return {
        THINKING_HEADER: f"the chat template of {entry.id!r} has no thinking switch (it reads none of "
        f"{names}), so the request's thinking setting had no effect"
    }


def notices(body: dict[str, Any], entry: ModelEntry | None) -> dict[str, str]:
    """Every header above that applies to `body` on `entry`."""
    return {**tools_ignored(body, entry), **thinking_ignored(body, entry)}
