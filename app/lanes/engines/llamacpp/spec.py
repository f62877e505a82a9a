"""Speculative decoding and LoRA adapters on a llama.cpp lane: the settings as engine parameters.

llama.cpp reads both only at start (a request's own speculative fields are ignored), so they are lane
settings: `model_overrides[<id>].speculative` / `.lora`, or a load body's (docs/engines.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import aiohttp

from app.core.errors import ModelBrokenError
from app.core.settings import Settings
from app.core.speculation import Adapter, Speculation, adapters_of, speculation_of
from app.fit.memory import FitParams, kv_layer_bytes
from app.formats.gguf_adapter import adapter_refusal, read_adapter
from app.formats.gguf_layout import read_gguf_layout
from app.formats.gguf_meta import GGUFProblem
from app.lanes.workers.params import LlamaParams
from app.library.drafts import choose_draft
from app.library.model import ModelEntry

# our type names -> llama.cpp's (the wheel's enum without its prefix, lower case)
_ENGINE_TYPE = {"draft": "draft_simple"}


def speculation_for(model_id: str, settings: Settings) -> Speculation:
    return speculation_of(settings.override(model_id, "speculative", None))


def adapters_for(model_id: str, settings: Settings) -> tuple[Adapter, ...]:
    return adapters_of(settings.override(model_id, "lora", None))


def adapter_paths(model_path: Path, adapters: tuple[Adapter, ...], *, model_id: str) -> list[Path]:
    """Each adapter's file (relative to the model's folder unless absolute); ModelBrokenError for one
    that is missing, in words that say where to fix it."""
    out = []
    for a in adapters:
        p = Path(a.file).expanduser()
        p = p if p.is_absolute() else model_path.parent / p
        fix = f"fix or remove model_overrides[{model_id!r}].lora"
        if not p.is_file():
            raise ModelBrokenError(f"the LoRA adapter {p} for {model_id!r} does not exist; {fix}")
        facts = read_adapter(p)
        if facts is None:
            raise ModelBrokenError(f"{p} is not a LoRA adapter GGUF (general.type = adapter); {fix}")
        # llama.cpp would fail the whole start on a mismatch: refuse it here, with the reason
        if (refusal := adapter_refusal(facts, model_path)) is not None:
            raise ModelBrokenError(f"the LoRA adapter {p.name} does not fit {model_id!r}: {refusal}; {fix}")
        out.append(p)
    return out


def spec_params(
    model_id: str, settings: Settings, *, model_path: Path, draft: Path | None, gpu_layers: int
) -> dict[str, Any]:
    """LlamaParams fields for this model's speculation and adapters (empty when neither is set)."""
    spec = speculation_for(model_id, settings)
    out: dict[str, Any] = {}
    if spec.on:
        if spec.type == "draft" and draft is None:
            raise ModelBrokenError(
                f"speculative decoding with a draft model is set for {model_id!r}, but no draft model "
                f"pairs with it (see `switchyard explain {model_id}`); name one with the same tokenizer "
                f'in model_overrides[{model_id!r}].speculative.draft, or use {{"type": "ngram"}}'
            )
        out["spec_type"] = _ENGINE_TYPE.get(spec.type, spec.type)
        knobs = ("n_max", "n_min", "p_min", "size_n", "size_m", "min_hits", "n_match")
        out.update({f"spec_{k}": getattr(spec, k) for k in knobs if getattr(spec, k) is not None})
        if draft is not None and spec.type == "draft":
            out["draft_path"] = str(draft)
            out["draft_gpu_layers"] = gpu_layers  # the draft goes where the model's layers go
    adapters = adapters_for(model_id, settings)
    if adapters:
        out["lora_paths"] = tuple(str(p) for p in adapter_paths(model_path, adapters, model_id=model_id))
        out["lora_scales"] = tuple(a.scale for a in adapters)
    return out


