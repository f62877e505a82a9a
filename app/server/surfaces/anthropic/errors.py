"""Anthropic's error shape: `{"type": "error", "error": {"type", "message"}}`, with its own type names.

A module of its own (core imports only): the surface's encoding (surfaces/base.py) and the translator both
use it, and neither may import the other.
"""

from __future__ import annotations

from typing import Any

from app.core.errors import ContextLengthExceededError, LaneBusyError, SwitchyardError


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
    if exc.status == 413:
        return "request_too_large"  # Anthropic's own label for a body over its limit
    if 400 <= exc.status < 500:
        return "invalid_request_error"
    return "api_error"


def error_body(exc: SwitchyardError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type(exc), "message": error_message(exc)}}


def error_message(exc: SwitchyardError) -> str:
    """The message, led by Anthropic's own overflow wording where it applies: Claude Code reads
    `prompt is too long: N tokens > M maximum` to compact its conversation, and nothing else."""
    if isinstance(exc, ContextLengthExceededError) and exc.tokens is not None and exc.limit is not None:
        return f"prompt is too long: {exc.tokens} tokens > {exc.limit} maximum ({exc.message})"
    return exc.message
