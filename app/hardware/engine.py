"""The devices llama.cpp itself sees, from `xllamacpp.get_device_info()`.

This is the ground truth for what the llama.cpp lane can place layers on (a CUDA card without a CUDA build
of the engine is not a device to it), so it is kept beside, not merged into, the vendor probes.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from typing import Any

from app.hardware.model import EngineDevice

# ggml_backend_dev_type, in ggml.h order, for builds that hand back a bare int.
_TYPES_BY_NUMBER = ("cpu", "gpu", "igpu", "accel")
_TYPE_PREFIX = "GGML_BACKEND_DEVICE_TYPE_"


def _type_name(raw: Any) -> str:
    name = getattr(raw, "name", None)
    if isinstance(name, str):
        return name.removeprefix(_TYPE_PREFIX).lower()
    if isinstance(raw, int) and 0 <= raw < len(_TYPES_BY_NUMBER):
        return _TYPES_BY_NUMBER[raw]
    return str(raw).rsplit(".", 1)[-1].removeprefix(_TYPE_PREFIX).lower()


def _bytes(raw: Any) -> int | None:
    return int(raw) if isinstance(raw, int) and not isinstance(raw, bool) and raw >= 0 else None


def parse_engine_devices(raw: Iterable[Mapping[str, Any]]) -> tuple[EngineDevice, ...]:
    """`get_device_info()` entries -> EngineDevice; entries without a name are skipped."""
    out = []
    for d in raw:
        name = d.get("name")
        if not isinstance(name, str) or not name:
            continue
        out.append(
            EngineDevice(
                name=name,
                description=str(d.get("description") or ""),
                type=_type_name(d.get("type")),
                memory_free=_bytes(d.get("memory_free")),
                memory_total=_bytes(d.get("memory_total")),
                device_id=str(d["device_id"]) if d.get("device_id") else None,
            )
        )
    return tuple(out)


def read_engine_devices() -> tuple[tuple[EngineDevice, ...], str | None]:
    """What the installed xllamacpp reports, and a reason when it reports nothing.

    In-process: a CUDA build creates a CUDA context here to read free memory; that is the price of asking
    the engine rather than guessing what it will see."""
    try:
        xllamacpp = importlib.import_module("xllamacpp")
        raw = xllamacpp.get_device_info()
    except Exception as e:  # an absent or broken engine must not break the probe
        return (), f"llama.cpp: {type(e).__name__}: {e}"
    devices = parse_engine_devices(raw)
    return devices, None if devices else "llama.cpp: no devices"
