"""CPU cores this process may really use (affinity mask and cgroup quota, not just the count), and what
/proc/cpuinfo says about the CPU: model name, core counts and the ISA features engines care about."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from app.hardware.cgroup import CGROUP_ROOT, cgroup_cpu_quota

# Linux flag names (x86 `flags`, arm64 `Features`) -> the names we route on. Only features that change
# which kernels an engine can use are kept; the rest of the flag soup is noise to a user.
_X86_FLAGS = {
    "sse4_2": "sse4_2",
    "avx": "avx",
    "avx2": "avx2",
    "fma": "fma",
    "f16c": "f16c",
    "avx512f": "avx512",
    "avx512bw": "avx512bw",
    "avx512vl": "avx512vl",
    "avx512_vnni": "avx512_vnni",
    "avx512_bf16": "avx512_bf16",
    "avx512_fp16": "avx512_fp16",
    "avx_vnni": "avx_vnni",
    "amx_tile": "amx",
    "amx_bf16": "amx_bf16",
    "amx_int8": "amx_int8",
}
_ARM_FLAGS = {
    "asimd": "neon",
    "asimddp": "dotprod",
    "asimdhp": "fp16",
    "i8mm": "i8mm",
    "bf16": "bf16",
    "sve": "sve",
    "sve2": "sve2",
    "sme": "sme",
}
# (implementer, part) -> core name, from Arm's published MIDR values (what lscpu prints); arm64
# /proc/cpuinfo has no "model name" line, so this is the only name the kernel offers.
_ARM_PARTS = {
    ("0x41", "0xd03"): "Cortex-A53",
    ("0x41", "0xd08"): "Cortex-A72",
    ("0x41", "0xd0b"): "Cortex-A76",
    ("0x41", "0xd0c"): "Neoverse-N1",
    ("0x41", "0xd40"): "Neoverse-V1",
    ("0x41", "0xd49"): "Neoverse-N2",
    ("0x41", "0xd4f"): "Neoverse-V2",
    ("0x61", "0x022"): "Apple M1",
}


@dataclass(frozen=True)
class CpuinfoFacts:
    model_name: str | None
    physical_cores: int | None  # None where the file has no core ids (arm64)
    logical_cores: int | None
    flags: tuple[str, ...]


def normalise_flags(raw: Iterable[str]) -> tuple[str, ...]:
    """Kernel flag names (x86 or arm64) -> our sorted feature names."""
    names = set(raw)
    out = {_X86_FLAGS[f] for f in names if f in _X86_FLAGS} | {
        _ARM_FLAGS[f] for f in names if f in _ARM_FLAGS
    }
    return tuple(sorted(out))


def parse_cpuinfo(text: str) -> CpuinfoFacts:
    """Parse Linux /proc/cpuinfo (x86 or arm64)."""
    blocks = [b for b in text.split("\n\n") if "processor" in b]
    recs = [_fields(b) for b in blocks]
    procs = [r for r in recs if r.get("processor", "").isdigit()]
    first = procs[0] if procs else (recs[0] if recs else {})
    model = first.get("model name") or _arm_name(first) or _fields(text).get("Model")
    cores = {(r.get("physical id", "0"), r["core id"]) for r in procs if "core id" in r}
    flags = first.get("flags") or first.get("Features") or ""
    return CpuinfoFacts(
        model_name=model or None,
        physical_cores=len(cores) or None,
        logical_cores=len(procs) or None,
        flags=normalise_flags(flags.split()),
    )


def _fields(block: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in block.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out.setdefault(key.strip(), value.strip())
    return out


def _arm_name(rec: dict[str, str]) -> str | None:
    key = (rec.get("CPU implementer", "").lower(), rec.get("CPU part", "").lower())
    return _ARM_PARTS.get(key)


def _cgroup_quota_cores(root: Path = CGROUP_ROOT) -> float | None:
    """Cores allowed by a cgroup v2 `cpu.max` (or v1 cfs quota) at `root` itself; None when unlimited or
    unknown."""
    return cgroup_cpu_quota(root, self_cgroup="")


def usable_cores(*, cgroup_root: Path = CGROUP_ROOT, self_cgroup: str | None = None) -> int:
    """Threads worth running: the affinity mask, capped by the cgroup CPU quota (rounded down, at least 1)."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS / Windows have no affinity API in os
        n = os.cpu_count() or 1
    quota = cgroup_cpu_quota(cgroup_root, self_cgroup=self_cgroup)
    if quota is not None:
        n = min(n, max(1, math.floor(quota)))
    return max(1, n)
