"""Fit before download: the memory plan and routing decision for models that are still on the hub.

For a GGUF quantization the header of every part is read with Range requests (app.hub.range_reader),
written into sparse local stand-ins of the real sizes, and run through the same `explain()` a local file
gets, so a remote verdict is the verdict the downloaded file will have. The vision projector a pull would
fetch beside it (app.hub.selection) is read the same way and paired, so its weights and encoder buffer are
counted too. For a safetensors repository,
config.json and the shards' safetensors headers give the parameter count and bytes per dtype; the verdict is
then only about the weights (no KV cache model for those lanes yet), and says so.

It sits in app.advice (beside explain.py) because it joins hub, formats, fit and routing. ("Remote" in this
project means remote lanes only; this is the hub's side.)
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Any

from app.advice.explain import _gpu_shares, _hw_summary, explain
from app.advice.inputs import AdviceInputs, route_decision
from app.core.errors import HubError
from app.core.units import fmt_bytes
from app.fit.plan import rate
from app.formats.detect import ModelFormat, ModelKind
from app.formats.gguf_meta import GGUFFacts, read_gguf
from app.formats.safetensors_meta import SafetensorsModel, SafetensorsProblem, model_from_metadata
from app.hub.api import ModelDetail
from app.hub.quant import QuantChoice, RepoFile
from app.hub.range_reader import Prefix, RangeReader, sparse_copy
from app.hub.selection import pulled_projector
from app.library.model import ModelEntry
from app.routing import FitCheck

PARALLEL_READS = 4
VERDICT_WORDS = {
    "gpu": "fits on the GPU",
    "partial": "partial GPU offload",
    "cpu": "CPU only",
    "too_large": "does not fit",
}


def _unknown(reason: str, **extra: Any) -> dict[str, Any]:
    return {"verdict": None, "fits": None, "summary": reason, "problem": reason, "lane": None, **extra}


def speed_words(v: Mapping[str, Any]) -> str:
    """A verdict's generation speed in a few words: the calibrated figure, else the speed model's range,
    else "-" (nothing to estimate it from); what was measured here beside either."""
    measured = v.get("measured_tokens_per_s")
    also = f" (measured {rate(measured)})" if measured else ""
    if v.get("tokens_per_s"):
        return f"~{rate(v['tokens_per_s'])} tok/s{also}"
    band = v.get("tokens_per_s_range")
    if band:
        return f"{rate(band[0])}-{rate(band[1])} tok/s{also}"
    return f"{rate(measured)} tok/s measured" if measured else "-"


def fit_choice(
    repo: str,
    commit: str,
    choice: QuantChoice,
    *,
    reader: RangeReader,
    inputs: AdviceInputs,
    projector: RepoFile | None = None,
) -> dict[str, Any]:
    """The verdict for one quantization, with `projector` (the mmproj a pull fetches with it) counted; a hub
    error or unreadable header gives verdict None with why."""
    if not choice.complete:
        return _unknown(f"only {len(choice.files)} of its {choice.parts_expected} parts are on the hub")
    fetched = 0
    files = [*choice.files, *([projector] if projector is not None else [])]
    try:
        headers: list[tuple[RepoFile, Prefix]] = []
        for f in files:
            prefix = reader.gguf_header(repo, commit, f.path)
            fetched += prefix.fetched
            headers.append((f, prefix))
    except HubError as exc:
        return _unknown(exc.message, header_bytes_fetched=fetched)
    model_id = f"{repo}:{choice.name}"
    with tempfile.TemporaryDirectory(prefix="sy-remote-") as tmp:
        paths = [sparse_copy(Path(tmp), PurePosixPath(f.path).name, p.data, p.total) for f, p in headers]
        mmproj = paths.pop() if projector is not None else None
        facts = read_gguf(paths[0])
        if not isinstance(facts, GGUFFacts):
            return _unknown(facts.reason, header_bytes_fetched=fetched)
        entry = ModelEntry(model_id, paths[0], facts, None, tuple(paths), mmproj=mmproj)
        doc = explain(entry, inputs=inputs).public()
    fit = doc.get("fit")
    decision = doc["decision"]
    out: dict[str, Any] = {
        "verdict": fit["verdict"] if fit else None,
        "fits": fit["fits"] if fit else None,
        "summary": fit["summary"]
        if fit
        else (doc.get("fit_problem") or doc.get("problem") or "not estimated"),
        "problem": doc.get("problem") or (None if fit else doc.get("fit_problem")),
        "lane": decision.get("lane"),
        "reasons": decision.get("reasons", []),
        "rejections": decision.get("rejections", []),
        "header_bytes": sum(len(p.data) for _, p in headers),
        "header_bytes_fetched": fetched,
        "projector": projector.path if projector is not None else None,
        "facts": doc.get("facts"),
        "requested": doc.get("requested"),
    }
    if fit:
        chosen = fit.get("chosen") or {}
        best = max((p.get("max_ctx") or 0 for p in fit["placements"]), default=0)
        out.update(
            placement=chosen.get("name"),
            gpu_layers=chosen.get("gpu_layers"),
            ctx_size=chosen.get("ctx_size"),
            max_ctx=chosen.get("max_ctx") if chosen else (best or None),
            tokens_per_s=chosen.get("tokens_per_s"),
            tokens_per_s_range=chosen.get("tokens_per_s_range"),  # while nothing calibrates the figure
            advice=fit.get("advice", []),
            plan=fit,
        )
    return out


def fit_safetensors(
    detail: ModelDetail,
    *,
    reader: RangeReader,
    inputs: AdviceInputs,
) -> dict[str, Any] | None:
    """A size-based verdict from config.json and the shards' headers; None without safetensors files."""
    shards = sorted(f.path for f in detail.files if f.path.endswith(".safetensors") and "/" not in f.path)
    if not shards:
        return None
    repo, commit = detail.id, detail.commit
    try:
        raw = reader.optional_small_file(repo, commit, "config.json")
        if raw is None:
            return _unknown("the repository has no config.json, so its architecture is unknown")
        config = json.loads(raw)
        index_raw = reader.optional_small_file(repo, commit, "model.safetensors.index.json")
        if index_raw is not None:
            weight_map = json.loads(index_raw).get("weight_map") or {}
            shards = sorted(set(weight_map.values())) or shards
        elif len(shards) > 1 and "consolidated.safetensors" in shards:
            shards = [s for s in shards if s != "consolidated.safetensors"]
        headers = [reader.safetensors_header(repo, commit, s) for s in shards]
    except HubError as exc:
        return _unknown(exc.message)
    except (ValueError, AttributeError) as exc:
        return _unknown(f"config.json or the safetensors index is not valid JSON ({exc})")
    if not isinstance(config, dict):
        return _unknown("config.json is not a JSON object")
    model = model_from_metadata(config, headers, files=shards)
    if isinstance(model, SafetensorsProblem):
        return _unknown(model.reason)
    return _weights_verdict(model, detail=detail, inputs=inputs)


