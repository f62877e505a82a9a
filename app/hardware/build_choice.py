"""Which build of each engine matches this machine: the probe's GPUs and OS turned into a build name.

Builds are `cpu`, `cuda12`, `cuda13`, `rocm`, `vulkan` and `metal`. Pure: the same Hardware always gives
the same answer, with the reason in words, so `engine ls`, `doctor`, `explain` and the Lanes page agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from app.hardware.model import GPUInfo, Hardware

BUILDS = ("cpu", "cuda12", "cuda13", "rocm", "vulkan", "metal")
# NVIDIA's minimum Linux driver for each CUDA major (the CUDA toolkit release notes' table)
CUDA13_DRIVER = 580
CUDA12_DRIVER = 525


@dataclass(frozen=True)
class Backend:
    """The GPU backend an engine should be built for here, and why."""

    build: str  # one of BUILDS
    reason: str
    gpu: str | None = None  # the GPU it is for, by name

    def public(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class BuildChoice:
    """One engine's build: the backend, and the package (or extra) that carries it."""

    engine: str
    build: str
    reason: str
    # the requirement that carries the build (from the engine manifest, passed in); None where not given
    package: str | None = None

    def public(self) -> dict[str, Any]:
        return asdict(self)


def _driver_major(gpu: GPUInfo) -> int | None:
    try:
        return int((gpu.driver_version or "").split(".", 1)[0])
    except ValueError:
        return None


def _nvidia(gpu: GPUInfo) -> Backend:
    major = _driver_major(gpu)
    if major is None:
        return Backend("cuda12", f"{gpu.name}: driver version unknown, assuming CUDA 12", gpu.name)
    if major >= CUDA13_DRIVER:
        return Backend("cuda13", f"{gpu.name}: driver {gpu.driver_version} runs CUDA 13", gpu.name)
    if major >= CUDA12_DRIVER:
        return Backend("cuda12", f"{gpu.name}: driver {gpu.driver_version} runs CUDA 12", gpu.name)
    return Backend(
        "vulkan",
        f"{gpu.name}: driver {gpu.driver_version} is older than CUDA 12 needs ({CUDA12_DRIVER}); "
        "Vulkan instead (update the driver for CUDA)",
        gpu.name,
    )


def backend_for(hw: Hardware) -> Backend:
    """The best backend this machine's first capable GPU supports, else the CPU."""
    if hw.os == "darwin" and hw.arch == "arm64":
        return Backend("metal", "Apple Silicon: Metal", "Apple GPU")
    by_vendor = {g.vendor: g for g in reversed(hw.gpus)}  # the first GPU of each vendor
    if (nv := by_vendor.get("nvidia")) is not None:
        return _nvidia(nv)
    if (amd := by_vendor.get("amd")) is not None:
        if hw.os == "linux" and not amd.unified_memory:
            return Backend("rocm", f"{amd.name}: AMD GPU on Linux, ROCm (HIP)", amd.name)
        return Backend("vulkan", f"{amd.name}: AMD GPU, Vulkan", amd.name)
    if (intel := by_vendor.get("intel")) is not None:
        return Backend("vulkan", f"{intel.name}: Intel GPU, Vulkan", intel.name)
    return Backend("cpu", "no GPU found: CPU build")


def _cpu_instead(engine: str, be: Backend) -> tuple[str, str]:
    return "cpu", be.reason if be.build == "cpu" else f"{be.reason}; {engine} has no {be.build} build: CPU"


def _engine_build(engine: str, hw: Hardware, be: Backend) -> tuple[str, str]:
    """(build, reason) for one engine on `hw`, whose best backend is `be`."""
    if engine == "llama.cpp":
        return be.build, be.reason
    if engine == "mistral.rs":
        ok = be.build.startswith("cuda") or be.build == "metal"
        return (be.build, be.reason) if ok else _cpu_instead("mistral.rs", be)
    if engine == "mlx":  # MLX's CUDA builds are Linux wheels only
        ok = be.build == "metal" or (hw.os == "linux" and be.build in ("cuda12", "cuda13"))
        return (be.build, be.reason) if ok else _cpu_instead("MLX", be)
    if engine in ("vllm", "sglang"):
        if be.build.startswith("cuda") or be.build == "rocm":
            return be.build, be.reason
        return "cpu", f"{be.reason}; {engine} needs a CUDA or ROCm GPU"
    return "cpu", "one build only"


def choose_build(engine: str, hw: Hardware, *, packages: Mapping[str, str] | None = None) -> BuildChoice:
    """The build `engine` (a lane id) should use on `hw`; engines with one build get `cpu`. `packages`
    maps a build to the requirement that carries it (the engine manifest's `builds`, which this layer
    cannot read): `package` is that build's entry, else None."""
    build, reason = _engine_build(engine, hw, backend_for(hw))
    return BuildChoice(engine, build, reason, (packages or {}).get(build))
