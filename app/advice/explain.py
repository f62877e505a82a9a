"""`switchyard explain`: the routing decision and the memory plan for one model, as JSON and as text.

The CLI, `GET /api/models/{id}/explain` and the GUI all render this one `Explanation`; `.public()` is its
JSON, made only where it leaves the process (or reaches a view that renders JSON).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.advice.inputs import AdviceInputs, local_inputs, route_decision, with_overrides
from app.core.errors import ModelBrokenError, SettingsError
from app.core.paths import Paths
from app.core.public import Public
from app.core.settings import Settings
from app.core.units import fmt_bytes
from app.fit.gpu_share import GPUShareRefused, plan_gpu_share
from app.fit.plan import (
    CPU,
    GPU,
    FitReport,
    Placement,
    calibrated,
    device_bandwidths,
    rate,
    speed_words,
)
from app.formats.detect import ModelKind
from app.formats.gguf_meta import GGUFFacts, GGUFProblem, read_gguf
from app.formats.safetensors_meta import SafetensorsModel
from app.hardware.model import Hardware
from app.lanes.engines.cuda import SHARE_ENGINES
from app.lanes.engines.llamacpp.compat import gguf_architecture, survey
from app.lanes.engines.llamacpp.kind import fit_for, requested_ctx
from app.lanes.engines.llamacpp.spec import speculation_for
from app.lanes.engines.registry import calibrating_lanes, kind_of
from app.lanes.install.installed import installed_lanes
from app.library.catalog import ModelEntry
from app.library.drafts import choose_draft
from app.library.footprints import LibraryFootprints
from app.library.opening import open_catalog
from app.library.speeds import Speed, SpeedStore
from app.routing import Decision, FitCheck, check_pin


def _fit_check(report: FitReport, settings: Settings) -> FitCheck:
    if not report.fits and not (settings.memory.enforce_fit and settings.memory.plan_memory):
        return FitCheck(
            True,
            f"by the estimate it {report.summary}, but the server does not enforce the estimate "
            "(enforce_fit or plan_memory is off): the engine will try",
        )
    return FitCheck(report.fits, report.summary)


def _sizes_own_gguf_cache(lane: str | None) -> bool:
    """A kind that reads GGUF files and sizes its own cache (mistral.rs): nothing is predicted for it."""
    kind = kind_of(lane) if lane else None
    return kind is not None and kind.memory == "runtime-managed" and "gguf" in kind.formats


def _lane_fit(lane: str, report: FitReport, settings: Settings) -> FitCheck | None:
    """A GGUF's fit on `lane`: the memory plan on a kind that plans (both llama.cpp builds plan alike),
    the same file's "does not fit" on one that sizes its own cache, else nothing."""
    kind = kind_of(lane)
    if kind is not None and kind.memory == "planned":
        return _fit_check(report, settings)
    return _same_file_check(lane, report, settings)


def _same_file_check(lane: str, report: FitReport, settings: Settings) -> FitCheck | None:
    """mistral.rs reads the same GGUF and sizes its own cache, so nothing is predicted for it; it only shares
    llama.cpp's "does not fit" (the same weights, at the context asked for). Routing then does not offer
    it as the way out of a refusal the server itself never routes around."""
    if not _sizes_own_gguf_cache(lane):
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
class Requested(Public):
    """What the model would be started with: its context (0 with ctx_auto: planned), slots and KV type."""

    ctx_size: int
    ctx_auto: bool
    parallel: int
    kv_type: str


# a load with some layers on the GPU and the rest on the CPU: its answers are filed apart from the
# devices' own, since its speed is neither's (calibrate learns no factor from it: it has no bandwidth)
SPLIT = "GPU+CPU"


