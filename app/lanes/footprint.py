"""What llama.cpp says it allocated, read from its own load log, plus the process's memory.

llama.cpp prints one line per buffer at load ("CPU_Mapped model buffer size = 97.08 MiB",
"CUDA0 KV buffer size = ...", "CPU compute buffer size = ..."); these are the figures a memory
prediction is checked against. Values are rounded MiB in the log, so they are kept as bytes
with that precision. A split's head (llama-server with `--rpc`) names each worker's device by its
index on that worker and the endpoint it was reached at ("RPC0[127.0.0.1:40123] model buffer size
= ..."): those names are kept whole, one entry per worker device.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.core import statefile
from app.library.footprints import footprint_entry, still_current

_LINE = re.compile(
    # an RPC device carries its endpoint in brackets (an IPv6 one has brackets of its own inside)
    r"(?P<device>[A-Za-z0-9_]+(?:\[\S+\])?)\s+(?P<what>model|KV|compute|output|RS)\s+buffer size"
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


_GPU_DEV = re.compile(r"^(?:CUDA|ROCm|HIP|Vulkan|SYCL|MUSA|CANN|OpenCL)(\d+)$", re.IGNORECASE)


def device_name(raw: str) -> str:
    """Names as the memory plan uses them: 'CPU_Mapped', 'CPU_REPACK' and 'CPU' are all host memory
    ('CPU'), and so is a GPU backend's pinned host buffer ('CUDA_Host', 'Vulkan_Host': the small compute
    and output buffers the host keeps on offload); a backend's GPU N ('CUDA0', 'Vulkan1', 'ROCm0') is
    'GPU<N>'; Apple's 'Metal' is 'GPU0'. Another machine's device ('RPC0[127.0.0.1:40123]') keeps its
    name: it is no memory of this machine."""
    if raw.upper().startswith("CPU") or raw.endswith("_Host"):
        return "CPU"
    m = _GPU_DEV.match(raw)
    if m:
        return f"GPU{m[1]}"
    return "GPU0" if raw.lower().startswith("metal") else raw


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


class FootprintStore:
    """The last predicted and measured memory of each model, kept across restarts in a JSON file.

    Entries are keyed by model id and remember the file's size and mtime, so a replaced file's old
    figures are not shown as its own. A corrupt file is set aside (renamed), never silently lost.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def _load(self) -> dict[str, Any]:
        try:
            return self._parse(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except OSError:
            return self._set_aside()

    def _parse(self, text: str) -> dict[str, Any]:
        try:
            data = json.loads(text)
        except ValueError:
            return self._set_aside()
        return data if isinstance(data, dict) else {}

    def _set_aside(self) -> dict[str, Any]:
        with contextlib.suppress(OSError):
            self.path.rename(self.path.with_suffix(f".corrupt-{int(time.time())}"))
        return {}

    def record(self, lane: Any) -> None:
        """Called when a lane is ready: store its plan's prediction beside llama.cpp's own figures."""
        entry = footprint_entry(lane)
        if entry is None:
            return

        def change(data: dict[str, Any] | None) -> dict[str, Any]:
            return {**(data or {}), lane.model_id: entry}

        # locked: a desktop and a headless server on one data dir each keep their own lanes' figures
        statefile.update(self.path, change, parse=self._parse, dump=lambda d: json.dumps(d, indent=1))

    def get(self, model_id: str, *, path: Path) -> dict[str, Any] | None:
        return still_current(self._load().get(model_id), path=path)
