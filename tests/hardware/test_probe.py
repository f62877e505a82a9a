"""The hardware probe: every parser on captured outputs, and probe() on this real machine.

The only fake is the NVML module (no NVIDIA card exists here): it answers with values captured from real
cards. sysfs trees are built in tmp_path following the kernel's published layout (class/drm symlinks into
the PCI device tree).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest
import xllamacpp

from app.hardware.apple import apple_facts, parse_sysctl
from app.hardware.cgroup import cgroup_cpu_quota, cgroup_memory_limit, parse_self_cgroup
from app.hardware.cpu import _cgroup_quota_cores, normalise_flags, parse_cpuinfo, usable_cores
from app.hardware.engine import parse_engine_devices, read_engine_devices
from app.hardware.nvidia import read_nvidia, sample_nvidia
from app.hardware.probe import gpus_from_engine, normalise_arch, probe
from app.hardware.sysfs import parse_amdgpu_ids, read_sysfs_gpus, sample_sysfs_gpus

FIX = Path(__file__).resolve().parents[1] / "support" / "fixtures" / "hardware"
MiB = 1 << 20
GiB = 1 << 30


# --------------------------------------------------------------------------- NVML fake (captured values)


@dataclass
class Card:
    name: str | bytes
    total_mib: int
    used_mib: int
    cc: tuple[int, int] | None
    bus_id: str
    util: int = 0


RTX_4090 = Card("NVIDIA GeForce RTX 4090", 24564, 485, (8, 9), "00000000:01:00.0", util=7)
A100_80 = Card(b"NVIDIA A100-SXM4-80GB", 81920, 4, (8, 0), "00000000:07:00.0")
H100_A = Card("NVIDIA H100 80GB HBM3", 81559, 531, (9, 0), "00000000:18:00.0", util=98)
H100_B = Card("NVIDIA H100 80GB HBM3", 81559, 70312, (9, 0), "00000000:2A:00.0", util=41)


@dataclass
class FakeNVML:
    """Answers like pynvml does, raising pynvml's own error classes."""

    cards: list[Card]
    driver: str | bytes = "550.54.15"
    init_error: int | None = None
    lost: set[int] = field(default_factory=set)
    fail_memory_calls: set[int] = field(default_factory=set)  # which nvmlDeviceGetMemoryInfo calls raise
    inits: int = 0
    shutdowns: int = 0
    memory_calls: int = 0
    NVMLError = pynvml.NVMLError

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str | bytes:
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> Card:
        if i in self.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return self.cards[i]

    def nvmlDeviceGetName(self, h: Card) -> str | bytes:
        return h.name

    def nvmlDeviceGetMemoryInfo(self, h: Card) -> SimpleNamespace:
        self.memory_calls += 1
        if self.memory_calls in self.fail_memory_calls:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        total, used = h.total_mib * MiB, h.used_mib * MiB
        return SimpleNamespace(total=total, free=total - used, used=used)

    def nvmlDeviceGetCudaComputeCapability(self, h: Card) -> tuple[int, int]:
        if h.cc is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return h.cc

    def nvmlDeviceGetPciInfo(self, h: Card) -> SimpleNamespace:
        return SimpleNamespace(busId=h.bus_id)

    def nvmlDeviceGetUtilizationRates(self, h: Card) -> SimpleNamespace:
        return SimpleNamespace(gpu=h.util, memory=0)


def test_nvml_one_card() -> None:
    nv = FakeNVML([RTX_4090])
    scan = read_nvidia(nv)
    assert scan.reason is None
    (g,) = scan.gpus
    assert g.vendor == "nvidia" and g.name == "NVIDIA GeForce RTX 4090" and g.index == 0
    assert g.memory_total == 24564 * MiB == 25757220864
    assert g.memory_used == 485 * MiB and g.memory_free == (24564 - 485) * MiB
    assert g.compute_capability == "8.9" and g.driver_version == "550.54.15"
    assert g.pci_bus_id == "00000000:01:00.0" and g.source == "nvml" and g.unified_memory is False
    assert (nv.inits, nv.shutdowns) == (1, 1)  # NVML is released after the snapshot
    json.dumps(g.public())


