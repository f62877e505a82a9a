"""AMD and Intel GPUs from Linux sysfs (`/sys/class/drm/cardN/device/...`). NVIDIA is left to NVML.

amdgpu publishes `mem_info_vram_total` / `mem_info_vram_used` and, on server boards, `product_name`; the
marketing name of a consumer card lives in libdrm's `amdgpu.ids` table (device id, revision -> name).
Intel xe publishes `tileN/physical_vram_size_bytes` (hex); Intel's out-of-tree i915 publishes
`lmem_total_bytes` on the card; mainline i915 publishes no memory size at all (None, never 0).
"""

from __future__ import annotations

import re
from pathlib import Path

from app.hardware.model import GPUInfo, GPUSample, Vendor

SYSFS_ROOT = Path("/sys")
AMDGPU_IDS = Path("/usr/share/libdrm/amdgpu.ids")
_VENDORS: dict[str, Vendor] = {"0x1002": "amd", "0x8086": "intel"}
_CARD = re.compile(r"card(\d+)$")
# An AMD iGPU's "VRAM" is a firmware carve-out of system RAM, typically 512 MiB; amdgpu has no APU flag
# in sysfs, so a carve-out under 1 GiB is taken as an iGPU (the same rule Ollama uses).
_AMD_IGPU_VRAM_BELOW = 1 << 30


def _read(path: Path) -> str | None:
    try:
        text = path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text or None


def _read_int(path: Path) -> int | None:
    text = _read(path)
    try:
        return int(text, 0) if text is not None else None  # base 0: xe writes hex with 0x
    except ValueError:
        return None


def parse_amdgpu_ids(text: str) -> dict[tuple[int, int], str]:
    """libdrm's amdgpu.ids: `DEVICE,\tREVISION,\tName` lines -> {(device, revision): name}."""
    out: dict[tuple[int, int], str] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",", 2)]
        if len(parts) != 3 or line.startswith("#"):
            continue
        try:
            out[(int(parts[0], 16), int(parts[1], 16))] = parts[2]
        except ValueError:
            continue  # the version line and anything malformed
    return out


def _uevent(dev: Path) -> dict[str, str]:
    text = _read(dev / "uevent") or ""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def _cards(root: Path) -> list[tuple[int, Path, Vendor]]:
    drm = root / "class" / "drm"
    try:
        entries = list(drm.iterdir())
    except OSError:
        return []
    cards = []
    for entry in entries:
        m = _CARD.match(entry.name)  # skips connectors (card0-DP-1) and render nodes
        vendor = _VENDORS.get((_read(entry / "device" / "vendor") or "").lower()) if m else None
        if m and vendor:
            cards.append((int(m.group(1)), entry, vendor))
    return sorted(cards)


def _amd(index: int, card: Path, names: dict[tuple[int, int], str], driver: str | None) -> GPUInfo:
    dev = card / "device"
    total = _read_int(dev / "mem_info_vram_total")
    used = _read_int(dev / "mem_info_vram_used")
    device, revision = _read_int(dev / "device"), _read_int(dev / "revision")
    known = names.get((device, revision)) if device is not None and revision is not None else None
    name = _read(dev / "product_name") or known
    return GPUInfo(
        index=index,
        vendor="amd",
        name=name or f"AMD GPU {device or 0:04x}",
        memory_total=total,
        memory_free=total - used if total is not None and used is not None else None,
        memory_used=used,
        driver_version=driver,
        compute_capability=None,
        unified_memory=total is not None and total < _AMD_IGPU_VRAM_BELOW,
        pci_bus_id=_uevent(dev).get("PCI_SLOT_NAME"),
        source="sysfs",
    )


def _intel_vram(card: Path) -> int | None:
    dev = card / "device"
    tiles = sorted(dev.glob("tile[0-9]*"))
    sizes = [
        _read_int(t / "physical_vram_size_bytes") or _read_int(t / "memory" / "physical_vram_size_bytes")
        for t in tiles
    ]
    if tiles and all(s is not None for s in sizes):
        return sum(s for s in sizes if s is not None)
    return _read_int(card / "lmem_total_bytes") or _read_int(dev / "lmem_total_bytes")


def _intel(index: int, card: Path) -> GPUInfo:
    dev = card / "device"
    slot = _uevent(dev).get("PCI_SLOT_NAME")
    vram = _intel_vram(card)
    device = _read_int(dev / "device")
    # Intel's integrated graphics is always PCI device 00:02.0; a discrete card on mainline i915 shows
    # no memory file, so the slot, not a missing size, decides.
    integrated = slot.endswith(":00:02.0") if slot else vram is None
    return GPUInfo(
        index=index,
        vendor="intel",
        name=f"Intel GPU {device or 0:04x}",
        memory_total=None if integrated else vram,
        memory_free=None,
        memory_used=None,
        driver_version=None,
        compute_capability=None,
        unified_memory=integrated,
        pci_bus_id=slot,
        source="sysfs",
    )


def read_sysfs_gpus(root: Path = SYSFS_ROOT, *, amdgpu_ids: Path = AMDGPU_IDS) -> tuple[GPUInfo, ...]:
    """AMD and Intel GPUs under `root`/class/drm, in card order; empty where there is no such tree."""
    names = parse_amdgpu_ids(_read(amdgpu_ids) or "")
    amd_driver = _read(root / "module" / "amdgpu" / "version")  # only the DKMS (ROCm) module has one
    out: list[GPUInfo] = []
    counts: dict[Vendor, int] = {}
    for _, card, vendor in _cards(root):
        i = counts.get(vendor, 0)
        counts[vendor] = i + 1
        out.append(_amd(i, card, names, amd_driver) if vendor == "amd" else _intel(i, card))
    return tuple(out)


def sample_sysfs_gpus(root: Path = SYSFS_ROOT) -> tuple[GPUSample, ...]:
    """VRAM used and busy percent of AMD cards, for the monitor (Intel publishes neither)."""
    out = []
    amd = [card for _, card, vendor in _cards(root) if vendor == "amd"]
    for i, card in enumerate(amd):
        dev = card / "device"
        out.append(
            GPUSample(
                index=i,
                vendor="amd",
                memory_used=_read_int(dev / "mem_info_vram_used"),
                memory_total=_read_int(dev / "mem_info_vram_total"),
                utilization_percent=_read_int(dev / "gpu_busy_percent"),
            )
        )
    return tuple(out)
