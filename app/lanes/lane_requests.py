"""What a local lane adds to a request, and what it tells about one, for the gateway (app/lanes/target.py).

The gateway asks a `Target` (a `Lane`'s methods delegate here) and never imports an engine kind: a lane
whose engine has llama.cpp slots fills in the output cap a request left open and the LoRA scales of a
`BASE+ADAPTER` id, says when its draft model does not pay, and reports its slots' speculation. Other
engines add nothing (None). `adapter_base`, `adapter_ids` and `request_limits` answer the same questions
about a model before any lane runs it (/v1/models, /api/show, resolving a `BASE+ADAPTER` id).
"""

from __future__ import annotations

from typing import Any, Protocol

import aiohttp

from app.core.settings import Settings
from app.lanes.engines.llamacpp import request_defaults as llama
from app.lanes.engines.llamacpp.spec import engine_speculation, speculation_for
from app.lanes.engines.plan import ApiStyle, LaunchPlan
from app.lanes.engines.registry import kind_of


class Lane(Protocol):
    """What these questions read of a lane (app/lanes/lane.py's Lane has it; not imported: it imports us)."""

    model_id: str
    plan: LaunchPlan | None

    def slot_context(self) -> tuple[int, int, int] | None: ...


def lane_defaults(
    lane: Lane, body: dict[str, Any], *, route: str, settings: Settings
) -> dict[str, Any] | None:
    """The output cap for a request that names none, the LoRA scales of a `BASE+ADAPTER` id and a JSON
    schema sent as a grammar (request_defaults.with_schema_grammar); None when
    the lane has no llama.cpp slots (its engine decides) or nothing changes."""
    ctx = lane.slot_context()
    if route not in ("chat", "completions") or ctx is None or lane.plan is None:
        return None
    limit = llama.max_output(lane.model_id, settings, slot_ctx=ctx[0])
    out = llama.with_max_output(body, limit=limit) or body
    params = lane.plan.params  # a llama.cpp plan's LlamaParams (slot_context said so)
    paths, scales = getattr(params, "lora_paths", ()), getattr(params, "lora_scales", ())
    out = llama.with_adapter(out, model_id=lane.model_id, paths=paths, scales=scales) or out
    out = llama.with_schema_grammar(out) or out  # never through the engine's chat parser (issue 31, 6)
    return out if out is not body else None


def lane_draft_unsuited(lane: Lane, body: dict[str, Any], *, settings: Settings) -> str | None:
    """Why the lane's draft model does not pay on `body` ("grammar", "json_schema", "tools", "temperature");
    None when it does or the lane has no draft. The engine drafts regardless (it reads no per-request
    speculation field), so this is only reported."""
    params = getattr(lane.plan, "params", None)
    if getattr(params, "spec_type", "") != "draft_simple":
        return None
    spec = speculation_for(lane.model_id, settings)
    return llama.draft_unsuited(body, max_temperature=spec.max_temperature)


def wants_logprobs(body: dict[str, Any]) -> bool:
    """Whether a chat or completion request asks for log probabilities (OpenAI's fields or llama.cpp's)."""
    lp, n = body.get("logprobs"), body.get("n_probs")
    asked = lp is True or (isinstance(lp, int) and not isinstance(lp, bool) and lp > 0)
    return asked or bool(body.get("top_logprobs")) or (isinstance(n, int) and n > 0)


def lane_logprobs_partial(lane: Lane, body: dict[str, Any]) -> str | None:
    """Why `body`'s log probabilities come back for only some tokens on this lane (None: they do not):
    a speculating llama.cpp gives them for the tokens it sampled itself, not for those it accepted from
    its draft, and reads no per-request switch to stop drafting."""
    spec_type = getattr(getattr(lane.plan, "params", None), "spec_type", "")
    if not spec_type or not wants_logprobs(body):
        return None
    kind = spec_type.removesuffix("_simple")  # the engine's name for it, "draft_simple" -> "draft"
    return (
        f"partial: {lane.model_id!r} runs with speculative decoding ({kind}), and llama.cpp gives log "
        "probabilities only for the tokens it sampled itself, not for those it accepted from the draft; "
        f'for every token\'s, load it with "speculative": {{"type": "off"}} (POST /api/models/'
        f"{lane.model_id}/load, or model_overrides)"
    )


async def lane_speculation(http: aiohttp.ClientSession, base_url: str) -> dict[str, Any]:
    """Whether a ready llama.cpp engine speculates, per slot, from its own /slots (its /props says "none"
    even when it does)."""
    return await engine_speculation(http, base_url)


def adapter_ids(model_id: str, settings: Settings) -> list[str]:
    """The `BASE+ADAPTER` ids a base model answers to (one per adapter its settings load)."""
    return llama.adapter_ids(model_id, settings)


def adapter_base(model: str, settings: Settings) -> str | None:
    """The base id of a `BASE+ADAPTER` id whose base loads that adapter, else None."""
    split = llama.split_adapter_id(model)
    if split is None:
        return None
    return split[0] if model in llama.adapter_ids(split[0], settings) else None


def request_limits(
    model_id: str, settings: Settings, *, slot_ctx: int, chat_template: str | None
) -> dict[str, Any]:
    """{"context_length", "max_output", "tools"} a llama.cpp chat model offers one request."""
    return llama.model_limits(model_id, settings, slot_ctx=slot_ctx, chat_template=chat_template).public()


def speaks_llama_server(engine: str | None) -> bool:
    """Whether the kind of lane id `engine` speaks llama-server's API (slots, /props, its own tool-call
    parser); False for a remote or an unknown id. The gateway asks this instead of naming lanes."""
    kind = kind_of(engine) if engine else None
    return kind is not None and kind.api_style is ApiStyle.LLAMA_SERVER