def speed_device(p: Placement) -> str:
    """The device a load on placement `p` files its measured speeds under: "CPU" with nothing offloaded,
    "GPU" with every layer and the output layer offloaded, SPLIT for anything between."""
    parts = set(p.read_bytes)
    if parts:  # where each token's reads happen: the placement's own split of its layers
        return SPLIT if parts == {CPU, GPU} else GPU if parts == {GPU} else CPU
    return CPU if p.gpu_layers <= 0 else GPU if p.name == "gpu" else SPLIT  # made without `read_bytes`


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
    # speculative decoding: its setting and, for a draft model, the pairing (which, why, or why none)
    speculation: dict[str, Any] | None = None
    # measured tokens/s of this model, per lane and device, the most recent first (app/library/speeds.py)
    speeds: tuple[Speed, ...] = ()
    calibration: dict[str, Any] | None = None  # the calibration applied to the plan's speeds, per device

    @property
    def measured(self) -> Speed | None:
        """The measurement that matches the plan's placement (else the most recent one)."""
        chosen = self.fit.chosen if self.fit else None
        device = None if chosen is None else speed_device(chosen)  # named as app/runtime.py files it
        return next((s for s in self.speeds if s.device == device), self.speeds[0] if self.speeds else None)

    @property
    def lane(self) -> str | None:
        return self.decision.lane

    def public(self) -> dict[str, Any]:
        m = self.measured
        fit = self.fit.public() if self.fit else None
        if fit and fit["chosen"] and m is not None:  # only where measured: a hub plan stays the fit's own
            fit["chosen"]["measured_tokens_per_s"] = m.gen_tps
        if fit and self.fit:
            _with_measured(fit, self.fit, self.speeds)
        return {
            "model": self.model,
            "path": str(self.path),
            "format": self.format.value,
            "problem": self.problem,
            "decision": self.decision.public(),
            "decision_text": self.decision.render_text(),
            "fit": fit,
            "fit_problem": self.fit_problem,
            "gpu_shares": self.gpu_shares,
            "requested": self.requested.public(),
            "facts": self.facts.public() if self.facts else None,
            "hardware": _hw_summary(self.hardware),
            "loaded": self.loaded,
            "last_measured": self.last_measured,
            "speculation": self.speculation,
            "tokens_per_s": self.fit.chosen.tokens_per_s if self.fit and self.fit.chosen else None,
            "tokens_per_s_range": _range(self.fit),
            "calibrated": bool(self.fit and self.fit.chosen and self.fit.chosen.calibrated),
            "measured_tokens_per_s": m.gen_tps if m else None,
            "measured_prompt_tokens_per_s": m.prompt_tps if m else None,
            "measured_speeds": [s.public() for s in self.speeds],
            "speed_calibration": self.calibration,
        }


def _with_measured(fit: dict[str, Any], report: FitReport, speeds: Sequence[Speed]) -> None:
    """Each placement this model was measured on carries its measurement, and a summary that would call
    the speed "not measured yet" says the measured figure instead (the speed model stays uncalibrated
    until a model large enough to teach it has run; this model's own answers are still measured)."""
    by_device: dict[str, Speed] = {}
    for s in speeds:  # the most recent first
        by_device.setdefault(s.device, s)
    for doc, p in zip(fit["placements"], report.placements, strict=True):
        got = by_device.get(speed_device(p))
        if got is not None:
            doc["measured_tokens_per_s"] = got.gen_tps
    chosen = report.chosen
    got = by_device.get(speed_device(chosen)) if chosen else None
    words = speed_words(chosen) if chosen and not chosen.tokens_per_s else ""
    if got is not None and words and fit["summary"].endswith(words):
        fit["summary"] = fit["summary"][: -len(words)] + f", measured {rate(got.gen_tps)} tokens/s here"


def _range(fit: FitReport | None) -> list[float] | None:
    band = fit.chosen.tokens_per_s_range if fit and fit.chosen else None
    return list(band) if band else None


