"""Swap (the page file on Windows), read where the OS offers it: unknown is None, never a crash.

psutil reads Windows' page file through performance counters, which some systems lack (wine, or a
machine whose counters are disabled): it raises there instead of answering.
"""

from __future__ import annotations

from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class Swap:
    total: int
    free: int
    used: int


def swap_now() -> Swap | None:
    """Swap space now, or None when this OS does not say."""
    try:
        sw = psutil.swap_memory()
    except (OSError, RuntimeError, psutil.Error):
        return None
    return Swap(total=int(sw.total), free=int(sw.free), used=int(sw.used))
