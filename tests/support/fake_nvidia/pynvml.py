"""NVML as a machine with NVIDIA cards reports it, for a child `switchyard serve` on a machine without one
(tests/lanes/peers/test_nodes_serve.py): with this folder first on PYTHONPATH, `import pynvml` finds this
module instead of nvidia-ml-py. The cards come from the file SWITCHYARD_TEST_NVIDIA_FILE names, read at
every query (a test changes a card's free memory while the server runs): `TOTAL_MIB:FREE_MIB[:CC]` per card,
comma-separated (e.g. "24564:24000:8.9"); no file or an empty one: NVML finds no driver, as on this machine.

Only the queries app/hardware/nvidia.py and the monitor make are answered; nothing here runs a GPU."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

MIB = 1 << 20
NVML_CLOCK_MEM = 2


class NVMLError(Exception):
    pass


def _cards() -> list[tuple[int, int, tuple[int, int]]]:
    out = []
    try:
        with open(os.environ.get("SWITCHYARD_TEST_NVIDIA_FILE", ""), encoding="utf-8") as fh:
            text = fh.read()
    except OSError:
        return []
    for spec in text.split(","):
        if not spec.strip():
            continue
        total, free, *cc = spec.strip().split(":")
        major, minor = (cc[0] if cc else "8.9").split(".")
        out.append((int(total) * MIB, int(free) * MIB, (int(major), int(minor))))
    return out


def nvmlInit() -> None:
    if not _cards():
        raise NVMLError("NVML Shared Library Not Found")


def nvmlShutdown() -> None:
    return None


def nvmlSystemGetDriverVersion() -> str:
    return "550.54.15"


def nvmlDeviceGetCount() -> int:
    return len(_cards())


def nvmlDeviceGetHandleByIndex(i: int) -> int:
    if not 0 <= i < len(_cards()):
        raise NVMLError("Invalid Argument")
    return i


def nvmlDeviceGetName(h: int) -> str:
    return "NVIDIA GeForce RTX 4090"


def nvmlDeviceGetMemoryInfo(h: int) -> Any:
    total, free, _cc = _cards()[h]
    return SimpleNamespace(total=total, free=free, used=total - free)


def nvmlDeviceGetCudaComputeCapability(h: int) -> tuple[int, int]:
    return _cards()[h][2]


def nvmlDeviceGetPciInfo(h: int) -> Any:
    return SimpleNamespace(busId=f"00000000:{h + 1:02X}:00.0")


def nvmlDeviceGetUtilizationRates(h: int) -> Any:
    return SimpleNamespace(gpu=0, memory=0)
