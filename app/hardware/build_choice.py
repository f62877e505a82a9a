"""Which build of each engine matches this machine: the probe's GPUs and OS turned into a build name.

Builds are `cpu`, `cuda12`, `cuda13`, `rocm`, `vulkan` and `metal`. Pure: the same Hardware always gives
the same answer, with the reason in words, so `engine ls`, `doctor`, `explain` and the Lanes page agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from app.core.public import Public
from app.hardware.model import GPUInfo, Hardware

BUILDS = ("cpu", "cuda12", "cuda13", "rocm", "vulkan", "metal")
# NVIDIA's minimum Linux driver for each CUDA major (the CUDA toolkit release notes' table)
CUDA13_DRIVER = 580
CUDA12_DRIVER = 525


@dataclass(frozen=True)
class Backend(Public):
    """The GPU backend an engine should be built for here, and why."""

    build: str  # one of BUILDS
    reason: str
    gpu: str | None = None  # the GPU it is for, by name


@dataclass(frozen=True)
class BuildChoice(Public):
    """One engine's build: the backend, and the package (or extra) that carries it."""

    engine: str
    build: str
    reason: str
    # the requirement that carries the build (from the engine manifest, passed in); None where not given
    package: str | None = None


@dataclass(frozen=True, kw_only=True)
class BuildRule:
    """Which builds an engine's package comes in, declared by its kind (app/lanes/engines/, which this layer
    sits below) and passed in: a backend it has no build for falls back to the CPU build, saying why."""

    name: str = ""  # how a fallback's reason names the engine
    builds: frozenset[str] = frozenset()  # of BUILDS; empty: one build only
    linux_only: frozenset[str] = frozenset()  # builds published for Linux only (MLX's CUDA wheels)
    # what the engine needs where its CPU build is no real choice (vLLM, SGLang); None: it runs on the CPU
    needs: str | None = None


ONE_BUILD = BuildRule()  # an engine with one build (a voice, sd.cpp, a registered capability build)


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


def _engine_build(rule: BuildRule, hw: Hardware, be: Backend) -> tuple[str, str]:
    """(build, reason) for one engine on `hw`, whose best backend is `be`."""
    if not rule.builds:
        return "cpu", "one build only"
    if be.build in rule.builds and (hw.os == "linux" or be.build not in rule.linux_only):
        return be.build, be.reason
    if rule.needs is not None:
        return "cpu", f"{be.reason}; {rule.name} needs {rule.needs}"
    return _cpu_instead(rule.name, be)


def choose_build(
    engine: str, hw: Hardware, *, rule: BuildRule, packages: Mapping[str, str] | None = None
) -> BuildChoice:
    """The build `engine` (a lane id, whose kind declares `rule`) should use on `hw`; engines with one
    build get `cpu`. `packages` maps a build to the requirement that carries it (the engine manifest's
    `builds`, which this layer cannot read): `package` is that build's entry, else None."""
    build, reason = _engine_build(rule, hw, backend_for(hw))
    return BuildChoice(engine, build, reason, (packages or {}).get(build))
