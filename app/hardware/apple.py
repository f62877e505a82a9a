"""macOS facts from `sysctl`: RAM, the chip, core counts by performance level, ISA features.

On Apple Silicon the GPU shares all RAM (unified memory), so its memory_total is `hw.memsize`; how much of
that Metal lets one process wire is what llama.cpp's Metal device reports (see engine devices).
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from app.hardware.model import GPUInfo

SYSCTL_KEYS = (
    "hw.memsize",
    "machdep.cpu.brand_string",
    "hw.physicalcpu",
    "hw.logicalcpu",
    "hw.perflevel0.physicalcpu",
    "hw.perflevel1.physicalcpu",
    "hw.optional.arm64",
    "hw.optional.neon",
    "hw.optional.arm.FEAT_DotProd",
    "hw.optional.arm.FEAT_FP16",
    "hw.optional.arm.FEAT_I8MM",
    "hw.optional.arm.FEAT_BF16",
    "hw.optional.arm.FEAT_SME",
    "hw.optional.avx1_0",
    "hw.optional.avx2_0",
    "hw.optional.avx512f",
)
_FLAG_KEYS = {
    "hw.optional.neon": "neon",
    "hw.optional.arm.FEAT_DotProd": "dotprod",
    "hw.optional.arm.FEAT_FP16": "fp16",
    "hw.optional.arm.FEAT_I8MM": "i8mm",
    "hw.optional.arm.FEAT_BF16": "bf16",
    "hw.optional.arm.FEAT_SME": "sme",
    "hw.optional.avx1_0": "avx",
    "hw.optional.avx2_0": "avx2",
    "hw.optional.avx512f": "avx512",
}


@dataclass(frozen=True)
class AppleFacts:
    model_name: str | None
    memory_total: int | None
    physical_cores: int | None
    logical_cores: int | None
    performance_cores: int | None
    efficiency_cores: int | None
    flags: tuple[str, ...]
    gpu: GPUInfo | None  # Apple Silicon only


def parse_sysctl(text: str, *, keys: Sequence[str] | None = None) -> dict[str, str]:
    """`sysctl KEY...` output (`key: value` lines), or with `keys` the `sysctl -n KEY...` form, whose lines
    are the values in the order asked (sysctl -n skips unknown keys, so only use it for keys that exist)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if keys is not None:
        return dict(zip(keys, lines, strict=False))
    out = {}
    for line in lines:
        key, sep, value = line.partition(": ")
        if sep:
            out[key.strip()] = value.strip()
    return out


def _int(values: Mapping[str, str], key: str) -> int | None:
    try:
        return int(values[key])
    except (KeyError, ValueError):
        return None


def apple_facts(values: Mapping[str, str]) -> AppleFacts:
    """Turn parsed sysctl values into facts; the GPU only when the chip is Apple Silicon."""
    brand = values.get("machdep.cpu.brand_string") or None
    memsize = _int(values, "hw.memsize")
    silicon = values.get("hw.optional.arm64") == "1" or (brand or "").startswith("Apple")
    gpu = (
        GPUInfo(
            index=0,
            vendor="apple",
            name=brand or "Apple GPU",
            memory_total=memsize,
            memory_free=None,
            memory_used=None,
            driver_version=None,
            compute_capability=None,
            unified_memory=True,
            pci_bus_id=None,
            source="sysctl",
        )
        if silicon
        else None
    )
    flags = {name for key, name in _FLAG_KEYS.items() if values.get(key) == "1"}
    if silicon:
        flags.add("neon")  # every arm64 Mac has NEON, even where the key is absent
    return AppleFacts(
        model_name=brand,
        memory_total=memsize,
        physical_cores=_int(values, "hw.physicalcpu"),
        logical_cores=_int(values, "hw.logicalcpu"),
        performance_cores=_int(values, "hw.perflevel0.physicalcpu") if silicon else None,
        efficiency_cores=_int(values, "hw.perflevel1.physicalcpu") if silicon else None,
        flags=tuple(sorted(flags)),
        gpu=gpu,
    )


def read_sysctl(keys: Sequence[str] = SYSCTL_KEYS) -> dict[str, str]:
    """Run `sysctl` for `keys` (named output, so unknown keys simply go missing); {} where it cannot run."""
    try:
        out = subprocess.run(["sysctl", *keys], capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return {}
    return parse_sysctl(out.stdout)