def explain(
    entry: ModelEntry,
    *,
    inputs: AdviceInputs,
    lane: dict[str, Any] | None = None,
    recorded: dict[str, Any] | None = None,
    library: Sequence[ModelEntry] = (),
    speeds: Sequence[Speed] = (),
) -> Explanation:
    """`lane`: the loaded lane's snapshot; `recorded`: the last load's predicted and measured memory;
    `library`: the models a draft model is chosen from (speculative type "draft"); `speeds`: this model's
    measured tokens/s. The plan's speeds are calibrated by `inputs.speed` per device: a placement gets a
    calibrated figure when every device it reads on (CPU, GPU) has a calibration (plan.calibrated)."""
    settings, hardware = inputs.settings, inputs.hardware
    fmt = entry.model_format()
    entry, speculation = speculation_view(entry, settings, library)
    report: FitReport | None = None
    fit_problem: str | None = None
    if fmt.kind is ModelKind.GGUF and entry.ok:
        r = fit_for(entry, settings, hardware=hardware, used=dict(inputs.used))
        if isinstance(r, GGUFProblem):
            fit_problem = r.reason
        else:
            report = calibrated(r, inputs.speed)
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
        return _lane_fit(lane_name, report, settings)

    if (arch := gguf_architecture(entry)) is not None:
        survey(settings, [arch], hardware=hardware)  # with a capability build: both builds asked once
    decision = route_decision(inputs, fmt, model_id=entry.id, fit=fit)
    try:
        ctx, auto = requested_ctx(entry, settings) if entry.ok and entry.facts else (0, True)
    except ModelBrokenError:  # a corrupt header's window: the fit above says why
        ctx, auto = 0, True
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
            parallel=settings.override(entry.id, "parallel", settings.models.parallel),
            kv_type=settings.override(entry.id, "kv_type", settings.models.kv_type),
        ),
        facts=entry.facts if isinstance(entry.facts, GGUFFacts) else None,
        hardware=hardware,
        loaded=lane,
        last_measured=recorded,
        speculation=speculation,
        speeds=tuple(speeds),
        calibration=_calibration_view(inputs),
    )


def _calibration_view(inputs: AdviceInputs) -> dict[str, Any] | None:
    """Every calibrated device under `devices` (the CPU first); the CPU's figures, else the first
    device's, also at the top level, where a view of one device has always had them. None: nothing."""
    order = sorted(inputs.speed.items(), key=lambda dc: (dc[0] != CPU, dc[0] != GPU, dc[0]))
    devices = [
        {
            "device": d,
            "efficiency": round(cal.efficiency, 3),
            "per_token_s": cal.per_token_s,
            "models": cal.models,
            "bandwidth": cal.bandwidth,  # bytes/s on the copy scale (reads plus writes), as calibrated
        }
        for d, cal in order
    ]
    if not devices:
        return None
    return {**devices[0], "devices": devices}


def speculation_view(
    entry: ModelEntry, settings: Settings, library: Sequence[ModelEntry]
) -> tuple[ModelEntry, dict[str, Any] | None]:
    """The entry with its draft paired (so the plan counts the draft's memory) and what explain shows."""
    if entry.format != "gguf" or not entry.ok:
        return entry, None
    try:
        spec = speculation_for(entry.id, settings)
    except SettingsError as exc:
        return entry, {"type": None, "problem": exc.message}
    if not spec.on:
        return entry, None
    view: dict[str, Any] = {"type": spec.type}
    if spec.type == "draft":
        pairing = choose_draft(entry, library, named=spec.draft)
        view["pairing"] = pairing.public()
        if pairing.draft is not None:
            entry = dataclasses.replace(entry, draft=pairing.draft.path)
    return entry, view


def explain_local(
    model: str, *, settings: Settings, paths: Paths, overrides: Mapping[str, Any] | None = None
) -> Explanation:
    """`switchyard explain` with no server: `model` is a catalog id or a path to a model file; `overrides`
    win over the model's model_overrides entry."""
    settings = with_overrides(settings, model, overrides)
    target = Path(model).expanduser()
    library, catalog = open_catalog(settings, paths)  # measured footprints live in library.db
    inputs = local_inputs(settings, paths)
    try:
        entry = entry_for_path(target.resolve()) if target.exists() else catalog.get(model, allow_broken=True)
        recorded = LibraryFootprints(library).get(entry.id, path=entry.path)
        models = catalog.servable()  # where a draft model is chosen from
        store = SpeedStore(library, calibrating=calibrating_lanes())
        bws = device_bandwidths(inputs.hardware)
        inputs = dataclasses.replace(inputs, speed=store.calibration(bandwidth=bws))
        speeds = store.of(entry.id)
    finally:
        library.close()
    return explain(entry, inputs=inputs, recorded=recorded, library=models, speeds=speeds)


