"""`switchyard explain`: the routing decision and the memory plan for one model, as JSON and as text.

The CLI, `GET /api/models/{id}/explain` and the GUI all render this one `Explanation`; `.public()` is its
JSON, made only where it leaves the process (or reaches a view that renders JSON).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.advice.inputs import AdviceInputs, local_inputs, with_overrides
from app.core.paths import Paths
from app.core.settings import Settings
from app.core.units import fmt_bytes
from app.fit.gpu_share import GPUShareRefused, plan_gpu_share
from app.fit.plan import FitReport, rate
from app.formats.detect import ModelKind
from app.formats.gguf_meta import GGUFFacts, GGUFProblem, read_gguf
from app.formats.safetensors_meta import SafetensorsModel
from app.hardware.model import Hardware
from app.lanes.installed import installed_lanes
from app.lanes.llamacpp import fit_for, requested_ctx
from app.library.catalog import ModelEntry
from app.library.footprints import LibraryFootprints
from app.library.opening import open_catalog
from app.routing import Decision, FitCheck, check_pin, decide


def _fit_check(report: FitReport, settings: Settings) -> FitCheck:
    if not report.fits and not (settings.enforce_fit and settings.plan_memory):
        return FitCheck(
            True,
            f"by the estimate it {report.summary}, but the server does not enforce the estimate "
            "(enforce_fit or plan_memory is off): the engine will try",
        )
    return FitCheck(report.fits, report.summary)


def _same_file_check(lane: str, report: FitReport, settings: Settings) -> FitCheck | None:
    """mistral.rs reads the same GGUF and sizes its own cache, so nothing is predicted for it; it only shares
    llama.cpp's "does not fit" (the same weights, at the context asked for). Routing then does not offer
    it as the way out of a refusal the server itself never routes around."""
    if lane != "mistral.rs":
        return None
    check = _fit_check(report, settings)
    if check.fits:
        return None
    return FitCheck(False, f"the same file at the same context as on llama.cpp: {check.summary}")


def entry_for_path(path: Path) -> ModelEntry:
    facts = read_gguf(path)
    if isinstance(facts, GGUFProblem):
        return ModelEntry(path.stem, path, None, facts.reason)
    return ModelEntry(path.stem, path, facts, None, (path,))


@dataclass(frozen=True)
class Requested:
    """What the model would be started with: its context (0 with ctx_auto: planned), slots and KV type."""

    ctx_size: int
    ctx_auto: bool
    parallel: int
    kv_type: str

    def public(self) -> dict[str, Any]:
        return {
            "ctx_size": self.ctx_size,
            "ctx_auto": self.ctx_auto,
            "parallel": self.parallel,
            "kv_type": self.kv_type,
        }


@dataclass(frozen=True)
class Explanation:
    """One model's routing decision and memory plan. `fit` None: no plan (`fit_problem` says why), or a
    format planned per engine (`gpu_shares`); `loaded` / `last_measured`: the lane now and the last load."""

    model: str
    path: Path
    format: ModelKind
    problem: str | None
    decision: Decision
    fit: FitReport | None
    fit_problem: str | None
    gpu_shares: dict[str, dict[str, Any]] | None
    requested: Requested
    facts: GGUFFacts | None
    hardware: Hardware
    loaded: dict[str, Any] | None = None
    last_measured: dict[str, Any] | None = None

    @property
    def lane(self) -> str | None:
        return self.decision.lane

    def public(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "path": str(self.path),
            "format": self.format.value,
            "problem": self.problem,
            "decision": self.decision.public(),
            "decision_text": self.decision.render_text(),
            "fit": self.fit.public() if self.fit else None,
            "fit_problem": self.fit_problem,
            "gpu_shares": self.gpu_shares,
            "requested": self.requested.public(),
            "facts": self.facts.public() if self.facts else None,
            "hardware": _hw_summary(self.hardware),
            "loaded": self.loaded,
            "last_measured": self.last_measured,
        }


def explain(
    entry: ModelEntry,
    *,
    inputs: AdviceInputs,
    lane: dict[str, Any] | None = None,
    recorded: dict[str, Any] | None = None,
) -> Explanation:
    """`lane`: the loaded lane's snapshot; `recorded`: the last load's predicted and measured memory."""
    settings, hardware = inputs.settings, inputs.hardware
    fmt = entry.model_format()
    report: FitReport | None = None
    fit_problem: str | None = None
    if fmt.kind is ModelKind.GGUF and entry.ok:
        r = fit_for(entry, settings, hardware=hardware, used=dict(inputs.used))
        if isinstance(r, GGUFProblem):
            fit_problem = r.reason
        else:
            report = r
    shares: dict[str, dict[str, Any]] = {}
    if fmt.kind is ModelKind.SAFETENSORS and isinstance(fmt.facts, SafetensorsModel):
        shares = _gpu_shares(fmt.facts, hardware, settings=settings)
        if not shares:
            fit_problem = "vLLM and SGLang plan memory on an NVIDIA GPU; none was found"
    elif fmt.kind is not ModelKind.GGUF:
        fit_problem = f"no memory model for {fmt.kind.value} models yet"

    def fit(lane_name: str) -> FitCheck | None:
        if lane_name in shares:
            share = shares[lane_name]
            return FitCheck(share["fits"], share["summary"])
        if report is None:
            return None
        if lane_name == "llama.cpp":
            return _fit_check(report, settings)
        return _same_file_check(lane_name, report, settings)

    decision = decide(
        fmt,
        hardware=hardware,
        installed=installed_lanes(settings),
        pins=dict(inputs.pins),
        model_id=entry.id,
        fit=fit,
    )
    ctx, auto = requested_ctx(entry, settings) if entry.ok and entry.facts else (0, True)
    return Explanation(
        model=entry.id,
        path=entry.path,
        format=fmt.kind,
        problem=entry.problem or fmt.problem,
        decision=decision,
        fit=report,
        fit_problem=fit_problem,
        gpu_shares=shares or None,
        requested=Requested(
            ctx_size=ctx,
            ctx_auto=auto,
            parallel=settings.override(entry.id, "parallel", settings.parallel),
            kv_type=settings.override(entry.id, "kv_type", settings.kv_type),
        ),
        facts=entry.facts if isinstance(entry.facts, GGUFFacts) else None,
        hardware=hardware,
        loaded=lane,
        last_measured=recorded,
    )


def explain_local(
    model: str, *, settings: Settings, paths: Paths, overrides: Mapping[str, Any] | None = None
) -> Explanation:
    """`switchyard explain` with no server: `model` is a catalog id or a path to a model file; `overrides`
    win over the model's model_overrides entry."""
    settings = with_overrides(settings, model, overrides)
    target = Path(model).expanduser()
    library, catalog = open_catalog(settings, paths)  # measured footprints live in library.db
    try:
        entry = entry_for_path(target.resolve()) if target.exists() else catalog.get(model, allow_broken=True)
        recorded = LibraryFootprints(library).get(entry.id, path=entry.path)
    finally:
        library.close()
    return explain(entry, inputs=local_inputs(settings, paths), recorded=recorded)


