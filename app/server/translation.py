"""What the request runner (app/server/runner.py) drives: the engine's deltas in one surface's shape.

`Translation` is the protocol; `BaseRun` holds what most translations share, so each surface's `…Run`
(translate_anthropic, translate_responses, translate_ollama) writes only its own shape.
"""

from __future__ import annotations

from typing import Any, Protocol

from app.chat.deltas import Delta
from app.core.errors import SwitchyardError


def loading_comment(model: str, phase: str, seconds: float) -> bytes:
    """An SSE comment line: clients skip it, a person reading the stream sees why it waits."""
    return f": switchyard: loading {model} ({phase}, {seconds:.0f} s)\n\n".encode()


class Translation(Protocol):
    """The engine's deltas in one surface's shape; bytes are ready to write."""

    @property
    def stopped(self) -> bool:
        """True once the answer is complete on this side (a stop sequence matched): stop reading."""
        ...

    def waiting(self, phase: str, seconds: float) -> bytes: ...
    def opening(self) -> bytes: ...
    def feed(self, delta: Delta) -> bytes: ...
    def closing(self) -> bytes: ...
    def failed(self, exc: SwitchyardError) -> bytes:
        """The error once the stream has begun (opening first if it was not sent)."""
        ...

    def whole(self) -> dict[str, Any]: ...
    def usage(self) -> tuple[int, int] | None:
        """(input, output) tokens for /metrics, when known."""
        ...

    def wants_prompt_count(self) -> bool:
        """Whether the engine was cut off before its usage report (the runner counts the prompt)."""
        ...

    def prompt_counted(self, tokens: int) -> None: ...
    def loaded(self, seconds: float) -> None:
        """How long the request waited for its lane (Ollama reports it)."""
        ...


class BaseRun:
    """Defaults: never stops early, an SSE comment while the model loads, nothing before the first event,
    the usage as the engine reported it, no load time to report."""

    model: str

    @property
    def stopped(self) -> bool:
        return False

    def waiting(self, phase: str, seconds: float) -> bytes:
        return loading_comment(self.model, phase, seconds)

    def opening(self) -> bytes:
        return b""

    def wants_prompt_count(self) -> bool:
        return False

    def prompt_counted(self, tokens: int) -> None:
        pass

    def loaded(self, seconds: float) -> None:
        pass
