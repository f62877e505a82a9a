"""The hardware facts as small frozen dataclasses. Bytes are ints; a fact we could not read is None."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from app.core.public import Public

Vendor = Literal["nvidia", "amd", "intel", "apple"]
GPUSource = Literal["nvml", "sysfs", "sysctl", "llama.cpp"]


@dataclass(frozen=True)
class CPUInfo:
    model_name: str | None
    physical_cores: int | None
    logical_cores: int | None
    usable_cores: int  # affinity mask and cgroup quota applied: what a thread pool should use
    cgroup_quota_cores: float | None  # None when no quota is set or it could not be read
    flags: tuple[str, ...]  # normalised ISA features we route on: avx2, avx512, neon, dotprod, ...
    # Apple Silicon's P-cores (hw.perflevel0); llama.cpp runs faster on these alone than on all cores.
    performance_cores: int | None = None

    def public(self) -> dict[str, Any]:
        d = asdict(self)
        d["flags"] = list(self.flags)
        return d


@dataclass(frozen=True)
class MemoryInfo:
    total: int | None
    available: int | None
    swap_total: int | None
    swap_free: int | None
    cgroup_limit: int | None  # None when unlimited or unknown

    @property
    def effective_total(self) -> int | None:
        """What this process may really fill: RAM, capped by a cgroup limit when one is set."""
        known = [v for v in (self.total, self.cgroup_limit) if v is not None]
        return min(known) if known else None

    def public(self) -> dict[str, Any]:
        return {**asdict(self), "effective_total": self.effective_total}


@dataclass(frozen=True)
class GPUInfo(Public):
    """One GPU. `index` is the vendor's own enumeration order (NVML order for NVIDIA, the DRM card order
    for sysfs). On unified-memory devices the memory figures are what the driver publishes (Apple: all RAM);
    the RAM itself is in MemoryInfo."""

    index: int
    vendor: Vendor | None
    name: str
    memory_total: int | None
    memory_free: int | None
    memory_used: int | None
    driver_version: str | None
    compute_capability: str | None  # NVIDIA only, "8.9"
    unified_memory: bool
    pci_bus_id: str | None
    source: GPUSource
    # bytes/s the card's memory reads at its top clock (NVIDIA: NVML's bus width and memory clock, double
    # data rate); None where the driver does not say (every other vendor, for now)
    memory_bandwidth: float | None = None


@dataclass(frozen=True)
class GPUScan:
    """What one GPU reader found, and why it found nothing when that is the case."""

    gpus: tuple[GPUInfo, ...]
    reason: str | None = None


@dataclass(frozen=True)
class EngineDevice(Public):
    """A device as llama.cpp (ggml) sees it, from `xllamacpp.get_device_info()`."""

    name: str  # backend device name: "CPU", "CUDA0", "Metal", "Vulkan0"
    description: str
    type: str  # "cpu", "gpu", "igpu", "accel"
    memory_free: int | None
    memory_total: int | None
    device_id: str | None = None  # PCI bus id where ggml reports one


@dataclass(frozen=True)
class Bandwidth(Public):
    """Memory copy bandwidth, counting bytes read plus bytes written (the STREAM "copy" convention)."""

    single_core: int  # bytes/s, one thread
    all_cores: int  # bytes/s, `threads` threads at once
    threads: int
    measured_at: float  # unix time


@dataclass(frozen=True)
class GPUSample(Public):
    """One GPU in a monitor sample."""

    index: int
    vendor: Vendor
    memory_used: int | None
    memory_total: int | None
    utilization_percent: int | None


@dataclass(frozen=True)
class Hardware:
    os: str  # "linux", "darwin", "windows"
    arch: str  # "x86_64", "arm64"
    cpu: CPUInfo
    memory: MemoryInfo
    gpus: tuple[GPUInfo, ...]
    engine_devices: tuple[EngineDevice, ...]
    bandwidth: Bandwidth | None
    notes: tuple[str, ...] = ()  # why a fact is missing: "NVML: NVML Shared Library Not Found"

    def public(self) -> dict[str, Any]:
        return {
            "os": self.os,
            "arch": self.arch,
            "cpu": self.cpu.public(),
            "memory": self.memory.public(),
            "gpus": [g.public() for g in self.gpus],
            "engine_devices": [d.public() for d in self.engine_devices],
            "bandwidth": self.bandwidth.public() if self.bandwidth else None,
            "notes": list(self.notes),
        }