def spec_argv(params: LlamaParams) -> list[str]:
    """The same parameters as llama-server's command-line flags. Each n-gram kind has its own flags
    (`--spec-ngram-simple-size-n`, `--spec-ngram-mod-n-max` ...); `--spec-draft-*` are the draft model's
    only. A negative knob is left out: the engine keeps its default."""
    args: list[str] = []
    if params.spec_type:
        kind = params.spec_type
        args += ["--spec-type", kind.replace("_", "-")]
        flags: dict[str, float] = {}
        if kind in ("ngram_simple", "ngram_map_k", "ngram_map_k4v"):
            prefix = "--spec-" + kind.replace("_", "-")
            flags = {
                f"{prefix}-size-n": params.spec_size_n,
                f"{prefix}-size-m": params.spec_size_m,
                f"{prefix}-min-hits": params.spec_min_hits,
            }
        elif kind == "ngram_mod":
            flags = {
                "--spec-ngram-mod-n-match": params.spec_n_match,
                "--spec-ngram-mod-n-min": params.spec_n_min,
                "--spec-ngram-mod-n-max": params.spec_n_max,
            }
        elif kind == "draft_simple":
            flags = {
                "--spec-draft-n-max": params.spec_n_max,
                "--spec-draft-n-min": params.spec_n_min,
                "--spec-draft-p-min": params.spec_p_min,
            }
        args += [w for flag, v in flags.items() if v >= 0 for w in (flag, str(v))]
        if params.draft_path and kind == "draft_simple":
            args += ["--spec-draft-model", params.draft_path]
            args += ["--spec-draft-ngl", str(params.draft_gpu_layers)]
    for path, scale in zip(params.lora_paths, params.lora_scales, strict=True):
        args += ["--lora-scaled", path, str(scale)]
    return args


def with_draft(entry: ModelEntry, settings: Settings, library: Iterable[ModelEntry]) -> ModelEntry:
    """`entry` with the draft model its start loads (speculative type "draft"); unchanged otherwise.
    A named draft with another tokenizer is refused here, with the reason."""
    spec = speculation_for(entry.id, settings)
    if spec.type != "draft":
        return entry
    pairing = choose_draft(entry, library, named=spec.draft, formats=("gguf",))  # llama.cpp loads GGUFs
    if pairing.draft is None:
        raise ModelBrokenError(
            f"cannot start {entry.id!r} with a draft model: {pairing.reason}; name a draft with the same "
            f'tokenizer in model_overrides[{entry.id!r}].speculative.draft, or use {{"type": "ngram"}}'
        )
    return dataclasses.replace(entry, draft=pairing.draft.path)


def extra_memory(entry: ModelEntry, settings: Settings, *, params: FitParams) -> FitParams:
    """`params` with the draft model (its file and its own KV cache at the same context) and the LoRA
    adapters' files counted; a file that cannot be read counts nothing (the start says why)."""
    draft = 0
    if entry.draft is not None and speculation_for(entry.id, settings).type == "draft":
        layout = read_gguf_layout(entry.draft)
        if not isinstance(layout, GGUFProblem):
            draft = _file_bytes(entry.draft) + sum(kv_layer_bytes(layout, params=params))
    try:
        paths = adapter_paths(entry.path, adapters_for(entry.id, settings), model_id=entry.id)
        lora = sum(_file_bytes(p) for p in paths)
    except ModelBrokenError:
        lora = 0
    return dataclasses.replace(params, draft_bytes=draft, lora_bytes=lora)


def _file_bytes(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def slots_speculation(slots: Any) -> dict[str, Any]:
    """Whether speculation is active, from llama.cpp's `/slots` (each slot's `speculative` flag; /props
    says "none" even when it is on): {"active": bool | None, "slots": [bool | None per slot], "type"}.
    `active` is None when the answer carries no flag to read."""
    rows = slots if isinstance(slots, list) else []
    flags = [row.get("speculative") if isinstance(row, dict) else None for row in rows]
    known = [f for f in flags if isinstance(f, bool)]
    params = [row["params"] for row in rows if isinstance(row, dict) and isinstance(row.get("params"), dict)]
    # a slot names the type of the last request it served (nothing before its first; "none" when off)
    kinds = sorted({str(p["speculative.types"]) for p in params if p.get("speculative.types")})
    named = [k for k in kinds if k != "none"]
    return {
        "active": any(known) if known else None,
        "slots": [f if isinstance(f, bool) else None for f in flags],
        "type": ",".join(named) if named else (kinds[0] if kinds else None),
    }


async def engine_speculation(http: aiohttp.ClientSession, base_url: str) -> dict[str, Any]:
    """`slots_speculation` of a running llama.cpp engine; {"active": None, "error": why} when its /slots
    cannot be read (the lane not ready, or an engine started without the slots endpoint)."""
    try:
        async with http.get(base_url + "/slots", timeout=aiohttp.ClientTimeout(total=5)) as r:
            if r.status != 200:
                return {"active": None, "slots": [], "type": None, "error": f"/slots answered {r.status}"}
            return slots_speculation(await r.json(content_type=None))
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        return {"active": None, "slots": [], "type": None, "error": f"/slots unreadable: {exc!r}"}