def _weights_verdict(
    model: SafetensorsModel,
    *,
    detail: ModelDetail,
    inputs: AdviceInputs,
) -> dict[str, Any]:
    settings, hardware = inputs.settings, inputs.hardware
    weights = model.weights.total_bytes if model.weights else None
    kind = ModelKind.MLX if model.mlx_evidence else ModelKind.SAFETENSORS
    fmt = ModelFormat(kind, Path(detail.id), facts=model)
    shares = _gpu_shares(model, hardware, settings=settings)

    def fit(lane: str) -> FitCheck | None:
        share = shares.get(lane)
        return FitCheck(share["fits"], share["summary"]) if share else None

    decision = route_decision(inputs, fmt, model_id=detail.id, fit=fit)
    gpus = [g for g in hardware.gpus if g.memory_total]
    gpu_free = max((g.memory_free or g.memory_total or 0 for g in gpus), default=0)
    ram = hardware.memory.available
    verdict: str | None
    if weights is None:
        verdict, summary = None, "the weights' size is unknown (no safetensors headers)"
    elif gpu_free and weights <= gpu_free:
        verdict, summary = (
            "gpu",
            f"the weights ({fmt_bytes(weights)}) fit in {fmt_bytes(gpu_free)} free on the largest GPU",
        )
    elif ram is not None and weights <= ram:
        verdict, summary = (
            "cpu",
            f"the weights ({fmt_bytes(weights)}) fit in {fmt_bytes(ram)} of available RAM, not on a GPU",
        )
    elif ram is None:
        verdict, summary = (
            None,
            f"the weights need {fmt_bytes(weights)}; this machine's free memory is unknown",
        )
    else:
        verdict, summary = (
            "too_large",
            f"does not fit: the weights alone need {fmt_bytes(weights)}, {fmt_bytes(ram)} RAM free",
        )
    note = "size of the weights only: KV cache and activations are not estimated for this format yet"
    return {
        "verdict": verdict,
        "fits": None if verdict is None else verdict != "too_large",
        "summary": summary,
        "note": note,
        "problem": None,
        "lane": decision.lane,
        "reasons": list(decision.reasons),
        "rejections": [r.public() for r in decision.rejections],
        "max_ctx": None,
        "max_ctx_reason": note,
        "parameters": model.weights.parameter_count if model.weights else None,
        "weights_bytes": weights,
        "dtypes": dict(model.weights.bytes_by_dtype) if model.weights else {},
        "architectures": list(model.config.architectures),
        "model_type": model.config.model_type,
        "gpu_shares": shares or None,
    }


def fit_detail(
    detail: ModelDetail,
    *,
    reader: RangeReader,
    inputs: AdviceInputs,
    only: str | None = None,
) -> ModelDetail:
    """Fill `detail.fit`: a verdict per quantization (or just `only`), and one for safetensors weights."""
    choices = [
        c for c in detail.gguf.choices if only is None or c.name.lower() == only.lower() or c.quant == only
    ]

    # the projector `switchyard pull REPO:QUANT` would fetch beside each quantization
    projector = pulled_projector(detail.gguf.projectors, detail.id)

    def one(c: QuantChoice) -> tuple[str, dict[str, Any]]:
        verdict = fit_choice(detail.id, detail.commit, c, reader=reader, inputs=inputs, projector=projector)
        return c.name, verdict

    with ThreadPoolExecutor(max_workers=PARALLEL_READS) as pool:
        by_quant = dict(pool.map(one, choices))
    safetensors = fit_safetensors(detail, reader=reader, inputs=inputs) if only is None else None
    detail.fit = {
        "hardware": _hw_summary(inputs.hardware),
        "quantizations": by_quant,
        "safetensors": safetensors,
    }
    if not by_quant and safetensors is None:
        detail.fit_problem = (
            f"no quantization named {only!r}"
            if only
            else "no GGUF or safetensors weights to estimate in this repository"
        )
    return detail
