"""What a safety judge reads of a request: everything the model will read of it (docs/safety.md).

A model reads every message of a chat, not only the users' ones: system and developer instructions, tool
results and earlier assistant turns (which the client writes too) steer it as much as the last question.
So the request stage judges one text holding every message, each under its role, and the answer stage
judges the answer after that same text. A prompt the gateway cannot read as text (token ids) is reported
as such, for the policy to refuse (fail: closed) or to pass and record unjudged (fail: open).
"""

from __future__ import annotations

import json
from typing import Any

from app.safety.formats import Turn


def request_turns(body: dict[str, Any]) -> list[Turn]:
    """The turns a judge reads for an OpenAI chat or completions body: one user turn. A lone user message
    is judged as it is; otherwise every message is, in order, under its role."""
    if "messages" not in body:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return [Turn("user", prompt)]
        pieces = prompt if isinstance(prompt, list) else []
        return [Turn("user", "\n".join(p for p in pieces if isinstance(p, str)))]
    said = [
        (str(m.get("role") or "user"), _message_text(m))
        for m in body.get("messages") or ()
        if isinstance(m, dict)
    ]
    said = [(role, text) for role, text in said if text]
    if len(said) == 1 and said[0][0] == "user":
        return [Turn("user", said[0][1])]
    return [Turn("user", "\n\n".join(f"{role}: {text}" for role, text in said))]


def unjudgeable(body: dict[str, Any]) -> str | None:
    """Why a body's prompt cannot be judged as text (token ids), or None when it can."""
    if "messages" in body:
        return None
    prompt = body.get("prompt")
    if isinstance(prompt, list) and any(not isinstance(p, str) for p in prompt):
        return "the prompt is token ids, which the gateway cannot read as text"
    return None


def _message_text(message: dict[str, Any]) -> str:
    """The text of a message as the model reads it: its text parts, and the calls an assistant made."""
    text = _text_of(message.get("content"))
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict):
                args = fn.get("arguments")
                shown = args if isinstance(args, str) else json.dumps(args)
                text += f"\n(calls {fn.get('name')} with {shown})"
    return text.strip()


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # parts: the text ones (images are not read by a text judge)
        return "\n".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") in ("text", "input_text", "output_text")
        )
    return ""
