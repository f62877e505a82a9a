"""The build each engine chooses for recorded probes of CUDA, ROCm, Vulkan, Metal and CPU machines, and
the runtime order (auto, SWITCHYARD_RUNTIME, runtime_order) with each skipped step's reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.core.errors import SettingsError
from app.core.settings import Settings
from app.hardware.build_choice import backend_for, choose_build
from app.hardware.model import CPUInfo, GPUInfo, Hardware, MemoryInfo, Vendor
from app.lanes.engines.registry import engine_kinds
from app.lanes.install.listing import build_packages
from app.lanes.install.releases import ReleaseFetcher
from app.lanes.install.runtimes import choose_runtime, doctor_rows, runtime_order
from app.lanes.install.store import spec_for

GIB = 1 << 30


def gpu(vendor: Vendor, name: str, *, driver: str | None = None, unified: bool = False) -> GPUInfo:
    return GPUInfo(0, vendor, name, 80 * GIB, 79 * GIB, GIB, driver, "9.0" if vendor == "nvidia" else None,
                   unified, None, "nvml" if vendor == "nvidia" else "sysfs")  # fmt: skip


def machine(
    os_name: str, arch: str, *gpus: GPUInfo, cpu: str = "AMD EPYC", flags: tuple[str, ...] = ()
) -> Hardware:
    return Hardware(
        os=os_name,
        arch=arch,
        cpu=CPUInfo(cpu, 8, 16, 16, None, flags),
        memory=MemoryInfo(64 * GIB, 60 * GIB, 0, 0, None),
        gpus=gpus,
        engine_devices=(),
        bandwidth=None,
    )


H200 = machine("linux", "x86_64", gpu("nvidia", "NVIDIA H200", driver="580.65.06"))
A100_OLD = machine("linux", "x86_64", gpu("nvidia", "NVIDIA A100", driver="535.183.01"))
ANCIENT = machine("linux", "x86_64", gpu("nvidia", "GeForce GTX 980", driver="470.256.02"))
MI300 = machine("linux", "x86_64", gpu("amd", "AMD Instinct MI300X"))
ARC = machine("linux", "x86_64", gpu("intel", "Intel Arc A770"))
RADEON_WIN = machine("windows", "x86_64", gpu("amd", "Radeon RX 7900"))
M3 = machine("darwin", "arm64", gpu("apple", "Apple M3 Max", unified=True))
XEON = machine("linux", "x86_64", cpu="Intel(R) Xeon(R) Gold", flags=("avx2",))
PLAIN = machine("linux", "arm64", cpu="Neoverse-N1")

CASES = [  # machine, llama.cpp build, mistral.rs package, MLX package
    (H200, "cuda13", "mistralrs-cuda", "mlx[cuda13]"),
    (A100_OLD, "cuda12", "mistralrs-cuda", "mlx[cuda12]"),
    (ANCIENT, "vulkan", "mistralrs", "mlx[cpu]"),
    (MI300, "rocm", "mistralrs", "mlx[cpu]"),
    (ARC, "vulkan", "mistralrs", "mlx[cpu]"),
    (RADEON_WIN, "vulkan", "mistralrs", "mlx[cpu]"),
    (
        M3,
        "metal",
        "mistralrs",
        "mlx",
    ),  # the plain wheel has Metal on Apple Silicon (mistralrs-metal stops at 0.8)
    (XEON, "cpu", "mistralrs", "mlx[cpu]"),  # and MKL on x86_64
    (PLAIN, "cpu", "mistralrs", "mlx[cpu]"),
]


@pytest.mark.parametrize(("hw", "llama", "mistral", "mlx"), CASES)
def test_each_engine_picks_the_build_for_the_probe(hw: Hardware, llama: str, mistral: str, mlx: str) -> None:
    kinds = engine_kinds()  # each kind declares its builds
    assert choose_build("llama.cpp", hw, rule=kinds["llama.cpp"].build_rule).build == llama
    # the packages come from the manifest's builds table (app/lanes/install/engines.toml)
    for lane, package in (("mistral.rs", mistral), ("mlx", mlx)):
        packages = build_packages(spec_for(lane))
        assert choose_build(lane, hw, rule=kinds[lane].build_rule, packages=packages).package == package
    assert backend_for(hw).reason  # always says why


def test_old_driver_reason_says_what_to_do() -> None:
    why = backend_for(ANCIENT).reason
    assert "470.256.02" in why and "update the driver" in why


def _no_tools(name: str) -> str | None:
    return None


def test_auto_skips_each_step_with_its_reason(tmp_path: Path) -> None:
    s = Settings.flat(runtime="auto")
    choice = choose_runtime(s, H200, env={}, which=_no_tools, fetcher=ReleaseFetcher(tmp_path))
    assert choice.runtime == "xllamacpp" and choice.build == "cpu"
    assert "cuda13" in choice.why  # the wheel is CPU-only, and it says what this machine could run
    reasons = {s.runtime: s.skipped for s in choice.steps}
    assert reasons["docker"] == "docker is not on PATH" and reasons["podman"] == "podman is not on PATH"
    assert "no asset for this platform (linux-x86_64-cuda13)" in str(reasons["bin"])
    assert reasons["path"] == "no executable llama-server on PATH"
    assert reasons["xllamacpp"] is None


def test_bin_not_downloaded_names_pull_only(tmp_path: Path) -> None:
    choice = choose_runtime(
        Settings.flat(runtime="bin"), XEON, env={}, which=_no_tools, fetcher=ReleaseFetcher(tmp_path)
    )
    assert choice.runtime is None
    assert "serve --pull-only" in choice.refusal() and "linux-x86_64-cpu" in choice.refusal()


def test_env_overrides_the_setting_and_order_is_configurable(tmp_path: Path) -> None:
    s = Settings.flat(runtime="auto", runtime_order="xllamacpp,path")
    assert runtime_order(s, {}) == ("xllamacpp", "path")
    assert runtime_order(s, {"SWITCHYARD_RUNTIME": "podman"}) == ("podman",)
    assert runtime_order(Settings.flat(runtime="llama-server"), {}) == ("path",)
    with pytest.raises(SettingsError, match="SWITCHYARD_RUNTIME"):
        runtime_order(s, {"SWITCHYARD_RUNTIME": "qemu"})
    with pytest.raises(SettingsError, match="runtime_order"):
        Settings.flat(runtime_order="docker,kubernetes")


def test_docker_on_a_cpu_machine_is_skipped_in_auto_only(tmp_path: Path) -> None:
    fake = tmp_path / "docker"
    fake.write_text('#!/bin/sh\necho \'{"Runtimes": {"runc": {}}}\'\n')
    fake.chmod(0o755)

    def which(name: str) -> str | None:
        return str(fake) if name == "docker" else None

    f = ReleaseFetcher(tmp_path / "engines")
    auto = choose_runtime(Settings(), XEON, env={}, which=which, fetcher=f)
    assert auto.steps[0].skipped is not None and "CPU build" in auto.steps[0].skipped
    forced = choose_runtime(Settings.flat(runtime="docker"), XEON, env={}, which=which, fetcher=f)
    assert forced.runtime == "docker" and forced.image == "ghcr.io/ggml-org/llama.cpp:server-b7400"
    # a CUDA machine whose docker has no NVIDIA runtime: skipped, saying which toolkit is missing
    if not Path("/etc/cdi/nvidia.yaml").exists():
        cuda = choose_runtime(Settings.flat(runtime="docker"), H200, env={}, which=which, fetcher=f)
        assert cuda.runtime is None and "nvidia-container-toolkit" in cuda.refusal()


def test_doctor_rows_follow_the_order() -> None:
    rows = doctor_rows(Settings.flat(runtime_order="path,xllamacpp,docker"), None)
    assert [r["runtime"] for r in rows] == ["path", "xllamacpp", "docker"]
    assert rows[0]["state"] == "skipped" and rows[1]["state"] == "chosen" and rows[2]["state"] == "not tried"
