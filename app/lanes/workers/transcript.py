"""Joining whisper.cpp's segments into one transcript (standard library only: it runs in the worker).

whisper.cpp usually starts a segment with a space, but not always (a segment after a sentence end often
starts bare), so a plain concatenation glues sentences together ("lazy dog.Please send"). A space goes
between two pieces where neither side has one and both sides are words or sentence ends of a spaced
script; scripts written without spaces (Chinese, Japanese, Thai) are joined as they are.
"""

from __future__ import annotations

from collections.abc import Iterable

_CLOSE = ".,!?;:)]}\"'"  # a piece that starts with these belongs to the word before it
_UNSPACED = ((0x0E00, 0x0E7F), (0x2E80, 0x9FFF), (0xAC00, 0xD7AF), (0xF900, 0xFAFF), (0xFF00, 0xFFEF))


def _unspaced(ch: str) -> bool:
    return any(lo <= ord(ch) <= hi for lo, hi in _UNSPACED)


def needs_space(before: str, piece: str) -> bool:
    """Whether `piece` needs a space to follow the text ending in `before`."""
    if not before or not piece:
        return False
    last, first = before[-1], piece[0]
    if last.isspace() or first.isspace() or first in _CLOSE:
        return False
    return not (_unspaced(last) or _unspaced(first))


def delta(before: str, piece: str) -> str:
    """A streamed piece as sent after the text `before` it: with the space it needs in front, so the
    deltas a client concatenates read as `joined` does (the first one without leading space)."""
    if not before:
        return piece.lstrip()
    return (" " if needs_space(before, piece) else "") + piece


def joined(pieces: Iterable[str]) -> str:
    """The segments' texts as one transcript, a space between sentences, the ends stripped."""
    out = ""
    for piece in pieces:
        out += (" " if needs_space(out, piece) else "") + piece
    return out.strip()
