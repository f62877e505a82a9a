"""What the request runner (app/server/gateway/runner.py) drives: the engine's deltas in one surface's shape.

Each translated surface writes a `Translator` (its pieces: named events, NDJSON objects; `TranslatorDefaults`
holds what most share); the one `TranslatedRun` frames them with the surface's `Encoding`
(app/server/surfaces/base.py) into the bytes the runner writes (`Translation`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from app.chat.deltas import Delta, Text
from app.core.errors import SwitchyardError

if TYPE_CHECKING:
    from app.server.surfaces.base import Encoding


class Translation(Protocol):
    """The engine's deltas in one surface's shape; bytes are ready to write."""

    @property
    def stopped(self) -> bool:
        """True once the answer is complete on this side (a stop sequence matched): stop reading."""
        ...

    def waiting(self, phase: str, seconds: float) -> bytes: ...
    def opening(self) -> bytes: ...
    def pending_opening(self) -> bytes:
        """The opening when it has not been written yet, else nothing (a stream whose first bytes from the
        engine carry it: the prompt's size comes with them)."""
        ...

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


FramedText = Callable[[str], "bytes | None"]


class Translator(Protocol):
    """A surface's translator: the engine's deltas as that API's pieces (named events for Anthropic and
    Responses, objects for Ollama), which the surface's `Encoding.frame` turns into bytes.

    It may also have `framed_text(text) -> bytes | None`: the bytes `frame(feed(Text(text)))` would give,
    made directly for the common text piece (None: `feed` decides), the hot path of a long answer."""

    model: str
    # a failure before the opening is sent still opens the stream first (Responses' created/in_progress)
    opens_before_error: bool

    @property
    def stopped(self) -> bool:
        """True once the answer is complete on this side (a stop sequence matched): stop reading."""
        ...

    def waiting(self) -> list[Any]:
        """Pieces a stream hears while its model loads; none: the encoding's loading line."""
        ...

    def start(self) -> list[Any]: ...
    def feed(self, delta: Delta) -> list[Any]: ...
    def finish(self) -> list[Any]: ...
    def fail(self, exc: SwitchyardError) -> list[Any]: ...
    def whole(self) -> dict[str, Any]: ...
    def counts(self) -> tuple[int, int] | None:
        """(input, output) tokens, when known."""
        ...

    def wants_prompt_count(self) -> bool: ...
    def prompt_counted(self, tokens: int) -> None: ...
    def loaded(self, seconds: float) -> None: ...


class TranslatorDefaults:
    """What most translators share: never stops early, nothing to say while the model loads or before the
    first piece, the usage as the engine reported it, no load time to report."""

    opens_before_error = False

    @property
    def stopped(self) -> bool:
        return False

    def waiting(self) -> list[Any]:
        return []

    def start(self) -> list[Any]:
        return []

    def wants_prompt_count(self) -> bool:
        return False

    def prompt_counted(self, tokens: int) -> None:
        pass

    def loaded(self, seconds: float) -> None:
        pass


class TranslatedRun:
    """The one adapter between a surface's translator and the runner: its pieces, framed by the surface's
    encoding, as ready-to-write bytes (a `Translation`)."""

    def __init__(self, tr: Translator, *, encoding: Encoding) -> None:
        self.tr = tr
        self.encoding = encoding
        self._opened = False
        # a translator's own bytes for the common text piece (MessageTranslator.framed_text), where it
        # has them: the event is then never built as an object and encoded
        self._framed_text: FramedText | None = getattr(tr, "framed_text", None)

    @property
    def stopped(self) -> bool:
        return self.tr.stopped

    def waiting(self, phase: str, seconds: float) -> bytes:
        pieces = self.tr.waiting()
        return self.encoding.frame(pieces) if pieces else self.encoding.loading(self.tr.model, phase, seconds)

    def opening(self) -> bytes:
        self._opened = True
        return self.encoding.frame(self.tr.start())

    def pending_opening(self) -> bytes:
        return b"" if self._opened else self.opening()

    def feed(self, delta: Delta) -> bytes:
        if self._framed_text is not None and type(delta) is Text:
            framed = self._framed_text(delta.text)
            if framed is not None:
                return framed
        pieces = self.tr.feed(delta)
        return self.encoding.frame(pieces) if pieces else b""

    def closing(self) -> bytes:
        return self.encoding.frame(self.tr.finish())

    def failed(self, exc: SwitchyardError) -> bytes:
        head = self.opening() if self.tr.opens_before_error and not self._opened else b""
        return head + self.encoding.frame(self.tr.fail(exc))

    def whole(self) -> dict[str, Any]:
        return self.tr.whole()

    def usage(self) -> tuple[int, int] | None:
        return self.tr.counts()

    def wants_prompt_count(self) -> bool:
        return self.tr.wants_prompt_count()

    def prompt_counted(self, tokens: int) -> None:
        self.tr.prompt_counted(tokens)

    def loaded(self, seconds: float) -> None:
        self.tr.loaded(seconds)
