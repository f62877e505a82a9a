"""Which library models the window offers for chat: the Chat page's list, its default for a new chat, and
the model the Server page's snippets name. A whisper model or a Piper voice is servable but cannot chat (a
chat request to it fails with 400), so neither is ever offered or chosen by default."""

from __future__ import annotations

from typing import Any

CHAT_KIND = "chat"


def chat_model_ids(catalog: Any) -> list[str]:
    """The servable models that answer /v1/chat/completions, in the catalog's order."""
    return [e.id for e in catalog.servable() if e.kind == CHAT_KIND]


def why_not_chat(catalog: Any, model: str) -> str | None:
    """Why `model` cannot be chatted with (a speech, transcription, embedding or image model), or None when
    it can or is not in the library (the gateway then says so itself)."""
    entry = catalog.find(model)
    if entry is None or entry.kind == CHAT_KIND:
        return None
    return (
        f"{model} is a {entry.kind} model: it cannot chat. Pick a chat model in the list above "
        "(or download one on Discover)."
    )
