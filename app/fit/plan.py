"""Placements of a GGUF model on this machine: all on the GPU, N layers on the GPU, CPU only.

For each: the memory per device, whether it fits at the requested context, the largest context
that fits beside what is already loaded, and a speed estimate from memory bandwidth (bytes read
per generated token). The verdict says which one runs, or what would make the model fit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from app.core.units import fmt_bytes
from app.fit.memory import CTX_PAD, KV_TYPE_BYTES, MIB, DeviceUse, FitParams, breakdown, kv_bytes_per_cell
from app.formats.gguf_layout import GGUFLayout
from app.hardware.model import GPUInfo, Hardware

GIB = 1 << 30
AUTO_RESERVE_FRACTION = 0.15
AUTO_RESERVE_MIN = 2 * GIB
# bits per weight of common GGUF file types, for "a smaller quantization would need ..." advice
BPW = {
    "all_f32": 32.0,
    "mostly_f16": 16.0,
    "mostly_bf16": 16.0,
    "mostly_q8_0": 8.5,
    "mostly_q6_k": 6.56,
    "mostly_q5_k_m": 5.69,
    "mostly_q5_k_s": 5.54,
    "mostly_q4_k_m": 4.85,
    "mostly_q4_k_s": 4.58,
    "mostly_q4_0": 4.55,
    "mostly_q3_k_m": 3.91,
    "mostly_q2_k": 3.35,
}
SMALLER = (("Q4_K_M", 4.85), ("Q3_K_M", 3.91), ("Q2_K", 3.35))
# Uncalibrated, a CPU prediction is this share of the bandwidth bound, low to high (docs/fit.md#speed):
# measured machines ran from under a tenth of it (a busy shared VM) to about the bound itself.
SPEED_BAND = (0.1, 1.0)
# below this many bytes read per token, fixed per-token costs outweigh memory traffic: such models are
# not used to learn the efficiency (they teach the per-token cost instead)
BANDWIDTH_BOUND_BYTES = 16 * MIB
# the devices speeds are measured and calibrated on, named as the speed recorder files them
# (app/runtime.py `_load_key`): "GPU" is every offload GPU of a placement, layers split across them
CPU, GPU = "CPU", "GPU"


@dataclass(frozen=True)
class SpeedCalibration:
    """What this machine's measurements say about one device: generation speed is `efficiency` times the
    bandwidth bound, plus a fixed `per_token_s` learned from small models; `models`: how many were used;
    `bandwidth`: the device's memory bandwidth the bound was taken from (bytes/s, None where not kept)."""

    efficiency: float
    per_token_s: float = 0.0
    models: int = 0
    bandwidth: float | None = None

    def predict(self, raw_tps: float) -> float:
        """Tokens/s for a model whose bandwidth bound is `raw_tps`."""
        return 1.0 / (1.0 / (raw_tps * self.efficiency) + self.per_token_s)

    def seconds(self, read_bytes: int) -> float | None:
        """Seconds a token spends on this device reading `read_bytes`, its fixed cost included (the
        inverse of `predict` for those bytes); None when the device's bandwidth was not kept."""
        if not self.bandwidth:
            return None
        return 1.0 / self.predict(bandwidth_bound(read_bytes, self.bandwidth))


@dataclass(frozen=True)
class Budget:
    """Bytes each device may still take for this model."""

    devices: dict[str, int]

    @classmethod
    def of(cls, hw: Hardware, *, used: Mapping[str, int] | None = None) -> Budget:
        used = used or {}
        avail = hw.memory.available or 0
        total = hw.memory.effective_total or avail
        host = max(0, avail - os_room(total) - used.get("CPU", 0))  # leave the OS some room
        out = {"CPU": host}
        for i, gpu in enumerate(offload_gpus(hw)):
            if gpu.unified_memory:  # Apple: Metal may wire about three quarters of RAM
                free = int((hw.memory.total or 0) * 0.75)
            else:
                free = gpu.memory_free or 0
            out[f"GPU{i}"] = max(0, free - 256 * MIB - used.get(f"GPU{i}", 0))
        return cls(out)