def test_nvml_two_cards_in_nvml_order() -> None:
    scan = read_nvidia(FakeNVML([H100_A, H100_B]))
    assert [g.index for g in scan.gpus] == [0, 1]
    assert [g.pci_bus_id for g in scan.gpus] == ["00000000:18:00.0", "00000000:2A:00.0"]
    assert all(g.compute_capability == "9.0" and g.memory_total == 85520809984 for g in scan.gpus)
    assert scan.gpus[1].memory_used == 70312 * MiB


def test_nvml_old_bindings_return_bytes() -> None:
    (g,) = read_nvidia(FakeNVML([A100_80], driver=b"535.129.03")).gpus
    assert g.name == "NVIDIA A100-SXM4-80GB" and g.driver_version == "535.129.03"
    assert g.memory_total == 80 * GiB and g.compute_capability == "8.0"


def test_nvml_unsupported_query_is_none_not_failure() -> None:
    card = Card("NVIDIA GeForce RTX 4090", 24564, 485, None, "00000000:01:00.0")
    (g,) = read_nvidia(FakeNVML([card])).gpus
    assert g.compute_capability is None and g.memory_total == 24564 * MiB


def test_nvml_lost_card_is_left_out_and_named() -> None:
    nv = FakeNVML([H100_A, H100_B], lost={1})
    scan = read_nvidia(nv)
    assert [g.pci_bus_id for g in scan.gpus] == ["00000000:18:00.0"]
    assert scan.reason is not None and "GPU 1" in scan.reason and "lost" in scan.reason
    assert nv.shutdowns == 1