def _gpu_shares(model: SafetensorsModel, hw: Hardware, *, settings: Settings) -> dict[str, dict[str, Any]]:
    """What vLLM and SGLang would ask of the largest NVIDIA card, at the model's window (capped at 32k)."""
    cards = [g for g in hw.gpus if g.vendor == "nvidia" and g.memory_total]
    if not cards:
        return {}
    gpu = max(cards, key=lambda g: g.memory_total or 0)
    length = min(model.config.max_position_embeddings or 8192, 32768)
    if settings.models.ctx_size:
        length = settings.models.ctx_size
    out: dict[str, dict[str, Any]] = {}
    for rule in SHARE_ENGINES:
        engine = rule.name
        try:
            share = plan_gpu_share(model, gpu, engine=rule, max_model_len=length, name=gpu.name)
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
            {
                "name": g.name,
                "vendor": g.vendor,
                "memory_total": g.memory_total,
                "memory_free": g.memory_free,
                "memory_bandwidth": g.memory_bandwidth,
            }
            for g in hw.gpus
        ],
        "bandwidth_all_cores": hw.bandwidth.all_cores if hw.bandwidth else None,
    }


def _split_lines(doc: dict[str, Any]) -> list[str]:
    """A split plan (explain --across, or offered when the model fits no single machine): per machine."""
    asked = doc.get("split")
    split = asked or doc.get("split_offer")
    if not isinstance(split, dict):
        return []
    across = ", ".join(split.get("across") or [])
    if split.get("refused"):
        return [f"split across {across}: {split['refused']}", ""]
    head = (
        "split across this machine and"
        if asked
        else "fits no single machine; a split across this machine and"
    )
    out = [f"{head} {across}: {'fits' if split.get('fits') else 'does not fit'}; {split.get('reason', '')}"]
    for share in split.get("machines") or []:
        where = share.get("machine") or "this machine"
        out.append(
            f"  {where:<16} {share['layers']:>3} layers: weights {fmt_bytes(share['weights'])}, KV "
            f"{fmt_bytes(share['kv_cache'])}, compute {fmt_bytes(share['compute'])}"
        )
    if split.get("engine_args"):
        out.append(f"  llama-server {' '.join(split['engine_args'])} --rpc <one tunnel per peer>")
    if split.get("speed_note"):
        out.append(f"  speed: {split['speed_note']}")
    return [*out, ""]


def _multinode_lines(doc: dict[str, Any]) -> list[str]:
    """A multi-node vLLM/SGLang plan (explain --across on a safetensors model): per machine, and each
    peer's own check of its part."""
    plan = doc.get("multinode")
    if not isinstance(plan, dict):
        return []
    across = ", ".join(plan.get("across") or [])
    if plan.get("refused"):
        return [f"{plan.get('engine')} across this machine and {across}: {plan['refused']}", ""]
    out = [
        f"{plan['engine']} across this machine and {across}: tensor parallel {plan['tensor_parallel']} x "
        f"pipeline parallel {plan['pipeline_parallel']}, layers {plan['layer_partition']}, context "
        f"{plan['max_model_len']}, rendezvous {plan['master']}"
    ]
    for node in plan.get("nodes") or []:
        gpus = ",".join(map(str, node["gpus"]))
        out.append(
            f"  rank {node['rank']} {node['node']:<14} GPU {gpus}: {fmt_bytes(node['card_bytes'])} per card "
            f"(memory flag {node['fraction']}), layers {node['layers'][0]}-{node['layers'][1] - 1}"
        )
    for part in plan.get("peers") or []:
        said = part.get("refused") or f"would start {' '.join(part.get('argv') or [])}"
        out.append(f"  {part.get('peer')}: {said}")
    return [*out, *(f"  note: {n}" for n in plan.get("notes") or []), ""]


def render(doc: dict[str, Any]) -> str:
    """The explanation as terminal text: decision, memory per device, placements, advice, measured."""
    out = [doc["decision_text"].rstrip(), "", *_split_lines(doc), *_multinode_lines(doc)]
    fit = doc.get("fit")
    for engine, share in (doc.get("gpu_shares") or {}).items():
        out.append(f"memory on {engine}: {share['summary']}")
    if fit is None:
        if not doc.get("gpu_shares"):
            out.append(f"memory: {doc.get('fit_problem') or 'not estimated'}")
        return "\n".join(out)
    req = doc["requested"]
    if _sizes_own_gguf_cache((doc.get("decision") or {}).get("lane")):
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
        out.extend(_device_table(chosen["devices"]))
    out.append("placements:")
    for p in fit["placements"]:
        mark = "fits" if p["fits"] else "does not fit"
        speed = _speed_text(p)
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
    out.extend(_measured_lines(doc))
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


