"""What a local llama.cpp lane fills in on a request its client left open, and the model facts editors need.

Every surface reaches the gateway as an OpenAI chat or completion body, so these apply once, there
(Gateway.pin_slot): the output cap (`max_output`) when the request names no limit, the LoRA scales of
the adapter a `BASE+ADAPTER` model id asks for, and a JSON schema sent as a grammar (schema_grammar.py).
`model_limits` is what /v1/models and the Server page's
editor snippets report: the per-slot context, the output cap and whether the template takes tools.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.core.settings import Settings
from app.core.speculation import adapters_of
from app.lanes.engines.llamacpp.schema_grammar import UnsupportedSchema, schema_grammar

log = logging.getLogger("switchyard.llamacpp")

# an agent's answer should not run a slot to its end, nor be cut short of a useful edit
MAX_OUTPUT_MIN = 1024
MAX_OUTPUT_MAX = 8192
# the fields by which a request already names its own output limit (llama.cpp reads all three)
_LIMIT_KEYS = ("max_tokens", "max_completion_tokens", "n_predict")
ADAPTER_SEP = "+"


def default_max_output(slot_ctx: int) -> int:
    """A quarter of the per-slot context, within MAX_OUTPUT_MIN..MAX_OUTPUT_MAX, never more than the slot."""
    return max(1, min(slot_ctx, max(MAX_OUTPUT_MIN, min(MAX_OUTPUT_MAX, slot_ctx // 4))))


def max_output(model_id: str, settings: Settings, *, slot_ctx: int) -> int:
    """`model_overrides[model_id].max_output` (cut to the slot), else the default for this slot."""
    chosen = settings.override(model_id, "max_output", None)
    return min(int(chosen), slot_ctx) if chosen else default_max_output(slot_ctx)


def with_max_output(body: dict[str, Any], *, limit: int) -> dict[str, Any] | None:
    """`body` with `max_tokens: limit` when it names no output limit of its own (absent or null), else None:
    a value the client sent, even a bad one, is the engine's to take or refuse. (Ollama's num_predict -1
    arrives without max_tokens: its translation drops it.)"""
    if any(body.get(k) is not None for k in _LIMIT_KEYS):
        return None
    trimmed = {k: v for k, v in body.items() if k not in _LIMIT_KEYS}
    return {**trimmed, "max_tokens": limit}


# ---- LoRA adapters as model ids ----------------------------------------------------------------------
def adapter_name(path: str | Path) -> str:
    """The name an adapter file is served under after `BASE+`: its file name without `.gguf`."""
    name = Path(path).name
    return name[: -len(".gguf")] if name.lower().endswith(".gguf") else name


def split_adapter_id(model: str) -> tuple[str, str] | None:
    """(base, adapter) of a `BASE+ADAPTER` id, or None for an id without the separator."""
    base, sep, adapter = model.rpartition(ADAPTER_SEP)
    return (base, adapter) if sep and base and adapter else None


def adapter_ids(model_id: str, settings: Settings) -> list[str]:
    """The `BASE+ADAPTER` ids of the adapters `model_overrides[model_id].lora` loads with the model."""
    return [
        f"{model_id}{ADAPTER_SEP}{adapter_name(a.file)}"
        for a in adapters_of(settings.override(model_id, "lora", None))
    ]


def with_adapter(
    body: dict[str, Any], *, model_id: str, paths: Sequence[str], scales: Sequence[float]
) -> dict[str, Any] | None:
    """`body` with llama-server's per-request `lora` scales: the adapter its model id names at its
    configured scale, every other loaded adapter at 0 (the bare base id runs without any). None when the
    lane loaded no adapter or the client set `lora` itself."""
    if not paths or "lora" in body:
        return None
    asked = str(body.get("model") or model_id)
    split = split_adapter_id(asked) if asked != model_id else None
    wanted = split[1] if split is not None and split[0] == model_id else None
    lora = [
        {"id": i, "scale": float(scale) if adapter_name(path) == wanted else 0.0}
        for i, (path, scale) in enumerate(zip(paths, scales, strict=True))
    ]
    return {**body, "lora": lora}


# ---- a JSON schema as a grammar -------------------------------------------------------------------------
def requested_schema(body: dict[str, Any]) -> Any | None:
    """The JSON schema a chat or completion body holds its answer to (`response_format` json_schema or
    json_object, or llama.cpp's own `json_schema` field), or None when it asks for none."""
    if body.get("json_schema") is not None:
        return body["json_schema"]
    fmt = body.get("response_format")
    if not isinstance(fmt, dict):
        return None
    if fmt.get("type") == "json_schema":
        inner = fmt.get("json_schema")
        schema = inner.get("schema") if isinstance(inner, dict) else fmt.get("schema")
        return schema if schema is not None else {"type": "object"}
    if fmt.get("type") == "json_object":
        return fmt.get("schema") or {"type": "object"}
    return None


def with_schema_grammar(body: dict[str, Any]) -> dict[str, Any] | None:
    """`body` with its JSON schema sent as a GBNF `grammar` (schema_grammar.py says why: llama.cpp's chat
    parser rejects answers its own schema grammar let through), or None: no schema, a grammar or tools of
    its own, or a schema that converter does not cover (the engine then converts it itself)."""
    if body.get("grammar") or body.get("tools"):
        return None
    schema = requested_schema(body)
    if schema is None:
        return None
    try:
        grammar = schema_grammar(schema)
    except UnsupportedSchema as exc:
        log.info("JSON schema left to llama.cpp's own converter: %s", exc)
        return None
    out = {k: v for k, v in body.items() if k not in ("response_format", "json_schema")}
    out["grammar"] = grammar
    return out


# ---- what a model offers an editor ----------------------------------------------------------------------
@dataclass(frozen=True)
class ModelLimits:
    """What one request may use on a llama.cpp model: tokens per slot, the default output cap, tools."""

    context: int
    max_output: int
    tools: bool

    def public(self) -> dict[str, Any]:
        return {"context_length": self.context, "max_output": self.max_output, "tools": self.tools}


def model_limits(
    model_id: str, settings: Settings, *, slot_ctx: int, chat_template: str | None
) -> ModelLimits:
    # a template that never mentions tools renders none: the model cannot be offered tool calls
    tools = "tools" in (chat_template or "")
    return ModelLimits(slot_ctx, max_output(model_id, settings, slot_ctx=slot_ctx), tools)


# ---- a draft model's fit to a request ---------------------------------------------------------------------
# llama.cpp's sampling temperature when a request sends none
ENGINE_DEFAULT_TEMPERATURE = 0.8


def draft_unsuited(body: dict[str, Any], *, max_temperature: float) -> str | None:
    """Why a draft model would not pay on this request, or None: "grammar", "json_schema" (a JSON schema
    or response_format json_schema / json_object: a grammar too), "tools", or "temperature" (above
    `max_temperature`; a request that sends none samples at llama.cpp's 0.8). The draft never sees the
    grammar, and at such temperatures most of its guesses are rejected (docs/performance.md).

    The llama.cpp build we ship ignores a request's own speculative fields (`speculative.n_max` 0 and
    `speculative.types` "none" still draft: tests/lanes/engines/llamacpp/test_spec.py), so this names the
    reason; it
    cannot turn the draft off for one request."""
    if body.get("grammar"):
        return "grammar"
    fmt = body.get("response_format")
    schema_format = isinstance(fmt, dict) and fmt.get("type") in ("json_schema", "json_object")
    if body.get("json_schema") or schema_format:
        return "json_schema"
    if body.get("tools"):
        return "tools"
    t = body.get("temperature", ENGINE_DEFAULT_TEMPERATURE)
    number = isinstance(t, int | float) and not isinstance(t, bool)
    return "temperature" if number and t > max_temperature else None
