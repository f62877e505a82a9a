"""Residency by memory: which loaded lanes stop so a newcomer fits, and the footprints that decide it.

With `residency: "memory"` lanes stay loaded together while their footprints fit each device's budget:
host RAM available minus `memory_reserve_mib` (and at most `ram_budget_mib` for all lanes together, when
set), each GPU's free memory minus the reserve. A lane's footprint is the settle footprint measured at its
model's last load (the engine's resident memory, and on NVIDIA cards the card's memory delta, once they
stop growing); until one is measured, the plan's prediction (none for runtime-managed kinds like MLX).

The choice here is pure (numbers in, victims out); the supervisor measures, stops and logs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass

import psutil

from app.core.units import MIB, fmt_bytes
from app.fit.plan import offload_gpus
from app.hardware.model import Hardware
from app.hardware.nvidia import read_nvidia

SETTLE_STEP_S = 0.1
SETTLE_MAX_S = 5.0
# resident memory counts as settled once three samples in a row differ by less than this share
SETTLE_TOLERANCE = 0.02
Devices = dict[str, int]


@dataclass(frozen=True)
class Footprint:
    """Bytes per device ("CPU", "GPU0", ...) one lane takes, and where the figure comes from."""

    devices: Mapping[str, int]
    source: str  # "measured" (settle footprint of the last load) or "predicted" (the plan's)

    @property
    def total(self) -> int:
        return sum(self.devices.values())

    def public(self) -> dict[str, object]:
        return {"source": self.source, "total": self.total, "devices": dict(self.devices)}


@dataclass(frozen=True)
class Resident:
    """A loaded lane as the room policy sees it."""

    id: str
    busy: bool
    last_used: float
    footprint: Footprint | None


@dataclass(frozen=True)
class Room:
    """The outcome for one newcomer: lanes to stop (idle first, least recently used first), and what it
    would still lack if all of them went (a refusal then names these numbers)."""

    victims: tuple[Resident, ...]
    short: Devices  # bytes still missing per device after every victim is stopped


def free_bytes(
    *,
    ram_available: int | None,
    gpu_free: Mapping[str, int],
    loaded: list[Footprint | None],
    reserve: int,
    ram_budget: int | None,
) -> Devices:
    """What a newcomer may take per device now. RAM available already reflects loaded engines; a GPU's
    free figure (a snapshot from before they loaded) does not, so their GPU footprints are subtracted."""
    out: Devices = {}
    used = _sum([fp.devices for fp in loaded if fp is not None])
    if ram_available is not None:
        out["CPU"] = ram_available - reserve
    if ram_budget is not None:
        capped = ram_budget - used.get("CPU", 0)
        out["CPU"] = min(out.get("CPU", capped), capped)
    for dev, free in gpu_free.items():
        out[dev] = free - reserve - used.get(dev, 0)
    return out


def plan_room(need: Footprint | None, *, free: Devices, residents: list[Resident]) -> Room:
    """The lanes to stop, in order, so `need` fits `free`: idle before busy, least recently used first,
    only lanes that hold memory on a device the newcomer lacks. An unknown need stops nothing."""
    short = _short(need, free)
    victims: list[Resident] = []
    for r in sorted(residents, key=lambda r: (r.busy, r.last_used)):
        if not short:
            break
        held = r.footprint.devices if r.footprint is not None else {}
        if not any(held.get(dev, 0) > 0 for dev in short):
            continue
        victims.append(r)
        free = {dev: v + held.get(dev, 0) for dev, v in free.items()}
        short = _short(need, free)
    return Room(tuple(victims), short)


def _short(need: Footprint | None, free: Devices) -> Devices:
    if need is None:
        return {}
    return {dev: n - free[dev] for dev, n in need.devices.items() if dev in free and n > free[dev]}


def _sum(parts: list[Mapping[str, int]]) -> Devices:
    out: Devices = {}
    for part in parts:
        for dev, n in part.items():
            out[dev] = out.get(dev, 0) + n
    return out


def describe(need: Footprint | None, free: Devices) -> str:
    """ "needs 3.10 GiB, 1.20 GiB free" (per device when several are short)."""
    if need is None:
        return "needs an unknown amount (measured after its first load)"
    parts = [
        f"needs {fmt_bytes(n)}{_on(dev)}, {fmt_bytes(max(0, free[dev]))} free"
        for dev, n in need.devices.items()
        if dev in free
    ]
    return "; ".join(parts) or f"needs {fmt_bytes(need.total)}"


def fmt_devices(devices: Mapping[str, int]) -> str:
    """ "52.1 MiB" for host memory alone, else "52.1 MiB + 1.20 GiB on GPU0"."""
    return " + ".join(f"{fmt_bytes(n)}{_on(dev)}" for dev, n in devices.items()) or "nothing"


def _on(dev: str) -> str:
    return "" if dev == "CPU" else f" on {dev}"


def predicted_footprint(predicted: Mapping[str, object] | None) -> Footprint | None:
    """A plan's prediction ({"devices": [{"device", "total"}, ...]}) as a Footprint."""
    rows = predicted.get("devices") if predicted else None
    if not isinstance(rows, list) or not rows:
        return None
    devices: Devices = {}
    for d in rows:
        if isinstance(d, dict) and isinstance(d.get("total"), int):
            dev = str(d.get("device"))
            devices[dev] = devices.get(dev, 0) + int(d["total"])
    return Footprint(devices, "predicted") if devices else None


def tree_rss(pid: int) -> int | None:
    """Resident bytes of a process and its children (an engine under our guard, its workers)."""
    try:
        p = psutil.Process(pid)
        return int(p.memory_info().rss + sum(c.memory_info().rss for c in p.children(recursive=True)))
    except psutil.Error:
        return None


async def settle_rss(pid: int, *, max_s: float = SETTLE_MAX_S) -> int | None:
    """The engine's resident memory once it stops growing (or after `max_s`): engines touch weights and
    buffers for a moment after they answer their health route."""
    samples: list[int] = []
    deadline = time.monotonic() + max_s
    while time.monotonic() < deadline:
        rss = tree_rss(pid)
        if rss is None:
            return samples[-1] if samples else None
        samples.append(rss)
        last = samples[-3:]
        if len(last) == 3 and max(last) - min(last) <= max(MIB, int(max(last) * SETTLE_TOLERANCE)):
            return max(last)
        await asyncio.sleep(SETTLE_STEP_S)
    return samples[-1] if samples else None


def gpu_free(hw: Hardware | None) -> Devices:
    """Free memory per offload GPU as the plan names them ("GPU0", ...), from the hardware snapshot.
    Apple's unified GPU is left out: its allocations are the engine's resident memory, counted on CPU."""
    if hw is None:
        return {}
    return {
        f"GPU{i}": g.memory_free
        for i, g in enumerate(offload_gpus(hw))
        if not g.unified_memory and g.memory_free is not None
    }


def gpu_used_now(hw: Hardware | None) -> Devices:
    """Memory used now per offload NVIDIA card (NVML); {} where no card can be read this way."""
    cards = [(i, g) for i, g in enumerate(offload_gpus(hw)) if g.source == "nvml"] if hw else []
    if not cards:
        return {}
    now = {g.index: g.memory_used for g in read_nvidia().gpus}
    return {f"GPU{i}": used for i, g in cards if (used := now.get(g.index)) is not None}
