"""What llama.cpp says it allocated, read from its own load log, plus the process's memory.

llama.cpp prints one line per buffer at load ("CPU_Mapped model buffer size = 97.08 MiB",
"CUDA0 KV buffer size = ...", "CPU compute buffer size = ..."); these are the figures a memory
prediction is checked against. Values are rounded MiB in the log, so they are kept as bytes
with that precision.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

_LINE = re.compile(
    r"(?P<device>[A-Za-z0-9_]+)\s+(?P<what>model|KV|compute|output|RS)\s+buffer size"
    r"\s*=\s*(?P<mib>[0-9.]+)\s*MiB"
)
_COMPONENT = {
    "model": "weights",
    "KV": "kv_cache",
    "compute": "compute",
    "output": "output",
    "RS": "recurrent",
}
MIB = 1 << 20


@dataclass
class Footprint:
    """Bytes per device and component, as the engine reported them."""

    devices: dict[str, dict[str, int]] = field(default_factory=dict)
    rss_bytes: int | None = None

    def add(self, device: str, component: str, nbytes: int) -> None:
        dev = self.devices.setdefault(device, {})
        dev[component] = dev.get(component, 0) + nbytes

    def total(self, component: str) -> int:
        return sum(d.get(component, 0) for d in self.devices.values())

    @property
    def empty(self) -> bool:
        return not self.devices

    def public(self) -> dict[str, Any]:
        totals = {c: self.total(c) for c in _COMPONENT.values() if any(c in d for d in self.devices.values())}
        return {"devices": self.devices, "totals": totals, "rss_bytes": self.rss_bytes}


def device_name(raw: str) -> str:
    """'CPU_Mapped', 'CPU_REPACK' and 'CPU' are all host memory; 'CUDA0' stays 'CUDA0'."""
    return "CPU" if raw.upper().startswith("CPU") else raw


def parse_footprint(lines: Iterable[str]) -> Footprint:
    """Read the buffer lines of the latest load in `lines` (a log may hold several starts)."""
    fp = Footprint()
    for line in lines:
        if line.startswith("--- switchyard: starting"):
            fp = Footprint()  # a new start: earlier figures belong to an earlier process
            continue
        m = _LINE.search(line)
        if m:
            nbytes = round(float(m["mib"]) * MIB)
            fp.add(device_name(m["device"]), _COMPONENT[m["what"]], nbytes)
    return fp
