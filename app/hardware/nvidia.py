"""NVIDIA GPUs through NVML (`pynvml`, from the `nvidia-ml-py` distribution).

Every reader takes the nvml module as a parameter (None: the real `pynvml`) so tests can hand in a small
object that answers with values captured from real cards; nothing else here knows it is not the real one.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from app.hardware.model import GPUInfo, GPUSample, GPUScan


def load_nvml() -> Any:
    """The real pynvml module, or None when nvidia-ml-py is not installed.

    Imported by name because pynvml ships no type information; callers treat it as Any either way."""
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        return None


def _text(v: Any) -> str:
    # nvidia-ml-py < 11.515 returned bytes for strings; newer versions return str.
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def _maybe(nvml: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """One NVML query; None when this card or driver does not support it (NVMLError_NotSupported...)."""
    try:
        return fn(*args)
    except nvml.NVMLError:
        return None


# nvmlClockType_t's memory clock, for bindings that do not name it
NVML_CLOCK_MEM = 2


def _memory_bandwidth(nvml: Any, h: Any) -> float | None:
    """The card's theoretical memory read rate in bytes/s: bus width (bits) / 8 x top memory clock (MHz)
    x 2, as NVML reports the clock at half the transfer rate. None when the bindings lack either query
    (older nvidia-ml-py) or the driver answers neither with a figure."""
    bus_width = getattr(nvml, "nvmlDeviceGetMemoryBusWidth", None)
    max_clock = getattr(nvml, "nvmlDeviceGetMaxClockInfo", None)
    if bus_width is None or max_clock is None:
        return None
    bits = _maybe(nvml, bus_width, h)
    mhz = _maybe(nvml, max_clock, h, getattr(nvml, "NVML_CLOCK_MEM", NVML_CLOCK_MEM))
    if not bits or not mhz:
        return None
    return float(bits) / 8 * float(mhz) * 1e6 * 2


def _card(nvml: Any, index: int, driver: str | None) -> GPUInfo:
    h = nvml.nvmlDeviceGetHandleByIndex(index)
    name = _maybe(nvml, nvml.nvmlDeviceGetName, h)
    mem = _maybe(nvml, nvml.nvmlDeviceGetMemoryInfo, h)
    cc = _maybe(nvml, nvml.nvmlDeviceGetCudaComputeCapability, h)
    pci = _maybe(nvml, nvml.nvmlDeviceGetPciInfo, h)
    return GPUInfo(
        index=index,
        vendor="nvidia",
        name=_text(name) if name is not None else "NVIDIA GPU",
        memory_total=int(mem.total) if mem is not None else None,
        memory_free=int(mem.free) if mem is not None else None,
        memory_used=int(mem.used) if mem is not None else None,
        driver_version=driver,
        compute_capability=f"{cc[0]}.{cc[1]}" if cc is not None else None,
        # NVML reports no memory on a unified-memory part (GB10/Grace-Blackwell answers NotSupported).
        unified_memory=False,
        pci_bus_id=_text(pci.busId) if pci is not None else None,
        source="nvml",
        memory_bandwidth=_memory_bandwidth(nvml, h),
    )


def read_nvidia(nvml: Any = None) -> GPUScan:
    """All NVIDIA GPUs NVML sees. No driver, no library or no cards: no GPUs and the reason why.

    A card that fails mid-query (fallen off the bus) is left out and named in the reason."""
    nvml = nvml if nvml is not None else load_nvml()
    if nvml is None:
        return GPUScan((), "NVML: nvidia-ml-py is not installed")
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as e:
        return GPUScan((), f"NVML: {e}")
    try:
        driver = _maybe(nvml, nvml.nvmlSystemGetDriverVersion)
        driver = _text(driver) if driver is not None else None
        gpus, lost = [], []
        for i in range(nvml.nvmlDeviceGetCount()):
            try:
                gpus.append(_card(nvml, i, driver))
            except nvml.NVMLError as e:
                lost.append(f"GPU {i}: {e}")
        reason = None if gpus and not lost else ("NVML: " + "; ".join(lost) if lost else "NVML: no GPUs")
        return GPUScan(tuple(gpus), reason)
    except nvml.NVMLError as e:
        return GPUScan((), f"NVML: {e}")
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass  # nothing left to release


def sample_nvidia(nvml: Any) -> tuple[GPUSample, ...]:
    """Memory used and utilisation per card, for the monitor. nvml must already be initialised; an
    NVMLError propagates so the caller can skip the whole sample."""
    out = []
    for i in range(nvml.nvmlDeviceGetCount()):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        mem = nvml.nvmlDeviceGetMemoryInfo(h)
        util = _maybe(nvml, nvml.nvmlDeviceGetUtilizationRates, h)
        out.append(
            GPUSample(
                index=i,
                vendor="nvidia",
                memory_used=int(mem.used),
                memory_total=int(mem.total),
                utilization_percent=int(util.gpu) if util is not None else None,
            )
        )
    return tuple(out)
