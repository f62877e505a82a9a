"""`/v1/completions` answers with OpenAI's `cmpl-` ids: llama.cpp gives them its chat prefix (`chatcmpl-`).

A client that files answers by id prefix (or checks it) takes a completion for a chat answer otherwise.
The whole answer is fixed where it is built (app/server/gateway/whole.py); a stream passes through
CompletionIds, which rewrites only the id's prefix, across reads cut anywhere.
"""

from __future__ import annotations

from typing import Any

_CHAT = b'"id":"chatcmpl-'
_OURS = b'"id":"cmpl-'


def completion_id(answer: dict[str, Any]) -> None:
    """A whole completion's id with the completions prefix (in place)."""
    got = answer.get("id")
    if isinstance(got, str) and got.startswith("chatcmpl-"):
        answer["id"] = "cmpl-" + got.removeprefix("chatcmpl-")


class CompletionIds:
    """A relay's stream edit (app/server/gateway/relay.py StreamEdit): every event's chat-prefixed id as
    a completion id; everything else as it came. Holds back at most the pattern's length less one byte."""

    def __init__(self) -> None:
        self.held = b""

    def feed(self, data: bytes) -> bytes:
        text = (self.held + data).replace(_CHAT, _OURS)
        keep = len(_CHAT) - 1
        # a pattern cut by the read: its first bytes wait for the rest
        cut = next((n for n in range(keep, 0, -1) if text.endswith(_CHAT[:n])), 0)
        self.held = text[len(text) - cut :] if cut else b""
        return text[: len(text) - cut] if cut else text

    def close(self) -> bytes:
        rest, self.held = self.held, b""
        return rest
