"""Headers a request earns on its way to the engine (a thinking switch the template ignores, a max_tokens
clamped to the slot), added to its answer however that answer is made.

The OpenAI pass-through answers through several paths (the byte relay, a whole answer, the read loop), each
building its own response; a note is kept on the request instead, and `on_response_prepare` adds it to
whichever response goes out. A stream whose headers went out while its model loaded cannot carry a note
found later: the request still runs as noted.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

NOTES: web.RequestKey[dict[str, str]] = web.RequestKey("response_notes", dict)


def note(request: web.Request, headers: dict[str, str]) -> None:
    """Keep `headers` for `request`'s answer (beside notes kept before)."""
    if headers:
        request[NOTES] = {**request.get(NOTES, {}), **headers}


async def _send_notes(request: web.Request, response: web.StreamResponse) -> None:
    for name, value in request.get(NOTES, {}).items():
        response.headers.setdefault(name, value)


def mark_partial_logprobs(answer: dict[str, Any], why: str) -> None:
    """Say in a whole answer's body, beside its header, why its log probabilities cover only some tokens:
    each choice's `logprobs` object gets `"partial": why` (clients keep fields they do not know). A stream
    is relayed as the engine wrote it: its header says it."""
    for choice in answer.get("choices") or ():
        if isinstance(choice, dict) and isinstance(choice.get("logprobs"), dict):
            choice["logprobs"]["partial"] = why


def install(app: web.Application) -> None:
    """Add the notes to every answer of `app` (one line in the app factory)."""
    app.on_response_prepare.append(_send_notes)
