"""`switchyard explain`: the routing decision and the memory plan for one model, as JSON and as text.

The CLI, `GET /api/models/{id}/explain` and (later) the GUI all render this one object.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from app.core.settings import Settings
from app.fit.gpu_share import GPUShareRefused, plan_gpu_share
from app.fit.memory import MIB
from app.fit.plan import FitReport, rate
from app.formats.detect import ModelKind, detect_format
from app.formats.gguf_meta import GGUFFacts, GGUFProblem, read_gguf
from app.formats.safetensors_meta import SafetensorsModel
from app.hardware.model import Hardware
from app.lanes.installed import installed_lanes
from app.lanes.llamacpp import fit_for, requested_ctx
from app.library.catalog import ModelEntry
from app.routing import FitCheck, decide


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


def explain(
    entry: ModelEntry,
    *,
    settings: Settings,
    hardware: Hardware,
    pins: dict[str, str],
    used: dict[str, int] | None = None,
    lane: dict[str, Any] | None = None,
    recorded: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`lane`: the loaded lane's snapshot; `recorded`: the last load's predicted and measured memory."""
    fmt = detect_format(entry.path)
    report: FitReport | None = None
    fit_problem: str | None = None
    if fmt.kind is ModelKind.GGUF and entry.ok:
        r = fit_for(entry, settings, hardware=hardware, used=used)
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
        fmt, hardware=hardware, installed=installed_lanes(settings), pins=pins, model_id=entry.id, fit=fit
    )
    ctx, auto = requested_ctx(entry, settings) if entry.ok and entry.facts else (0, True)
    return {
        "model": entry.id,
        "path": str(entry.path),
        "format": fmt.kind.value,
        "problem": entry.problem or fmt.problem,
        "decision": decision.public(),
        "decision_text": decision.render_text(),
        "fit": report.public() if report else None,
        "fit_problem": fit_problem,
        "gpu_shares": shares or None,
        "requested": {
            "ctx_size": ctx,
            "ctx_auto": auto,
            "parallel": settings.override(entry.id, "parallel", settings.parallel),
            "kv_type": settings.override(entry.id, "kv_type", settings.kv_type),
        },
        "facts": entry.facts.public() if isinstance(entry.facts, GGUFFacts) else None,
        "hardware": _hw_summary(hardware),
        "loaded": lane,
        "last_measured": recorded,
    }


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


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / MIB:.1f} MiB"


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
                f"  {d['device']:<8}{_size(d['weights']):>12}{_size(d['kv_cache']):>12}"
                f"{_size(d['compute']):>12}{_size(d['overhead']):>12}{_size(d['prompt_cache']):>14}"
                f"{_size(d['total']):>12}"
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
            out.append(f"           short by {_size(short)} on {dev}")
    for a in fit["advice"]:
        out.append(f"  to make it fit: {a}")
    free = ", ".join(f"{k} {_size(v)}" for k, v in fit["budget"].items())
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
            parts = [f"{c} {_size(p.get(c))} / {_size(v)}" for c, v in comps.items() if c != "output"]
            out.append(f"    {dev}: " + ", ".join(parts))
    if m.get("rss_bytes"):
        out.append(f"    engine process RSS {_size(m.get('rss_bytes'))}")
    return "\n".join(out)


def explain_pin(model_id: str, lane: str, *, settings: Settings, paths: Any) -> str | None:
    """Why `lane` cannot run `model_id` here (None: the pin is fine)."""
    from app.cli_library import open_catalog
    from app.hardware.probe import probe
    from app.routing import check_pin

    library, catalog = open_catalog(settings, paths)
    try:
        entry = catalog.get(model_id, allow_broken=True)
    finally:
        library.close()
    fmt = detect_format(entry.path)
    hw = probe(engine=False)
    report = fit_for(entry, settings, hardware=hw) if entry.ok and fmt.kind is ModelKind.GGUF else None

    def fit(lane_name: str) -> FitCheck | None:
        if not isinstance(report, FitReport):
            return None
        if lane_name == "llama.cpp":
            return _fit_check(report, settings)
        return _same_file_check(lane_name, report, settings)

    return check_pin(fmt, lane, hardware=hw, installed=installed_lanes(settings), fit=fit)
