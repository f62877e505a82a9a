"""The prompt preflight of MLX lanes: mlx_lm.server sizes its cache as requests come and would take any
prompt, so a request is bounded here by the model's trained window, counted with its own tokenizer.json
(the `tokenizers` package; without it, or without the file, the engine decides)."""

from __future__ import annotations

import asyncio
import functools
import json
from pathlib import Path
from typing import Any

from app.core.errors import ContextLengthExceededError
from app.core.settings import Settings
from app.lanes.target import Target


def mlx_window(target: Target, settings: Settings) -> tuple[int, Path] | None:
    """(tokens a request may hold, the model folder) of a lane whose plan carries a prompt bound (MLX:
    its trained window, else the configured default); None for other targets."""
    plan = getattr(target, "plan", None)
    bound = getattr(plan, "prompt_bound", None)
    if bound is None:
        return None
    return bound.tokens, Path(bound.tokenizer).parent


async def check_window(
    target: Target, body: dict[str, Any], *, route: str, settings: Settings, param: str | None = None
) -> None:
    """Refuse a prompt an MLX lane's window cannot hold, with the numbers (ContextLengthExceededError).
    The texts alone are counted: the chat template only adds, so this never refuses a prompt that fits."""
    found = mlx_window(target, settings)
    if found is None:
        return
    window, folder = found
    texts = _prompt_texts(body, route=route)
    if not texts:
        return
    counts = await asyncio.to_thread(_count_tokens, folder / "tokenizer.json", texts)
    if counts is None:
        return  # no tokenizer here to count with: the engine decides
    n = sum(counts) if route == "chat" else max(counts)
    if n < window:
        return
    params = getattr(getattr(target, "plan", None), "params", None)
    if getattr(params, "trained_context", None):
        where = "max_position_embeddings in its config.json"
    else:  # no trained window in config.json: the bound is the configured default context
        where = (
            "its config.json states no trained window, so the configured default context applies; "
            "set ctx_size to change it"
        )
    raise ContextLengthExceededError(
        f"the prompt is at least {n} tokens, but model {target.model_id!r} has a window of {window} tokens "
        f"({where}), and a prompt must leave room for at least one generated token; shorten the prompt "
        "or the conversation",
        param=param or ("messages" if route == "chat" else "prompt"),
        tokens=n,
        limit=window,
    )


def _prompt_texts(body: dict[str, Any], *, route: str) -> list[str]:
    """Chat: every message's text and the tools' schemas; completions: each prompt of the batch."""
    if route != "chat":
        prompt = body.get("prompt")
        texts = [prompt] if isinstance(prompt, str) else prompt
        return [t for t in texts if isinstance(t, str)] if isinstance(texts, list) else []
    out: list[Any] = []
    for m in body.get("messages") or ():
        content = m.get("content") if isinstance(m, dict) else None
        parts = [content] if isinstance(content, str) else content if isinstance(content, list) else []
        out += [p.get("text") if isinstance(p, dict) else p for p in parts]
    if body.get("tools"):
        out.append(json.dumps(body["tools"]))
    return [t for t in out if isinstance(t, str) and t]


def _count_tokens(path: Path, texts: list[str]) -> list[int] | None:
    try:
        tok = _tokenizer(path, path.stat().st_mtime_ns)
    except OSError:
        return None
    if tok is None:
        return None
    return [len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False)]


@functools.lru_cache(maxsize=8)  # parsed tokenizers of immutable files, keyed by path and mtime
def _tokenizer(path: Path, _mtime_ns: int) -> Any:
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None
    try:
        return Tokenizer.from_file(str(path))
    except Exception:  # a tokenizer.json this version cannot read: leave the count to the engine
        return None