# the memory table's columns: (key, heading, width); the vision projector's two only for a model with one
_COLUMNS = (
    ("weights", "weights", 12),
    ("kv_cache", "KV cache", 12),
    ("compute", "compute", 12),
    ("projector", "projector", 12),
    ("projector_compute", "proj. compute", 15),
    ("overhead", "overhead", 12),
    ("prompt_cache", "prompt cache", 14),
    ("total", "total", 12),
)
_PROJECTOR_KEYS = ("projector", "projector_compute")


def _device_table(devices: list[dict[str, Any]]) -> list[str]:
    """The chosen placement's memory per device and component: the vision projector's weights and its
    encoder's compute buffer get columns of their own (on the device the launch puts them)."""
    vision = any(d.get(k) for d in devices for k in _PROJECTOR_KEYS)
    cols = [c for c in _COLUMNS if vision or c[0] not in _PROJECTOR_KEYS]
    lines = [f"  {'device':<8}" + "".join(f"{head:>{w}}" for _k, head, w in cols)]
    for d in devices:
        lines.append(f"  {d['device']:<8}" + "".join(f"{fmt_bytes(d.get(k) or 0):>{w}}" for k, _h, w in cols))
    return lines


def _speed_text(p: dict[str, Any]) -> str:
    measured = p.get("measured_tokens_per_s")
    if p.get("tokens_per_s"):  # the measured figure is on its own line below (_measured_lines)
        return f", ~{rate(p['tokens_per_s'])} tok/s ({'calibrated' if p.get('calibrated') else 'estimated'})"
    if measured:  # this model ran here, though nothing calibrates the speed model yet
        return f", measured {rate(measured)} tok/s here"
    band = p.get("tokens_per_s_range")
    if band:
        return f", {rate(band[0])}-{rate(band[1])} tok/s (a range: nothing measured here yet)"
    return f" ({p['speed_note']})"


def _measured_lines(doc: dict[str, Any]) -> list[str]:
    """Speed, predicted beside measured (llama.cpp's own timings), and the calibration behind it."""
    out: list[str] = []
    for s in doc.get("measured_speeds") or []:
        prompt = f", prompt {rate(s['prompt_tokens_per_s'])} tok/s" if s.get("prompt_tokens_per_s") else ""
        which = (
            "the first answer after a load (weights still being read in; the next answers replace it)"
            if s.get("first_answer_only")
            else f"median of the last answers ({s['samples']} recorded"
        )
        out.append(
            f"measured on {s['lane']} ({s['device']}): {rate(s['tokens_per_s'])} tok/s generating{prompt}, "
            f"{which}, last {time.ctime(s['at'])}" + ("" if s.get("first_answer_only") else ")")
        )
    cal = doc.get("speed_calibration") or {}
    for c in cal.get("devices") or ([cal] if cal else []):  # a server from before `devices`: its one
        # the bound reads at half the figure kept (it is on the copy scale: reads plus writes)
        reads = f" (reads at {c['bandwidth'] / 2e9:.0f} GB/s)" if c.get("bandwidth") else ""
        out.append(
            f"speed calibration ({c['device']}): {c['efficiency']:.2f} of the memory-bandwidth bound"
            f"{reads}, from {c['models']} measured model(s)"
        )
    return out


def pin_refusal(entry: ModelEntry, lane: str, *, settings: Settings, hardware: Hardware) -> str | None:
    """Why `lane` cannot run `entry` on `hardware` (None: the pin is fine)."""
    fmt = entry.model_format()
    report = fit_for(entry, settings, hardware=hardware) if entry.ok and fmt.kind is ModelKind.GGUF else None

    def fit(lane_name: str) -> FitCheck | None:
        if not isinstance(report, FitReport):
            return None
        return _lane_fit(lane_name, report, settings)

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
