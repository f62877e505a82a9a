"""A requested output longer than the model's slot, cut to the slot instead of passed on.

A coding agent asks for the output its cloud model allows (Claude Code sends max_tokens 32000) whatever
model serves it. llama.cpp would take the number as sent and stop at the slot's end anyway, so the client
is told plainly: the limit is cut to the slot's context and a header says by how much.
"""

from __future__ import annotations

from typing import Any

from app.lanes.target import Target

HEADER = "Switchyard-Max-Tokens-Clamped"
# the fields by which a chat or completion body names its output limit (llama.cpp reads all three)
_LIMIT_KEYS = ("max_tokens", "max_completion_tokens", "n_predict")


def clamp_output(
    body: dict[str, Any], *, slot: int, model: str
) -> tuple[dict[str, Any], dict[str, str]] | None:
    """(`body` with each output limit above `slot` tokens cut to `slot`, the header that says so), or None
    when every limit it names fits (or is not a count: the engine refuses those itself)."""
    over = {
        key: value
        for key in _LIMIT_KEYS
        if isinstance(value := body.get(key), int) and not isinstance(value, bool) and value > slot
    }
    if not over:
        return None
    asked = ", ".join(f"{key} {value}" for key, value in over.items())
    header = {
        HEADER: f"{asked} is more than the {slot} tokens one request to {model!r} can hold (its slot's "
        f"context, prompt included); asked the engine for at most {slot}"
    }
    return {**body, **dict.fromkeys(over, slot)}, header


def clamp_to_slot(target: Target, body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]] | None:
    """`clamp_output` for the slot of `target`; None for an engine without llama.cpp slots (it decides)."""
    ctx = target.slot_context()
    return clamp_output(body, slot=ctx[0], model=target.model_id) if ctx is not None else None
