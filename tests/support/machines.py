"""Hardware values for tests that plan memory or choose lanes: a machine with so much RAM and such cards,
an NVIDIA card as NVML reports it, and an integrated GPU that shares the RAM. Every figure a test reads
is a parameter; the rest is a plain desktop (x86_64 Linux, 8 cores / 16 threads, 20 GB/s per core)."""

from __future__ import annotations

from app.hardware.model import Bandwidth, CPUInfo, GPUInfo, GPUSource, Hardware, MemoryInfo, Vendor

GIB = 1 << 30
MIB = 1 << 20


def machine(
    *,
    ram_gib: float,
    gpus: tuple[GPUInfo, ...] = (),
    os_: str = "linux",
    available_gib: float | None = None,
    cores: int = 8,
    threads: int = 16,
    all_cores_gib: int = 80,
) -> Hardware:
    """`ram_gib` of RAM (all of it available unless `available_gib` says less), `gpus`, and a bandwidth
    of 20 GiB/s on one core and `all_cores_gib` GiB/s on all `threads`."""
    ram = int(ram_gib * GIB)
    available = ram if available_gib is None else int(available_gib * GIB)
    return Hardware(
        os=os_,
        arch="x86_64",
        cpu=CPUInfo(
            model_name="test cpu",
            physical_cores=cores,
            logical_cores=threads,
            usable_cores=threads,
            cgroup_quota_cores=None,
            flags=("avx2",),
        ),
        memory=MemoryInfo(total=ram, available=available, swap_total=0, swap_free=0, cgroup_limit=None),
        gpus=gpus,
        engine_devices=(),
        bandwidth=Bandwidth(
            single_core=20 * GIB, all_cores=all_cores_gib * GIB, threads=threads, measured_at=0.0
        ),
    )


def nvidia(
    mib: int,
    name: str = "NVIDIA GeForce RTX 4090",
    *,
    cc: str = "8.9",
    index: int = 0,
    free_mib: int | None = None,
) -> GPUInfo:
    """An NVIDIA card of `mib` MiB as NVML reports it, `free_mib` free (400 MiB in use by default)."""
    free = mib - 400 if free_mib is None else free_mib
    return GPUInfo(
        index=index,
        vendor="nvidia",
        name=name,
        memory_total=mib * MIB,
        memory_free=free * MIB,
        memory_used=(mib - free) * MIB,
        driver_version="550.54.15",
        compute_capability=cc,
        unified_memory=False,
        pci_bus_id=f"00000000:{index + 1:02d}:00.0",
        source="nvml",
    )


def unified_gpu(vendor: Vendor, name: str, *, source: GPUSource, pci_bus_id: str | None = None) -> GPUInfo:
    """An integrated GPU (Apple's, Intel's) that uses the RAM: no memory figures of its own."""
    return GPUInfo(
        index=0,
        vendor=vendor,
        name=name,
        memory_total=None,
        memory_free=None,
        memory_used=None,
        driver_version=None,
        compute_capability=None,
        unified_memory=True,
        pci_bus_id=pci_bus_id,
        source=source,
    )
