"""`dimensions` on /v1/embeddings: llama.cpp ignores the field, so the gateway asks for whole float vectors
and returns each one cut to its first `dimensions` values and scaled back to unit length (what OpenAI's
shortened embeddings and Ollama's /api/embed give), in the encoding the client asked for."""

from __future__ import annotations

import base64
import json
import struct
from typing import Any

from app.core.errors import BadRequestError


def wanted_dimensions(body: dict[str, Any]) -> int | None:
    """The `dimensions` asked for (None: the whole vector); a 400 for anything but a positive integer."""
    dims = body.get("dimensions")
    if dims is None:
        return None
    if isinstance(dims, bool) or not isinstance(dims, int) or dims < 1:
        raise BadRequestError("'dimensions' must be a positive integer", param="dimensions")
    return dims


def engine_body(body: dict[str, Any]) -> dict[str, Any]:
    """What the engine gets: no `dimensions`, float vectors (cut here, then encoded as asked)."""
    out = {k: v for k, v in body.items() if k != "dimensions"}
    out["encoding_format"] = "float"
    return out


def shortened(vector: list[float], dimensions: int) -> list[float]:
    """The first `dimensions` values at unit length; a vector that short already is returned whole."""
    head = vector[:dimensions]
    norm = sum(x * x for x in head) ** 0.5
    return [x / norm for x in head] if norm else head


def cut_answer(data: bytes, *, dimensions: int, encoding: str) -> bytes:
    """The engine's float answer with each vector shortened and encoded as `encoding` ("float" or
    "base64": little-endian float32, as OpenAI sends it). An answer without vectors (an error) is returned
    as it came."""
    try:
        answer = json.loads(data)
    except ValueError:
        return data
    items = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(items, list):
        return data
    for item in items:
        vec = item.get("embedding") if isinstance(item, dict) else None
        if not isinstance(vec, list):
            continue
        cut = shortened([float(x) for x in vec], dimensions)
        if encoding == "base64":
            item["embedding"] = base64.b64encode(struct.pack(f"<{len(cut)}f", *cut)).decode()
        else:
            item["embedding"] = cut
    return json.dumps(answer).encode()
