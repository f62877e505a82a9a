"""What every verdict is computed from, gathered in one place: settings, hardware, pins, memory in use."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from app.core.paths import Paths
from app.core.pins import PinStore
from app.core.settings import Settings
from app.fit.plan import SpeedCalibration
from app.formats.detect import ModelFormat
from app.hardware.model import Hardware
from app.lanes.install.installed import installed_lanes
from app.routing import Decision, FitFn, decide


@dataclass(frozen=True)
class AdviceInputs:
    """`hardware` carries the memory read just now; `used`: GPU memory other loaded lanes hold, per device."""

    settings: Settings
    hardware: Hardware
    pins: Mapping[str, str]
    used: Mapping[str, int] = field(default_factory=dict)
    # this machine's speed calibration per device, from measured answers (app/library/speeds.py)
    speed: Mapping[str, SpeedCalibration] = field(default_factory=dict)


def route_decision(inputs: AdviceInputs, fmt: ModelFormat, *, model_id: str, fit: FitFn) -> Decision:
    """Which lane runs a model of format `fmt` here: the lanes installed now, the pins, the hardware, and
    `fit` (each lane's memory verdict, from whichever source the caller has: a local file or a hub header)."""
    return decide(
        fmt,
        hardware=inputs.hardware,
        installed=installed_lanes(inputs.settings),
        pins=dict(inputs.pins),
        model_id=model_id,
        fit=fit,
    )


def with_overrides(settings: Settings, model_id: str, overrides: Mapping[str, Any] | None) -> Settings:
    """`settings` with `overrides` (ctx_size, parallel, kv_type, gpu_layers) winning over the model's own
    model_overrides entry; unchanged when there are none."""
    if not overrides:
        return settings
    over = dict(settings.models.model_overrides)
    over[model_id] = {**over.get(model_id, {}), **overrides}
    return settings.with_changes(model_overrides=over)


def local_inputs(settings: Settings, paths: Paths) -> AdviceInputs:
    """For commands that run without a server: a fresh probe (bandwidth from its cache file) and pins.json."""
    from app.hardware.probe import probe  # NVML and llama.cpp's device list load only when asked

    hw = probe(bandwidth_cache=paths.hardware_cache)
    return AdviceInputs(settings=settings, hardware=hw, pins=PinStore(paths.pins_file).all())