def os_room(total: int) -> int:
    """RAM every plan leaves the operating system: a tenth of the machine, at most 1 GiB."""
    return min(GIB, total // 10)


def auto_reserve(hw: Hardware) -> int:
    """RAM an automatic context leaves free beyond os_room, for the window, a browser and the other programs
    a person keeps open: filling a 24 GiB machine to its last 64 MiB with KV cache made it unusable.
    15 % of the machine, at least 2 GiB (an explicit context may still use it: the user asked)."""
    total = hw.memory.effective_total or hw.memory.total or 0
    return max(AUTO_RESERVE_MIN, int(total * AUTO_RESERVE_FRACTION)) - os_room(total)


def offload_gpus(hw: Hardware) -> tuple[GPUInfo, ...]:
    """GPUs the engine can offload to: discrete cards with a known free memory, or Apple's unified GPU.

    When llama.cpp's own device list is known and holds no GPU (the CPU-only wheel), nothing is offloaded,
    whatever cards the drivers report. Integrated GPUs other than Apple's share the host RAM through
    drivers llama.cpp rarely uses well; they are left to the CPU path rather than counting that RAM twice.
    """
    if hw.engine_devices and not any(d.type in ("gpu", "igpu") for d in hw.engine_devices):
        return ()
    return tuple(
        g
        for g in hw.gpus
        if g.vendor is not None
        and (
            (g.vendor == "apple" and g.unified_memory) or (not g.unified_memory and g.memory_free is not None)
        )
    )


@dataclass(frozen=True)
class Placement:
    name: str  # "gpu", "partial", "cpu"
    gpu_layers: int
    params: FitParams
    devices: tuple[DeviceUse, ...]
    fits: bool
    max_ctx: int | None  # the largest total context that fits this placement (None: not even the minimum)
    tokens_per_s: float | None  # calibrated for this machine; None where only a range is known
    speed_note: str
    short_by: dict[str, int] = field(default_factory=dict)
    raw_tokens_per_s: float | None = None  # the bandwidth bound alone
    tokens_per_s_range: tuple[float, float] | None = None  # (low, high) while nothing calibrates it
    calibrated: bool = False
    bytes_per_token: int | None = None  # what one generated token reads: active weights + half the KV
    # that read per device ("CPU", "GPU"), summing to bytes_per_token: how a split placement's speed is
    # calibrated, each part at its own device's rate
    read_bytes: dict[str, int] = field(default_factory=dict)

    def public(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "gpu_layers": self.gpu_layers,
            "ctx_size": self.params.ctx_size,
            "parallel": self.params.parallel,
            "kv_type": self.params.kv_type,
            "fits": self.fits,
            "max_ctx": self.max_ctx,
            "tokens_per_s": self.tokens_per_s,
            "tokens_per_s_range": list(self.tokens_per_s_range) if self.tokens_per_s_range else None,
            "raw_tokens_per_s": self.raw_tokens_per_s,
            "calibrated": self.calibrated,
            "bytes_per_token": self.bytes_per_token,
            "speed_note": self.speed_note,
            "devices": [d.public() for d in self.devices],
            "short_by": self.short_by,
        }


@dataclass(frozen=True)
class FitReport:
    verdict: str  # "gpu", "partial", "cpu", "too_large"
    summary: str
    chosen: Placement | None
    placements: tuple[Placement, ...]
    advice: tuple[str, ...]
    budget: dict[str, int]
    ctx_reduced_from: int | None = None
    ram_left: int | None = None  # an automatic context's plan: the RAM it leaves free (auto_reserve)

    @property
    def fits(self) -> bool:
        return self.chosen is not None

    def public(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "summary": self.summary,
            "fits": self.fits,
            "chosen": self.chosen.public() if self.chosen else None,
            "placements": [p.public() for p in self.placements],
            "advice": list(self.advice),
            "budget": self.budget,
            "ctx_reduced_from": self.ctx_reduced_from,
            "ram_left": self.ram_left,
        }


def _uses(layout: GGUFLayout, params: FitParams, n_gpus: int) -> tuple[DeviceUse, ...]:
    return breakdown(layout, params=params, gpu_devices=n_gpus if params.gpu_layers > 0 else 0)


def _short_by(uses: tuple[DeviceUse, ...], budget: Budget) -> dict[str, int]:
    return {
        u.device: u.total - budget.devices.get(u.device, 0)
        for u in uses
        if u.total > budget.devices.get(u.device, 0)
    }


def _fits(layout: GGUFLayout, params: FitParams, n_gpus: int, budget: Budget) -> bool:
    return not _short_by(_uses(layout, params, n_gpus), budget)


def largest_ctx(
    layout: GGUFLayout, params: FitParams, n_gpus: int, budget: Budget, *, ceiling: int
) -> int | None:
    """The largest total context (per-slot multiples of 256) that fits, up to `ceiling`; None if none does."""
    step = CTX_PAD * params.parallel
    lo, hi = 1, max(1, ceiling // step)
    if not _fits(layout, dataclasses.replace(params, ctx_size=lo * step), n_gpus, budget):
        return None
    while lo < hi:  # memory grows with context: bisect on the number of steps
        mid = (lo + hi + 1) // 2
        if _fits(layout, dataclasses.replace(params, ctx_size=mid * step), n_gpus, budget):
            lo = mid
        else:
            hi = mid - 1
    return lo * step


def bytes_per_token(layout: GGUFLayout, p: FitParams) -> int:
    """Bytes one generated token reads: every active weight and half the context's KV."""
    active = sum(layout.layer_bytes) + layout.output_bytes
    if layout.expert_count and layout.expert_used_count:
        active = int(
            active * max(layout.expert_used_count / layout.expert_count, 0.1)
        )  # rough: experts dominate
    kv = kv_bytes_per_cell(layout, kv_type=p.kv_type) * p.ctx_per_seq / 2
    return max(1, int(active + kv))


def read_bytes_by_device(layout: GGUFLayout, p: FitParams, *, n_gpus: int) -> dict[str, int]:
    """`bytes_per_token` split where the reads happen: the offloaded layers (the last `gpu_layers`, as
    split_weights puts them) with their KV on the GPU, the rest on the CPU; all of it on the GPU when the
    output layer is offloaded too. Devices that read nothing are left out."""
    total = bytes_per_token(layout, p)
    n = layout.block_count
    on = max(0, min(p.gpu_layers, n)) if n_gpus else 0
    if not on:
        return {CPU: total}
    if p.gpu_layers > n:
        return {GPU: total}
    weights = sum(layout.layer_bytes[n - on :])
    if layout.expert_count and layout.expert_used_count:  # the same scaling as bytes_per_token's
        weights = int(weights * max(layout.expert_used_count / layout.expert_count, 0.1))
    b = KV_TYPE_BYTES[p.kv_type]
    k_v = (layout.key_length or 0) + (layout.value_length or 0)
    kv_cell = sum(
        layout.head_count_kv[i] * k_v * b
        for i in range(n - on, n)
        if i < len(layout.kv_layers) and layout.kv_layers[i] and i < len(layout.head_count_kv)
    )
    gpu = min(total, int(weights + kv_cell * p.ctx_per_seq / 2))
    return {d: v for d, v in ((GPU, gpu), (CPU, total - gpu)) if v > 0}


def device_bandwidths(hw: Hardware) -> dict[str, float]:
    """Each device's memory bandwidth under the names speeds are calibrated by (bytes/s, reads plus
    writes as the copy measurement counts them): the CPU's measured all-cores figure; the GPU's where it
    reads that same memory (unified memory: Apple), or where every offload GPU is an NVIDIA card whose
    driver gave its bandwidth (the slowest card's when layers are spread over several: a token waits for
    each card's layers in turn, so the slowest is the cautious scale). A device with no figure is left
    out, so its speeds stay uncalibrated; empty when nothing is known."""
    out: dict[str, float] = {}
    if hw.bandwidth is not None:
        out[CPU] = float(hw.bandwidth.all_cores)
    gpus = offload_gpus(hw)
    if not gpus:
        return out
    if all(g.unified_memory for g in gpus):
        if hw.bandwidth is not None:
            out[GPU] = float(hw.bandwidth.all_cores)
    elif all(g.vendor == "nvidia" and not g.unified_memory and g.memory_bandwidth for g in gpus):
        # NVML gives the rate the card reads at; the CPU's copy figure counts each byte read and written,
        # and bandwidth_bound halves whatever it is given: twice the read rate puts the card on that scale
        out[GPU] = 2 * min(float(g.memory_bandwidth or 0) for g in gpus)
    return out


def bandwidth_bound(read_bytes: int, bandwidth: float) -> float:
    """Tokens/s if each token only waited for its bytes: the copy figure counts read + write, a token
    only reads, so half of `bandwidth` is the read rate."""
    return (bandwidth / 2) / max(1, read_bytes)


def _speed(layout: GGUFLayout, hw: Hardware, p: FitParams, n_gpus: int) -> tuple[float | None, str]:
    """The bandwidth bound in tokens/s (None on a GPU, or with no bandwidth measured) and a note."""
    if p.gpu_layers > 0 and n_gpus:
        return None, (
            "a GPU placement has no bandwidth bound of its own yet: where the GPU memory bandwidth is "
            "known (an NVIDIA driver's figure, or the memory an Apple GPU shares), answers measured on "
            "this machine's GPU (and CPU, for layers left there) calibrate its speed; else measured "
            "speed shows after a load"
        )
    if hw.bandwidth is None:
        return None, "memory bandwidth not measured yet"
    raw = bandwidth_bound(bytes_per_token(layout, p), hw.bandwidth.all_cores)
    return round(raw, 1), "estimated from measured memory bandwidth (all cores)"


def _band(raw: float) -> tuple[float, float]:
    lo, hi = SPEED_BAND
    return round(raw * lo, 1), round(raw * hi, 1)


def _range_note(band: tuple[float, float]) -> str:
    return (
        f"{rate(band[0])}-{rate(band[1])} tok/s from memory bandwidth: a range, as nothing measured on this "
        "machine calibrates it yet"
    )


def plan_placements(
    layout: GGUFLayout,
    hw: Hardware,
    *,
    params: FitParams,
    budget: Budget,
    ceiling: int | None = None,
    ctx_is_auto: bool = True,
    gpu_layers: int | None = None,
) -> FitReport:
    """Evaluate every placement at `params.ctx_size` and pick the best that fits.

    With `ctx_is_auto` a context that does not fit is shrunk to the largest that does (never below one
    256-cell page per slot); an explicit context is never changed: the report refuses it and says the
    largest that fits. `gpu_layers` fixes the placement instead of searching for the best one.

    An automatic context is planned within the budget less auto_reserve() of RAM, so the machine stays
    usable, and the summary says how much RAM it leaves; only where nothing fits that way (a small machine)
    is the whole budget planned, as an explicit context always is.
    """
    if ctx_is_auto and budget.devices.get("CPU"):
        reserve = auto_reserve(hw)
        kept = Budget({k: max(0, v - reserve) if k == "CPU" else v for k, v in budget.devices.items()})
        report = _plan_placements(
            layout, hw, params=params, budget=kept, ceiling=ceiling, ctx_is_auto=True, gpu_layers=gpu_layers
        )
        if report.chosen is not None:
            cpu_use = sum(d.total for d in report.chosen.devices if d.device == "CPU")
            total = hw.memory.effective_total or hw.memory.total or 0
            left = budget.devices["CPU"] + os_room(total) - cpu_use
            # before the speed words, which calibrated() replaces at the end
            speed = speed_words(report.chosen)
            head = report.summary.removesuffix(speed) if speed else report.summary
            summary = (
                f"{head}, leaving {fmt_bytes(left)} of RAM free for the system and other programs{speed}"
            )
            return dataclasses.replace(report, summary=summary, budget=budget.devices, ram_left=left)
    return _plan_placements(
        layout,
        hw,
        params=params,
        budget=budget,
        ceiling=ceiling,
        ctx_is_auto=ctx_is_auto,
        gpu_layers=gpu_layers,
    )


def _plan_placements(
    layout: GGUFLayout,
    hw: Hardware,
    *,
    params: FitParams,
    budget: Budget,
    ceiling: int | None,
    ctx_is_auto: bool,
    gpu_layers: int | None,
) -> FitReport:
    n = layout.block_count
    gpus = offload_gpus(hw)
    ceiling = ceiling or max(params.ctx_size, (layout.context_length or params.ctx_per_seq) * params.parallel)
    candidates: list[tuple[str, int]] = []
    if gpus:
        candidates.append(("gpu", n + 1))
    candidates_cpu = ("cpu", 0)
    placements: list[Placement] = []
    if gpu_layers is not None:
        layers = gpu_layers if gpus else 0
        name = "cpu" if layers <= 0 else "gpu" if layers > n else "partial"
        placements.append(_placement(layout, hw, params, name, max(0, layers), len(gpus), budget, ceiling))
    else:
        for name, layers in candidates:
            placements.append(_placement(layout, hw, params, name, layers, len(gpus), budget, ceiling))
        if gpus and not placements[0].fits:
            best = _most_layers(layout, params, len(gpus), budget)
            if best > 0:
                placements.append(_placement(layout, hw, params, "partial", best, len(gpus), budget, ceiling))
        placements.append(_placement(layout, hw, params, *candidates_cpu, len(gpus), budget, ceiling))
    chosen = next((p for p in placements if p.fits), None)
    reduced_from = None
    if chosen is None and ctx_is_auto:
        for p in placements:
            if p.max_ctx:
                shrunk = dataclasses.replace(params, ctx_size=p.max_ctx)
                chosen = _placement(layout, hw, shrunk, p.name, p.gpu_layers, len(gpus), budget, ceiling)
                reduced_from = params.ctx_size
                placements = [chosen if q is p else q for q in placements]
                break
    return _report(layout, hw, params, placements, chosen, budget, reduced_from)


def _most_layers(layout: GGUFLayout, params: FitParams, n_gpus: int, budget: Budget) -> int:
    lo, hi = 0, layout.block_count
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _fits(layout, dataclasses.replace(params, gpu_layers=mid), n_gpus, budget):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _placement(
    layout: GGUFLayout,
    hw: Hardware,
    params: FitParams,
    name: str,
    layers: int,
    n_gpus: int,
    budget: Budget,
    ceiling: int,
) -> Placement:
    p = dataclasses.replace(params, gpu_layers=layers)
    uses = _uses(layout, p, n_gpus)
    short = _short_by(uses, budget)
    raw, note = _speed(layout, hw, p, n_gpus)
    band = _band(raw) if raw is not None else None
    return Placement(
        name=name,
        gpu_layers=layers,
        params=p,
        devices=uses,
        fits=not short,
        max_ctx=largest_ctx(layout, p, n_gpus, budget, ceiling=ceiling),
        tokens_per_s=None,
        speed_note=_range_note(band) if band else note,
        short_by=short,
        raw_tokens_per_s=raw,
        tokens_per_s_range=band,
        bytes_per_token=bytes_per_token(layout, p),
        read_bytes=read_bytes_by_device(layout, p, n_gpus=n_gpus),
    )


def speed_words(p: Placement) -> str:
    """The speed part of a summary: the calibrated figure, else the range, else nothing."""
    if p.tokens_per_s:
        return f", about {rate(p.tokens_per_s)} tokens/s"
    if p.tokens_per_s_range:
        return (
            f", {rate(p.tokens_per_s_range[0])}-{rate(p.tokens_per_s_range[1])} tokens/s (not measured yet)"
        )
    return ""


def calibrated(report: FitReport, calibration: Mapping[str, SpeedCalibration]) -> FitReport:
    """`report` with this machine's calibration applied per device (docs/fit.md#speed): a CPU-only
    placement scaled by the CPU's, one all on the GPU by the GPU's, a split one by both. A placement
    using a device nothing was measured on keeps what it had (the range, or the note); `report` itself
    when `calibration` is empty."""
    if not calibration:
        return report
    placements = tuple(_calibrated(p, calibration) for p in report.placements)
    chosen = next((q for p, q in zip(report.placements, placements, strict=True) if p is report.chosen), None)
    summary = report.summary
    if report.chosen is not None and chosen is not None:
        old = speed_words(report.chosen)
        if old and summary.endswith(old):
            summary = summary[: -len(old)] + speed_words(chosen)
        elif not old:  # a GPU placement had no figure to replace
            summary += speed_words(chosen)
    return dataclasses.replace(report, summary=summary, chosen=chosen, placements=placements)


def _calibrated(p: Placement, calibration: Mapping[str, SpeedCalibration]) -> Placement:
    parts = p.read_bytes or ({CPU: p.bytes_per_token} if p.bytes_per_token else {})
    if GPU not in parts:  # the CPU path: its bound is the placement's own raw figure
        cal = calibration.get(CPU)
        if cal is None or p.raw_tokens_per_s is None:
            return p
        note = f"calibrated from {cal.models} model(s) measured on this machine's CPU"
        return _with_speed(p, cal.predict(p.raw_tokens_per_s), note)
    # the layers run one after another: a token's time is the sum of each device's part at its own rate
    seconds = {d: cal.seconds(b) for d, b in parts.items() if (cal := calibration.get(d)) is not None}
    done = {d: s for d, s in seconds.items() if s is not None}
    if len(done) < len(parts):
        if not done:
            return p
        missing = ", ".join(d for d in parts if d not in done)
        said = f"{_devices_words(done, calibration)}; not yet the {missing}, so no figure for this split"
        return dataclasses.replace(p, speed_note=f"{p.speed_note} (calibrated: {said})")
    if len(parts) == 1:
        (device,) = parts
        note = f"calibrated from {calibration[device].models} model(s) measured on this machine's {device}"
    else:
        note = (
            f"calibrated per device, {p.gpu_layers} layer(s) on the GPU and the rest on the CPU, from "
            f"{_devices_words(done, calibration)} measured on this machine"
        )
    return _with_speed(p, 1.0 / sum(done.values()), note)


def _devices_words(devices: Mapping[str, object], calibration: Mapping[str, SpeedCalibration]) -> str:
    return ", ".join(f"{d} ({calibration[d].models} model(s))" for d in devices)


def _with_speed(p: Placement, tps: float, note: str) -> Placement:
    return dataclasses.replace(
        p, tokens_per_s=round(tps, 1), tokens_per_s_range=None, calibrated=True, speed_note=note
    )


def rate(tps: float) -> str:
    return f"{tps:.0f}" if tps >= 100 else f"{tps:.1f}"


def _report(
    layout: GGUFLayout,
    hw: Hardware,
    params: FitParams,
    placements: list[Placement],
    chosen: Placement | None,
    budget: Budget,
    reduced_from: int | None,
) -> FitReport:
    if chosen is not None:
        total = sum(d.total for d in chosen.devices)
        speed = speed_words(chosen)
        where = {
            "gpu": "fits on the GPU",
            "partial": f"partial offload: {chosen.gpu_layers} of {layout.block_count} layers on the GPU",
            "cpu": "runs on the CPU only",
        }[chosen.name]
        # what one prompt and its reply may hold, the number a user sends against; the total as detail
        total_ctx, parallel = chosen.params.ctx_size, max(chosen.params.parallel, 1)
        ctx = f" at context {total_ctx}"
        if parallel > 1:
            ctx = f" at {total_ctx // parallel} tokens per request ({total_ctx} in all, {parallel} at once)"
        if reduced_from:
            ctx += f" (reduced from {reduced_from} to fit)"
        return FitReport(
            chosen.name,
            f"{where}{ctx}, using {fmt_bytes(total)}{speed}",
            chosen,
            tuple(placements),
            (),
            budget.devices,
            reduced_from,
        )
    cpu = placements[-1]
    need = sum(d.total for d in cpu.devices)
    have = budget.devices.get("CPU", 0) + sum(v for k, v in budget.devices.items() if k != "CPU")
    advice = list(_advice(layout, params, cpu, budget))
    best_ctx = max((p.max_ctx or 0) for p in placements)
    if best_ctx:
        advice.insert(0, f"a context of {best_ctx} or less fits (asked for {params.ctx_size})")
    cpu_free = budget.devices.get("CPU", 0)
    summary = (
        f"does not fit: needs {fmt_bytes(need)} on the CPU path, {fmt_bytes(cpu_free)} of RAM is free for it"
    )
    if have > cpu_free:
        summary += f" ({fmt_bytes(have - cpu_free)} more free on the GPU(s) is not enough for any offload)"
    return FitReport("too_large", summary, None, tuple(placements), tuple(advice), budget.devices)


def _advice(layout: GGUFLayout, params: FitParams, cpu: Placement, budget: Budget) -> list[str]:
    """What would make it fit on the CPU path, each step saying whether it is enough on its own: advice
    that still would not fit says so, and names the smaller model it takes when no quantization does."""
    out: list[str] = []
    short = max(0, sum(d.total for d in cpu.devices) - budget.devices.get("CPU", 0))

    def enough(saved: int) -> str:
        return (
            "enough to fit"
            if saved >= short
            else f"not enough on its own: still {fmt_bytes(short - saved)} short"
        )

    kv = sum(d.kv_cache for d in cpu.devices)
    if params.kv_type in ("f16", "bf16", "f32") and kv > 64 * MIB:
        saved = int(kv * (1 - KV_TYPE_BYTES["q8_0"] / KV_TYPE_BYTES[params.kv_type]))
        out.append(f"a q8_0 KV cache would save {fmt_bytes(saved)}, {enough(saved)} (--kv-type q8_0)")
    bpw = BPW.get(layout.file_type or "")
    weights = sum(d.weights for d in cpu.devices)
    smaller = [(name, target) for name, target in SMALLER if bpw and target < bpw]
    if bpw and smaller and weights:
        for name, target in smaller:
            saved = weights - int(weights * target / bpw)
            if saved >= short:
                need = fmt_bytes(int(weights * target / bpw))
                out.append(
                    f"a {name} quantization of this model would need about {need} for its weights, "
                    "enough to fit"
                )
                break
        else:
            name, target = smaller[-1]
            saved = weights - int(weights * target / bpw)
            if weights * 2 >= short:  # the weights are what is large: a smaller model is the way
                out.append(
                    f"even a {name} quantization would still be {fmt_bytes(short - saved)} short: "
                    "choose a model with fewer parameters"
                )
    return out