def _gpu_shares(model: SafetensorsModel, hw: Hardware, *, settings: Settings) -> dict[str, dict[str, Any]]:
    """What vLLM and SGLang would ask of the largest NVIDIA card, at the model's window (capped at 32k)."""
    cards = [g for g in hw.gpus if g.vendor == "nvidia" and g.memory_total]
    if not cards:
        return {}
    gpu = max(cards, key=lambda g: g.memory_total or 0)
    length = min(model.config.max_position_embeddings or 8192, 32768)
    if settings.ctx_size:
        length = settings.ctx_size
    out: dict[str, dict[str, Any]] = {}
    for engine in ("vllm", "sglang"):
        try:
            share = plan_gpu_share(model, gpu, engine=engine, max_model_len=length, name=gpu.name)
        except GPUShareRefused as exc:
            out[engine] = {"fits": False, "summary": exc.message, "share": None}
            continue
        summary = (
            f"asks for {share.fraction:.2f} of {gpu.name} ({engine} flag), "
            f"{share.concurrent_requests} full {length}-token request(s) at once"
        )
        out[engine] = {"fits": True, "summary": summary, "share": share.public()}
    return out


def _hw_summary(hw: Hardware) -> dict[str, Any]:
    return {
        "cpu": hw.cpu.model_name,
        "usable_cores": hw.cpu.usable_cores,
        "ram_total": hw.memory.total,
        "ram_available": hw.memory.available,
        "gpus": [
            {"name": g.name, "vendor": g.vendor, "memory_total": g.memory_total, "memory_free": g.memory_free}
            for g in hw.gpus
        ],
        "bandwidth_all_cores": hw.bandwidth.all_cores if hw.bandwidth else None,
    }


