"""CPU cores this process may really use: affinity mask and cgroup quota, not just the count."""

from __future__ import annotations

import math
import os
from pathlib import Path


def _cgroup_quota_cores(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """Cores allowed by a cgroup v2 `cpu.max` (or v1 cfs quota); None when unlimited or unknown."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        if quota != "max":
            return int(quota) / int(period)
        return None
    except (OSError, ValueError):
        pass
    try:
        q = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        p = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return q / p if q > 0 and p > 0 else None
    except (OSError, ValueError):
        return None


def usable_cores() -> int:
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS / Windows have no affinity API in os
        n = os.cpu_count() or 1
    quota = _cgroup_quota_cores()
    if quota is not None:
        n = min(n, max(1, math.floor(quota)))
    return max(1, n)
