"""The Anthropic stream's text fast path (MessageTranslator.framed_text): the bytes it writes for a text
piece are the bytes the general path (feed, then the encoding's frame) writes, for every kind of text, and
the answer it leaves behind (blocks, usage, the whole message) is the same."""

from __future__ import annotations

from typing import Any

import pytest

from app.chat.deltas import Delta, Finish, Reasoning, Text, Usage
from app.server.surfaces.anthropic.translate import MessageTranslator
from app.server.surfaces.registry import SURFACES
from app.server.surfaces.translation import TranslatedRun

ENCODING = next(s for s in SURFACES if s.name == "anthropic").encoding

TEXTS = [
    "plain",
    ' "quoted" and \\ back',
    "line\nbreak\ttab\r",
    "\x00\x01\x1f control",
    "é ü ß — “curly” 日本語",
    "emoji 🚀 and \u2028 \u2029",
    "</script>&<>",
    " ",
]


class _General(MessageTranslator):
    """The same translator without its fast path: every piece through feed and the encoding's frame."""

    framed_text = None  # type: ignore[assignment]


def _stream(tr: MessageTranslator, deltas: list[Delta]) -> tuple[bytes, dict[str, Any]]:
    run = TranslatedRun(tr, encoding=ENCODING)
    out = run.opening() + b"".join(run.feed(d) for d in deltas) + run.closing()
    return out, tr.message()


def _same_ids(a: MessageTranslator, b: MessageTranslator) -> None:
    b.id = a.id  # message ids are random per answer


@pytest.mark.parametrize(
    "deltas",
    [
        [Text(t) for t in TEXTS],
        [Reasoning("think "), Reasoning("more"), *(Text(t) for t in TEXTS), Finish("stop")],
        [Text("a"), Reasoning("between"), Text("b"), Text("c"), Usage(7, 3), Finish("length")],
        [Text(""), Text("x"), Text(""), Text("y")],
    ],
    ids=["texts", "thinking-then-text", "alternating", "empty-pieces"],
)
def test_fast_path_writes_the_general_paths_bytes(deltas: list[Delta]) -> None:
    fast, general = MessageTranslator(model="m"), _General(model="m")
    _same_ids(fast, general)
    fast_bytes, fast_message = _stream(fast, deltas)
    general_bytes, general_message = _stream(general, deltas)
    assert fast_bytes == general_bytes
    assert fast_message == general_message
    assert fast.usage() == general.usage()


def test_text_pieces_make_the_whole_text() -> None:
    tr = MessageTranslator(model="m")
    run = TranslatedRun(tr, encoding=ENCODING)
    run.opening()
    pieces = [f"piece {i} " for i in range(2000)]
    for p in pieces:
        run.feed(Text(p))
    last = tr.framed_text("end")  # an open text block: the fast path answers
    assert last is not None and last.endswith(b'"text": "end"}}\n\n')
    pieces.append("end")
    run.closing()
    assert tr.message()["content"] == [{"type": "text", "text": "".join(pieces)}]
    assert tr.usage()["output_tokens"] == len(pieces)


def test_stop_sequences_take_the_general_path() -> None:
    tr = MessageTranslator(model="m", stop_sequences=["STOP"])
    run = TranslatedRun(tr, encoding=ENCODING)
    run.opening()
    assert tr.framed_text("abc") is None  # the scanner must see every piece
    out = run.feed(Text("one ST")) + run.feed(Text("OP two"))
    assert b"one " in out and b"two" not in out
    assert tr.stop_sequence == "STOP"