def render(doc: dict[str, Any]) -> str:
    """The explanation as terminal text: decision, memory per device, placements, advice, measured."""
    out = [doc["decision_text"].rstrip(), ""]
    fit = doc.get("fit")
    for engine, share in (doc.get("gpu_shares") or {}).items():
        out.append(f"memory on {engine}: {share['summary']}")
    if fit is None:
        if not doc.get("gpu_shares"):
            out.append(f"memory: {doc.get('fit_problem') or 'not estimated'}")
        return "\n".join(out)
    req = doc["requested"]
    if (doc.get("decision") or {}).get("lane") == "mistral.rs":
        # runtime-managed: mistral.rs sizes its own cache; llama.cpp's plan is shown only to compare with
        out.append("memory: mistral.rs sizes its own KV cache; only what it holds once loaded is measured.")
        out.append(f"llama.cpp's plan for the same file: {fit['summary']}")
    else:
        out.append(f"memory: {fit['summary']}")
    out.append(
        f"  asked for: context {req['ctx_size']}{' (automatic)' if req['ctx_auto'] else ''}, "
        f"{req['parallel']} slot(s), KV cache {req['kv_type']}"
    )
    chosen = fit.get("chosen")
    if chosen:
        out.append(
            f"  {'device':<8}{'weights':>12}{'KV cache':>12}{'compute':>12}{'overhead':>12}"
            f"{'prompt cache':>14}{'total':>12}"
        )
        for d in chosen["devices"]:
            out.append(
                f"  {d['device']:<8}{fmt_bytes(d['weights']):>12}{fmt_bytes(d['kv_cache']):>12}"
                f"{fmt_bytes(d['compute']):>12}{fmt_bytes(d['overhead']):>12}{fmt_bytes(d['prompt_cache']):>14}"
                f"{fmt_bytes(d['total']):>12}"
            )
    out.append("placements:")
    for p in fit["placements"]:
        mark = "fits" if p["fits"] else "does not fit"
        speed = f", ~{rate(p['tokens_per_s'])} tok/s" if p["tokens_per_s"] else f" ({p['speed_note']})"
        out.append(
            f"  {p['name']:<8} {p['gpu_layers']:>3} GPU layers: {mark}; largest context {p['max_ctx'] or '-'}"
            f"{speed}"
        )
        for dev, short in p["short_by"].items():
            out.append(f"           short by {fmt_bytes(short)} on {dev}")
    for a in fit["advice"]:
        out.append(f"  to make it fit: {a}")
    free = ", ".join(f"{k} {fmt_bytes(v)}" for k, v in fit["budget"].items())
    out.append(f"free for this model: {free}")
    loaded = doc.get("loaded")
    heading = "loaded now:"
    if not (loaded and loaded.get("measured")) and doc.get("last_measured"):
        loaded = doc["last_measured"]
        ctx = loaded["params"].get("ctx_size")  # llama.cpp's; other engines keep their own context
        heading = f"last load ({time.ctime(loaded['at'])}){f' with context {ctx}' if ctx else ''}:"
    m = (loaded or {}).get("measured") or {}
    if m.get("devices") or m.get("rss_bytes"):  # engines other than llama.cpp log no buffers to compare
        out.append(heading)
    if m.get("devices"):
        out.append("  predicted / measured (llama.cpp's own buffers):")
        pdev = {d["device"]: d for d in ((loaded or {}).get("predicted") or {}).get("devices", [])}
        for dev, comps in m["devices"].items():
            p = pdev.get(dev, {})
            parts = [f"{c} {fmt_bytes(p.get(c))} / {fmt_bytes(v)}" for c, v in comps.items() if c != "output"]
            out.append(f"    {dev}: " + ", ".join(parts))
    if m.get("rss_bytes"):
        out.append(f"    engine process RSS {fmt_bytes(m.get('rss_bytes'))}")
    return "\n".join(out)


def pin_refusal(entry: ModelEntry, lane: str, *, settings: Settings, hardware: Hardware) -> str | None:
    """Why `lane` cannot run `entry` on `hardware` (None: the pin is fine)."""
    fmt = entry.model_format()
    report = fit_for(entry, settings, hardware=hardware) if entry.ok and fmt.kind is ModelKind.GGUF else None

    def fit(lane_name: str) -> FitCheck | None:
        if not isinstance(report, FitReport):
            return None
        if lane_name == "llama.cpp":
            return _fit_check(report, settings)
        return _same_file_check(lane_name, report, settings)

    return check_pin(fmt, lane, hardware=hardware, installed=installed_lanes(settings), fit=fit)


def explain_pin(model_id: str, lane: str, *, settings: Settings, paths: Paths) -> str | None:
    """`switchyard pin` with no server: why `lane` cannot run `model_id` here (None: the pin is fine)."""
    from app.hardware.probe import probe

    library, catalog = open_catalog(settings, paths)
    try:
        entry = catalog.get(model_id, allow_broken=True)
    finally:
        library.close()
    return pin_refusal(entry, lane, settings=settings, hardware=probe(engine=False))
