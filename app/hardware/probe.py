"""The static snapshot of this machine, taken once at start: CPU, RAM, GPUs, what llama.cpp sees."""

from __future__ import annotations

import platform
import sys
from pathlib import Path
from typing import Any

import psutil

from app.hardware.apple import AppleFacts, apple_facts, read_sysctl
from app.hardware.bandwidth import load_or_measure
from app.hardware.cgroup import CGROUP_ROOT, cgroup_cpu_quota, cgroup_memory_limit
from app.hardware.cpu import CpuinfoFacts, parse_cpuinfo, usable_cores
from app.hardware.engine import read_engine_devices
from app.hardware.model import CPUInfo, EngineDevice, GPUInfo, Hardware, MemoryInfo, Vendor
from app.hardware.nvidia import read_nvidia
from app.hardware.swap import swap_now
from app.hardware.sysfs import AMDGPU_IDS, SYSFS_ROOT, read_sysfs_gpus

_ARCH = {"amd64": "x86_64", "x64": "x86_64", "aarch64": "arm64", "armv8": "arm64"}
_GPU_TYPES = ("gpu", "igpu")
_VENDOR_WORDS: tuple[tuple[str, Vendor], ...] = (
    ("nvidia", "nvidia"),
    ("geforce", "nvidia"),
    ("radeon", "amd"),
    ("amd", "amd"),
    ("intel", "intel"),
    ("apple", "apple"),
)


def normalise_arch(machine: str) -> str:
    m = machine.lower()
    return _ARCH.get(m, m)


def _cpuinfo(proc_root: Path) -> CpuinfoFacts | None:
    try:
        return parse_cpuinfo((proc_root / "cpuinfo").read_text())
    except OSError:
        return None


def _self_cgroup(proc_root: Path) -> str:
    try:
        return (proc_root / "self" / "cgroup").read_text()
    except OSError:
        return ""


def _cpu(facts: CpuinfoFacts | None, apple: AppleFacts | None, cgroup_root: Path, self_cg: str) -> CPUInfo:
    # psutil first for counts: it works on every OS; the parsed files fill what it cannot say.
    logical = psutil.cpu_count(logical=True) or (facts.logical_cores if facts else None)
    physical = psutil.cpu_count(logical=False) or (facts.physical_cores if facts else None)
    model = (facts.model_name if facts else None) or (apple.model_name if apple else None)
    if model is None and platform.system() == "Windows":
        model = platform.processor() or None  # on Windows this is the CPU's identifier string
    return CPUInfo(
        model_name=model,
        physical_cores=physical,
        logical_cores=logical,
        usable_cores=usable_cores(cgroup_root=cgroup_root, self_cgroup=self_cg),
        cgroup_quota_cores=cgroup_cpu_quota(cgroup_root, self_cgroup=self_cg),
        flags=(facts.flags if facts else ()) or (apple.flags if apple else ()),
        performance_cores=apple.performance_cores if apple else None,
    )


def _memory(cgroup_root: Path, self_cg: str, linux: bool) -> MemoryInfo:
    vm, sw = psutil.virtual_memory(), swap_now()
    return MemoryInfo(
        total=int(vm.total),
        available=int(vm.available),
        swap_total=sw.total if sw else None,
        swap_free=sw.free if sw else None,
        cgroup_limit=cgroup_memory_limit(cgroup_root, self_cgroup=self_cg) if linux else None,
    )


def read_memory(*, proc_root: Path = Path("/proc"), cgroup_root: Path = CGROUP_ROOT) -> MemoryInfo:
    """RAM as it is now (the static snapshot's figures go stale once engines load)."""
    linux = sys.platform.startswith("linux")
    return _memory(cgroup_root, _self_cgroup(proc_root) if linux else "", linux)


def _vendor_of(text: str) -> Vendor | None:
    t = text.lower()
    return next((vendor for word, vendor in _VENDOR_WORDS if word in t), None)


def gpus_from_engine(devices: tuple[EngineDevice, ...]) -> tuple[GPUInfo, ...]:
    """GPUs as llama.cpp reports them, for machines no vendor probe could read (Vulkan on Windows, say)."""
    gpus = [d for d in devices if d.type in _GPU_TYPES]
    return tuple(
        GPUInfo(
            index=i,
            vendor=_vendor_of(d.description or d.name),
            name=d.description or d.name,
            memory_total=d.memory_total,
            memory_free=d.memory_free,
            memory_used=d.memory_total - d.memory_free
            if d.memory_total is not None and d.memory_free is not None
            else None,
            driver_version=None,
            compute_capability=None,
            unified_memory=d.type == "igpu",
            pci_bus_id=d.device_id,
            source="llama.cpp",
        )
        for i, d in enumerate(gpus)
    )


def probe(
    *,
    sysfs_root: Path = SYSFS_ROOT,
    proc_root: Path = Path("/proc"),
    cgroup_root: Path = CGROUP_ROOT,
    amdgpu_ids: Path = AMDGPU_IDS,
    nvml: Any = None,
    engine: bool = True,
    bandwidth_cache: Path | None = None,
) -> Hardware:
    """Take the snapshot. Every reader that cannot run adds a note instead of raising.

    `nvml` None uses the real pynvml; `engine` False skips asking llama.cpp; `bandwidth_cache` (the
    caller's $SWITCHYARD_HOME/hardware.json) measures memory bandwidth once and reuses it, None skips it."""
    system = platform.system().lower()
    linux, darwin = system == "linux", system == "darwin"
    notes: list[str] = []
    facts = _cpuinfo(proc_root) if linux else None
    apple = apple_facts(read_sysctl()) if darwin else None
    self_cg = _self_cgroup(proc_root) if linux else ""

    gpus: list[GPUInfo] = []
    if not darwin:  # no NVIDIA driver exists for current macOS; asking would only add a noisy note
        nv = read_nvidia(nvml)
        gpus += nv.gpus
        if nv.reason:
            notes.append(nv.reason)
    if linux:
        gpus += read_sysfs_gpus(sysfs_root, amdgpu_ids=amdgpu_ids)
    if apple and apple.gpu:
        gpus.append(apple.gpu)

    devices: tuple[EngineDevice, ...] = ()
    if engine:
        devices, reason = read_engine_devices()
        if reason:
            notes.append(reason)
        if not gpus:
            gpus += gpus_from_engine(devices)

    return Hardware(
        os=system,
        arch=normalise_arch(platform.machine()),
        cpu=_cpu(facts, apple, cgroup_root, self_cg),
        memory=_memory(cgroup_root, self_cg, linux),
        gpus=tuple(gpus),
        engine_devices=devices,
        bandwidth=load_or_measure(bandwidth_cache) if bandwidth_cache is not None else None,
        notes=tuple(notes),
    )
