"""What an error says to do when a request has too little context (core's prompt check, images)."""

from __future__ import annotations


def more_context(model: str, *, parallel: int | None) -> str:
    """How to give a model's requests more context, for the errors that say they have too little: lower
    `parallel` only where there is more than one slot, and a way that reaches the running server (it
    does not re-read settings.json)."""
    what = "raise ctx_size or lower parallel" if parallel is None or parallel > 1 else "raise ctx_size"
    return (
        f"{what} for it (PUT /api/settings with model_overrides[{model!r}] applies at once and restarts "
        "its lane; an edit of settings.json waits for the server's next start). A slot never holds more "
        "than the model's trained context, whatever ctx_size says"
    )