def test_nvml_no_driver_gives_reason() -> None:
    nv = FakeNVML([], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    scan = read_nvidia(nv)
    assert scan.gpus == () and scan.reason == "NVML: Driver Not Loaded"
    assert nv.shutdowns == 0  # nothing to shut down when init failed


def test_nvml_real_library_absent_here() -> None:
    """On this machine kind there is no NVIDIA driver: the real pynvml fails init and we say so."""
    scan = read_nvidia()
    if scan.gpus:
        pytest.skip("an NVIDIA driver is present on this machine")
    assert scan.reason is not None and scan.reason.startswith("NVML: ")


def test_nvml_sample() -> None:
    nv = FakeNVML([H100_A, H100_B])
    s = sample_nvidia(nv)
    assert [(x.index, x.memory_used, x.utilization_percent) for x in s] == [
        (0, 531 * MiB, 98),
        (1, 70312 * MiB, 41),
    ]


# --------------------------------------------------------------------------- sysfs (AMD, Intel)


def _pci_card(
    root: Path, card: int, slot: str, files: dict[str, str], card_files: dict[str, str] | None = None
) -> None:
    """The kernel's layout: class/drm/cardN -> devices/.../<slot>/drm/cardN, whose `device` -> the PCI dir."""
    pci = root / "devices" / "pci0000:00" / slot
    drm = pci / "drm" / f"card{card}"
    drm.mkdir(parents=True)
    (drm / "device").symlink_to("../..")
    for rel, text in files.items():
        (pci / rel).parent.mkdir(parents=True, exist_ok=True)
        (pci / rel).write_text(text)
    for rel, text in (card_files or {}).items():
        (drm / rel).write_text(text)
    cls = root / "class" / "drm"
    cls.mkdir(parents=True, exist_ok=True)
    (cls / f"card{card}").symlink_to(drm)
    # a connector and a render node sit beside every card and are not GPUs
    (drm / f"card{card}-DP-1").mkdir()
    (drm / f"card{card}-DP-1" / "status").write_text("disconnected\n")
    (cls / f"card{card}-DP-1").symlink_to(drm / f"card{card}-DP-1")
    (cls / f"renderD{128 + card}").mkdir()


def _uevent(driver: str, pci_id: str, slot: str) -> str:
    return f"DRIVER={driver}\nPCI_CLASS=30000\nPCI_ID={pci_id}\nPCI_SLOT_NAME={slot}\n"


def _amd_files(device: str, revision: str, total: int, used: int, slot: str) -> dict[str, str]:
    return {
        "vendor": "0x1002\n",
        "device": f"{device}\n",
        "revision": f"{revision}\n",
        "mem_info_vram_total": f"{total}\n",
        "mem_info_vram_used": f"{used}\n",
        "mem_info_gtt_total": f"{12 * GiB}\n",
        "gpu_busy_percent": "3\n",
        "uevent": _uevent("amdgpu", f"1002:{device[2:].upper()}", slot),
    }


@pytest.fixture
def amd_sysfs(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    # RX 7900 XTX (discrete, 24 GiB GDDR6) and a Ryzen 7840U's Radeon 780M (512 MiB carve-out)
    _pci_card(root, 0, "0000:03:00.0", _amd_files("0x744c", "0xc8", 25753026560, 1234567168, "0000:03:00.0"))
    _pci_card(root, 1, "0000:c4:00.0", _amd_files("0x15bf", "0xc1", 536870912, 100663296, "0000:c4:00.0"))
    # an NVIDIA card in the same box is NVML's business, not sysfs's
    _pci_card(root, 2, "0000:41:00.0", {"vendor": "0x10de\n", "device": "0x2684\n"})
    return root


def test_amd_discrete_and_igpu(amd_sysfs: Path) -> None:
    d, i = read_sysfs_gpus(amd_sysfs, amdgpu_ids=FIX / "amdgpu.ids")
    assert (d.vendor, d.name, d.index, d.source) == ("amd", "AMD Radeon RX 7900 XTX", 0, "sysfs")
    assert d.memory_total == 25753026560 and d.memory_used == 1234567168
    assert d.memory_free == 25753026560 - 1234567168
    assert d.unified_memory is False and d.pci_bus_id == "0000:03:00.0"
    assert d.compute_capability is None and d.driver_version is None  # in-tree amdgpu has no version
    assert (i.name, i.index, i.memory_total, i.unified_memory) == (
        "AMD Radeon 780M Graphics",
        1,
        536870912,
        True,
    )


def test_amd_product_name_and_dkms_version(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    files = _amd_files("0x740f", "0x02", 68702699520, 10960896, "0000:83:00.0")
    files["product_name"] = "AMD Instinct MI210\n"
    _pci_card(root, 0, "0000:83:00.0", files)
    (root / "module" / "amdgpu").mkdir(parents=True)
    (root / "module" / "amdgpu" / "version").write_text("6.3.6\n")
    (g,) = read_sysfs_gpus(root, amdgpu_ids=tmp_path / "no-libdrm")
    assert g.name == "AMD Instinct MI210" and g.memory_total == 68702699520 and g.driver_version == "6.3.6"


def test_amd_unknown_name_says_device_id(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    _pci_card(root, 0, "0000:03:00.0", _amd_files("0x7550", "0xc0", 17163091968, 0, "0000:03:00.0"))
    (g,) = read_sysfs_gpus(root, amdgpu_ids=FIX / "amdgpu.ids")
    assert g.name == "AMD GPU 7550" and g.memory_free == 17163091968


def test_amdgpu_ids_parser() -> None:
    ids = parse_amdgpu_ids((FIX / "amdgpu.ids").read_text())
    assert ids[(0x744C, 0xC8)] == "AMD Radeon RX 7900 XTX" and ids[(0x744C, 0xCC)] == "AMD Radeon RX 7900 XT"
    assert len(ids) == 4  # comments and the version line are not entries


def test_intel_xe_discrete_and_igpu(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    arc = {
        "vendor": "0x8086\n",
        "device": "0x56a0\n",
        "tile0/physical_vram_size_bytes": "0x400000000\n",  # xe writes hex: 16 GiB
        "uevent": _uevent("xe", "8086:56A0", "0000:03:00.0"),
    }
    igpu = {
        "vendor": "0x8086\n",
        "device": "0x46a6\n",
        "uevent": _uevent("i915", "8086:46A6", "0000:00:02.0"),
    }
    _pci_card(root, 0, "0000:00:02.0", igpu)
    _pci_card(root, 1, "0000:03:00.0", arc)
    i, a = read_sysfs_gpus(root, amdgpu_ids=tmp_path / "none")
    assert (i.vendor, i.unified_memory, i.memory_total, i.pci_bus_id) == ("intel", True, None, "0000:00:02.0")
    assert (a.vendor, a.unified_memory, a.memory_total, a.index) == ("intel", False, 16 * GiB, 1)
    assert a.name == "Intel GPU 56a0"


def test_intel_i915_discrete(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    a770 = {
        "vendor": "0x8086\n",
        "device": "0x56a0\n",
        "uevent": _uevent("i915", "8086:56A0", "0000:03:00.0"),
    }
    _pci_card(root, 0, "0000:03:00.0", a770, card_files={"lmem_total_bytes": f"{16 * GiB}\n"})
    _pci_card(root, 1, "0000:04:00.0", a770 | {"uevent": _uevent("i915", "8086:56A0", "0000:04:00.0")})
    dkms, mainline = read_sysfs_gpus(root, amdgpu_ids=tmp_path / "none")
    assert dkms.memory_total == 16 * GiB and dkms.unified_memory is False
    # mainline i915 publishes no size: unknown, and still not mistaken for an iGPU
    assert mainline.memory_total is None and mainline.unified_memory is False


def test_sysfs_absent_tree(tmp_path: Path) -> None:
    assert read_sysfs_gpus(tmp_path / "nothing") == ()


def test_sysfs_sample(amd_sysfs: Path) -> None:
    s = sample_sysfs_gpus(amd_sysfs)
    assert [(x.index, x.memory_used, x.utilization_percent) for x in s] == [
        (0, 1234567168, 3),
        (1, 100663296, 3),
    ]


# --------------------------------------------------------------------------- Apple sysctl


def test_apple_m2_pro_named_output() -> None:
    f = apple_facts(parse_sysctl((FIX / "sysctl_apple_m2_pro.txt").read_text()))
    assert f.model_name == "Apple M2 Pro" and f.memory_total == 32 * GiB
    assert (f.physical_cores, f.performance_cores, f.efficiency_cores) == (12, 8, 4)
    assert f.flags == ("bf16", "dotprod", "fp16", "i8mm", "neon")  # FEAT_SME: 0 is not a feature
    g = f.gpu
    assert g is not None and g.vendor == "apple" and g.unified_memory and g.memory_total == 32 * GiB
    assert g.source == "sysctl" and g.memory_free is None


def test_apple_sysctl_n_positional() -> None:
    keys = ["hw.memsize", "machdep.cpu.brand_string", "hw.perflevel0.physicalcpu"]
    values = parse_sysctl((FIX / "sysctl_n_apple_m1.txt").read_text(), keys=keys)
    f = apple_facts(values)
    assert f.model_name == "Apple M1" and f.performance_cores == 4 and f.memory_total == 16 * GiB
    assert f.gpu is not None and f.gpu.memory_total == 16 * GiB and "neon" in f.flags


def test_intel_mac_has_no_apple_gpu() -> None:
    f = apple_facts(parse_sysctl((FIX / "sysctl_intel_mac.txt").read_text()))
    assert f.gpu is None and f.flags == ("avx", "avx2") and f.logical_cores == 12
    assert f.performance_cores is None


# --------------------------------------------------------------------------- /proc/cpuinfo


def test_cpuinfo_x86_captured_here() -> None:
    f = parse_cpuinfo((FIX / "cpuinfo_x86_amd_epyc_kvm.txt").read_text())
    assert f.model_name == "AMD EPYC" and (f.physical_cores, f.logical_cores) == (2, 2)
    assert {"avx2", "avx512", "avx512_vnni", "fma"} <= set(f.flags) and "neon" not in f.flags


def test_cpuinfo_x86_hyperthreads() -> None:
    f = parse_cpuinfo((FIX / "cpuinfo_x86_intel_i3_7100u_ht.txt").read_text())
    assert f.model_name == "Intel(R) Core(TM) i3-7100U CPU @ 2.40GHz"
    assert (f.physical_cores, f.logical_cores) == (2, 4)
    assert "avx2" in f.flags and "avx512" not in f.flags


def test_cpuinfo_arm64_graviton3() -> None:
    f = parse_cpuinfo((FIX / "cpuinfo_arm64_graviton3.txt").read_text())
    assert f.model_name == "Neoverse-V1" and f.logical_cores == 2 and f.physical_cores is None
    assert f.flags == ("bf16", "dotprod", "fp16", "i8mm", "neon", "sve")


def test_cpuinfo_arm64_rpi_no_dotprod() -> None:
    f = parse_cpuinfo((FIX / "cpuinfo_arm64_rpi4.txt").read_text())
    assert f.model_name == "Cortex-A72" and f.logical_cores == 4 and f.flags == ("neon",)


def test_cpuinfo_garbage() -> None:
    f = parse_cpuinfo("no colons here\n\n")
    assert (f.model_name, f.physical_cores, f.logical_cores, f.flags) == (None, None, None, ())


def test_flag_normalisation_drops_noise() -> None:
    assert normalise_flags(["fpu", "avx512f", "avx512bw", "amx_tile", "asimddp"]) == (
        "amx",
        "avx512",
        "avx512bw",
        "dotprod",
    )


# --------------------------------------------------------------------------- cgroups


def _files(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_cgroup_v2_container(tmp_path: Path) -> None:
    root = _files(tmp_path / "cg", {"cgroup.controllers": "cpu memory\n", "cpu.max": "150000 100000\n"})
    _files(root, {"memory.max": "4294967296\n"})
    assert cgroup_cpu_quota(root, self_cgroup="0::/\n") == 1.5
    assert cgroup_memory_limit(root, self_cgroup="0::/\n") == 4 * GiB
    # 1.5 cores of quota: one thread, not two
    assert usable_cores(cgroup_root=root, self_cgroup="0::/\n") == 1
    assert _cgroup_quota_cores(root) == 1.5  # the old single-directory reader still answers


def test_cgroup_v2_unlimited(tmp_path: Path) -> None:
    root = _files(tmp_path / "cg", {"cpu.max": "max 100000\n", "memory.max": "max\n"})
    assert cgroup_cpu_quota(root, self_cgroup="0::/\n") is None
    assert cgroup_memory_limit(root, self_cgroup="0::/\n") is None
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert usable_cores(cgroup_root=root, self_cgroup="0::/\n") == affinity


def test_cgroup_v2_nested_limit_on_ancestor(tmp_path: Path) -> None:
    root = _files(
        tmp_path / "cg",
        {"user.slice/memory.max": "8589934592\n", "user.slice/app.scope/memory.max": "max\n"},
    )
    assert cgroup_memory_limit(root, self_cgroup="0::/user.slice/app.scope\n") == 8 * GiB


def test_cgroup_v1_hierarchy(tmp_path: Path) -> None:
    root = _files(
        tmp_path / "cg",
        {
            "memory/memory.limit_in_bytes": "9223372036854771712\n",  # v1's "unlimited"
            "memory/docker/abc/memory.limit_in_bytes": "2147483648\n",
            "cpu/cpu.cfs_quota_us": "-1\n",
            "cpu/cpu.cfs_period_us": "100000\n",
            "cpu/docker/abc/cpu.cfs_quota_us": "50000\n",
            "cpu/docker/abc/cpu.cfs_period_us": "100000\n",
        },
    )
    me = "11:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n"
    assert cgroup_memory_limit(root, self_cgroup=me) == 2 * GiB
    assert cgroup_cpu_quota(root, self_cgroup=me) == 0.5
    assert usable_cores(cgroup_root=root, self_cgroup=me) == 1
    # without the process's path only the (unlimited) root is seen
    assert cgroup_memory_limit(root, self_cgroup="") is None


def test_cgroup_v1_container_without_namespace(tmp_path: Path) -> None:
    """Docker on v1 mounts the container's own cgroup at the root; /proc/self/cgroup names the host path."""
    root = _files(tmp_path / "cg", {"memory/memory.limit_in_bytes": "1073741824\n"})
    assert cgroup_memory_limit(root, self_cgroup="11:memory:/docker/0123abcd\n") == GiB


def test_self_cgroup_captured_here() -> None:
    paths = parse_self_cgroup((FIX / "proc_self_cgroup_v1_hybrid.txt").read_text())
    assert paths["memory"] == "/process_api/ae4b491da76f4b602dd04de4228a5f1d"
    assert paths["cpu"] == "/" and paths[""] == "/" and paths["systemd"] == "/"


def test_cgroup_garbage(tmp_path: Path) -> None:
    root = _files(tmp_path / "cg", {"memory.max": "lots\n", "cpu.max": "x y\n"})
    assert (
        cgroup_memory_limit(root, self_cgroup="") is None and cgroup_cpu_quota(root, self_cgroup="") is None
    )


# --------------------------------------------------------------------------- llama.cpp devices


def _dev_type(name: str) -> Any:
    # the real enum xllamacpp returns, taken from the CPU entry this machine reports
    enum = type(xllamacpp.get_device_info()[0]["type"])
    return enum.__members__[f"GGML_BACKEND_DEVICE_TYPE_{name}"]


def test_engine_devices_parser() -> None:
    raw = [
        {
            "name": "CPU",
            "description": "AMD EPYC",
            "memory_free": 25275990016,
            "memory_total": 25275990016,
            "type": _dev_type("CPU"),
            "device_id": "",
            "caps": {"async": False},
        },
        {
            "name": "CUDA0",
            "description": "NVIDIA GeForce RTX 4090",
            "memory_free": 25248661504,
            "memory_total": 25757220864,
            "type": _dev_type("GPU"),
            "device_id": "0000:01:00.0",
        },
        {"description": "nameless entries are skipped"},
    ]
    cpu, cuda = parse_engine_devices(raw)
    assert (cpu.name, cpu.type, cpu.memory_total, cpu.device_id) == ("CPU", "cpu", 25275990016, None)
    assert (cuda.type, cuda.device_id, cuda.memory_free) == ("gpu", "0000:01:00.0", 25248661504)
    (g,) = gpus_from_engine((cpu, cuda))
    assert (g.vendor, g.name, g.source, g.memory_used) == (
        "nvidia",
        "NVIDIA GeForce RTX 4090",
        "llama.cpp",
        508559360,
    )


def test_engine_devices_int_types_and_bad_memory() -> None:
    (d,) = parse_engine_devices([{"name": "Vulkan0", "type": 2, "memory_free": -1, "memory_total": "big"}])
    assert d.type == "igpu" and d.memory_free is None and d.memory_total is None


def test_engine_devices_real() -> None:
    devices, reason = read_engine_devices()
    assert reason is None
    cpu = next(d for d in devices if d.type == "cpu")
    assert cpu.name == "CPU" and cpu.memory_total is not None and cpu.memory_total > 0


# --------------------------------------------------------------------------- probe()


def test_probe_this_machine() -> None:
    h = probe()
    assert h.os == "linux" and h.arch == normalise_arch(os.uname().machine)
    assert h.cpu.logical_cores is not None and h.cpu.logical_cores > 0
    assert h.cpu.physical_cores is not None and 0 < h.cpu.physical_cores <= h.cpu.logical_cores
    assert 1 <= h.cpu.usable_cores <= h.cpu.logical_cores
    assert h.cpu.model_name
    with open("/proc/meminfo") as f:
        mem_total_kib = int(f.readline().split()[1])
    assert h.memory.total == mem_total_kib * 1024
    assert h.memory.available is not None and 0 < h.memory.available <= h.memory.total
    assert any(d.type == "cpu" for d in h.engine_devices)
    # this machine kind has no GPU: nothing in /sys/class/drm and no NVIDIA driver
    if not Path("/sys/class/drm").exists() and read_nvidia().reason:
        assert h.gpus == ()
        assert any(n.startswith("NVML: ") for n in h.notes)
    assert h.bandwidth is None  # not asked for
    doc = json.loads(json.dumps(h.public()))
    assert doc["cpu"]["usable_cores"] == h.cpu.usable_cores and doc["gpus"] == [g.public() for g in h.gpus]


def test_probe_combines_readers(tmp_path: Path, amd_sysfs: Path) -> None:
    proc = _files(
        tmp_path / "proc",
        {"cpuinfo": (FIX / "cpuinfo_arm64_graviton3.txt").read_text(), "self/cgroup": "0::/\n"},
    )
    cg = _files(tmp_path / "cg", {"cpu.max": "100000 100000\n", "memory.max": "3221225472\n"})
    h = probe(
        sysfs_root=amd_sysfs,
        proc_root=proc,
        cgroup_root=cg,
        amdgpu_ids=FIX / "amdgpu.ids",
        nvml=FakeNVML([RTX_4090]),
        engine=False,
    )
    assert [(g.vendor, g.index, g.source) for g in h.gpus] == [
        ("nvidia", 0, "nvml"),
        ("amd", 0, "sysfs"),
        ("amd", 1, "sysfs"),
    ]
    assert h.cpu.model_name == "Neoverse-V1" and "sve" in h.cpu.flags
    assert h.cpu.cgroup_quota_cores == 1.0 and h.cpu.usable_cores == 1
    assert h.memory.cgroup_limit == 3 * GiB and h.memory.effective_total == min(3 * GiB, h.memory.total or 0)
    assert h.engine_devices == () and h.notes == ()


def test_probe_measures_bandwidth_into_cache(tmp_path: Path) -> None:
    cache = tmp_path / "home" / "hardware.json"
    h = probe(engine=False, bandwidth_cache=cache)
    assert h.bandwidth is not None and h.bandwidth.single_core > 0
    assert json.loads(cache.read_text())["bandwidth"]["single_core"] == h.bandwidth.single_core
