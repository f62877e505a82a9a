"""The bytes of the three stream formats: named server-sent events, NDJSON lines and SSE comments.

Its own module (standard library only): each surface's `Encoding` (base.py) and the translators frame
with these.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

# one encoder for every event: json.dumps with an option builds a new encoder per call, per streamed event
_JSON = json.JSONEncoder(ensure_ascii=False).encode


def json_text(text: str) -> str:
    """`text` as a JSON string, exactly as the events' encoder writes a string inside an event."""
    return _JSON(text)


def sse_events(events: Sequence[tuple[str, Any]]) -> bytes:
    """Named server-sent events (`event: NAME` and its JSON `data:`), as Anthropic and Responses stream."""
    if len(events) == 1:  # the common piece: one event, no generator
        name, data = events[0]
        return f"event: {name}\ndata: {_JSON(data)}\n\n".encode()
    return b"".join(f"event: {name}\ndata: {_JSON(data)}\n\n".encode() for name, data in events)


def ndjson(objs: Sequence[dict[str, Any]]) -> bytes:
    """One JSON object a line, as Ollama streams."""
    return b"".join(_JSON(o).encode() + b"\n" for o in objs)


def loading_comment(model: str, phase: str, seconds: float) -> bytes:
    """An SSE comment line: clients skip it, a person reading the stream sees why it waits."""
    return f": switchyard: loading {model} ({phase}, {seconds:.0f} s)\n\n".encode()
