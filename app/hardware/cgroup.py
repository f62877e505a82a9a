"""cgroup limits on this process: memory and CPU quota, v2 and v1, read along the cgroup's ancestry.

A limit set on any ancestor applies too, so the effective one is the smallest found from the process's own
cgroup up to the mount root. Inside a container the mount root is usually the container's own cgroup and
/proc/self/cgroup says "/", so the root alone is read.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
# v1 prints PAGE_COUNTER_MAX rounded to pages (9223372036854771712) for "no limit".
_V1_UNLIMITED = 1 << 60


def parse_self_cgroup(text: str) -> dict[str, str]:
    """`/proc/self/cgroup` lines `id:controllers:path` -> {controller: path}; the v2 line's key is ""."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for c in controllers.split(",") if controllers else [""]:
            out[c.removeprefix("name=")] = path
    return out


def _read_self_cgroup(self_cgroup: str | None) -> dict[str, str]:
    if self_cgroup is None:
        try:
            self_cgroup = Path("/proc/self/cgroup").read_text()
        except OSError:
            self_cgroup = ""
    return parse_self_cgroup(self_cgroup)


def _ancestry(base: Path, rel: str | None) -> list[Path]:
    """base/rel, then each parent up to base itself, the ones that exist."""
    parts = [p for p in (rel or "").split("/") if p and p not in (".", "..")]
    dirs = [base.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)]
    return [d for d in dirs if d.is_dir()]


def _texts(base: Path, rel: str | None, name: str) -> list[str]:
    """The text of the file `name` in base/rel and in each parent up to base, the ones that can be read
    (a limit set higher up binds this cgroup as well)."""
    out = []
    for d in _ancestry(base, rel):
        with contextlib.suppress(OSError):
            out.append((d / name).read_text())
    return out


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def cgroup_memory_limit(root: Path = CGROUP_ROOT, *, self_cgroup: str | None = None) -> int | None:
    """Bytes this process's cgroup may use (v2 `memory.max`, v1 `memory.limit_in_bytes`); None when
    unlimited or unreadable. `self_cgroup` is the text of /proc/self/cgroup (None: read it)."""
    paths = _read_self_cgroup(self_cgroup)
    limits = [int(t) for text in _texts(root, paths.get(""), "memory.max") if (t := text.strip()).isdigit()]
    for d in _ancestry(root / "memory", paths.get("memory")):
        v = _read_int(d / "memory.limit_in_bytes")
        if v is not None and 0 < v < _V1_UNLIMITED:
            limits.append(v)
    return min(limits) if limits else None


def cgroup_cpu_quota(root: Path = CGROUP_ROOT, *, self_cgroup: str | None = None) -> float | None:
    """Cores allowed by v2 `cpu.max` or v1 `cpu.cfs_quota_us / cpu.cfs_period_us`; None when unlimited or
    unreadable."""
    paths = _read_self_cgroup(self_cgroup)
    quotas: list[float] = []
    for text in _texts(root, paths.get(""), "cpu.max"):
        fields = text.split()
        try:
            if len(fields) >= 2 and fields[0] != "max" and int(fields[1]) > 0:
                quotas.append(int(fields[0]) / int(fields[1]))
        except ValueError:
            continue
    for d in _ancestry(root / "cpu", paths.get("cpu")):
        q, p = _read_int(d / "cpu.cfs_quota_us"), _read_int(d / "cpu.cfs_period_us")
        if q is not None and p is not None and q > 0 and p > 0:  # -1 means no quota
            quotas.append(q / p)
    return min(quotas) if quotas else None
