"""A streaming chat client on the one delta reader (app/chat/deltas.py), with no Qt in it: the desktop Chat
page paints what it yields, and scripts or tests can use it the same way.

It talks to a Switchyard server (or any OpenAI-compatible one) over HTTP, like an editor would, so the chat
window exercises the same path as every other client.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any

import aiohttp

from app.chat.deltas import Delta, StreamReader, StreamRefusal


class ChatError(Exception):
    """The server refused the chat, or could not be reached; the message says what to do."""


def _message_of(payload: bytes | str) -> str:
    """The `error.message` of an OpenAI envelope, or the text itself."""
    try:
        doc = json.loads(payload)
    except ValueError:
        return payload.decode("utf-8", "replace") if isinstance(payload, bytes) else payload
    err = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(err, dict) and err.get("message"):
        return str(err["message"])
    return str(err) if err else str(doc)


async def stream_chat(
    url: str,
    body: dict[str, Any],
    *,
    api_key: str | None = None,
    session: aiohttp.ClientSession | None = None,
) -> AsyncGenerator[Delta, None]:
    """POST `body` (made a stream) to `url`/v1/chat/completions and yield its deltas as they arrive.

    Raises ChatError for a refusal (HTTP status or an error inside the stream) and for a server that does
    not answer. Closing the iterator early (Stop) closes the connection, so the engine stops generating."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    own = session is None
    http = session or aiohttp.ClientSession()
    try:
        async with http.post(
            f"{url.rstrip('/')}/v1/chat/completions",
            json={**body, "stream": True},
            headers=headers,
        ) as resp:
            if resp.status != 200:
                raise ChatError(f"{_message_of(await resp.read())} (HTTP {resp.status})")
            reader = StreamReader()
            async for piece in resp.content.iter_any():
                try:
                    deltas = reader.deltas(piece)
                except StreamRefusal as exc:
                    raise ChatError(_message_of(exc.payload)) from None
                for delta in deltas:
                    yield delta
                if reader.done:
                    return
    except aiohttp.ClientError as exc:
        raise ChatError(
            f"the local server did not answer ({exc}); check the Server page, then Regenerate"
        ) from exc
    finally:
        if own:
            await http.close()
