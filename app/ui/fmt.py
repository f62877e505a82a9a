"""Small text helpers shared by the pages."""

from __future__ import annotations

import time
from typing import Any

from app.advice.hub_fit import VERDICT_WORDS
from app.core.units import MIB, fmt_bytes


def size(n: int | None) -> str:
    """Bytes for people: a 4.5 KiB file is "4.5 KiB", not "0.0 MiB"; a MiB and up as fmt_bytes says it."""
    if n is not None and abs(n) < 1024:
        return f"{n} B"
    if n is not None and abs(n) < MIB:
        return f"{n / 1024:.1f} KiB"
    return fmt_bytes(n)


def count(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, step in (("M", 1_000_000), ("k", 1_000)):
        if n >= step:
            return f"{n / step:.1f}{unit}"
    return str(n)


def ago(ts: float | None) -> str:
    if not ts:
        return "never"
    d = time.time() - ts
    for unit, step in (("d", 86400), ("h", 3600), ("min", 60)):
        if d >= step:
            return f"{int(d // step)} {unit} ago"
    return "just now"


def duration(s: float | None) -> str:
    if s is None:
        return "-"
    if s >= 3600:
        return f"{int(s // 3600)} h {int(s % 3600 // 60)} min"
    if s >= 60:
        return f"{int(s // 60)} min {int(s % 60)} s"
    return f"{s:.0f} s"


def verdict(v: dict[str, Any] | None) -> str:
    if not v:
        return "-"
    if v.get("verdict") is None:
        return "unknown"
    word = VERDICT_WORDS.get(v["verdict"], v["verdict"])
    parts = []
    chosen = ((v.get("plan") or {}).get("chosen")) or {}
    band = v.get("tokens_per_s_range") or chosen.get("tokens_per_s_range")
    if v.get("verdict") == "cpu" and v.get("tokens_per_s"):
        parts.append(f"~{tps(float(v['tokens_per_s']))} tok/s")
    elif v.get("verdict") == "cpu" and band:  # nothing measured here yet: the honest answer is a range
        low, high = float(band[0]), float(band[1])
        parts.append(f"{tps(low)}-{tps(high)} tok/s" if high >= 0.01 else "under 0.01 tok/s")
    if v.get("measured_tokens_per_s"):
        parts.append(f"measured {tps(float(v['measured_tokens_per_s']))}")
    return f"{word} ({'; '.join(parts)})" if parts else word


def tps(n: float) -> str:
    """A speed in tokens/s, short: 12, 3.4, 0.04, 15k (two figures below 1: never "0.0")."""
    if n >= 10_000:
        return f"{n / 1000:.0f}k"
    if n >= 10:
        return f"{n:.0f}"
    if n >= 1:
        return f"{n:.1f}"
    return f"{n:.2g}" if n >= 0.01 else "under 0.01" if n > 0 else "0"


def parallel_of(v: dict[str, Any] | None) -> int:
    """How many requests the engine serves at once for this verdict (each gets total / parallel)."""
    plan = (v or {}).get("plan") or {}
    place = plan.get("chosen") or next(iter(plan.get("placements") or []), None) or {}
    return max(int(place.get("parallel") or 1), 1)


def context(total: int | None, *, parallel: int) -> tuple[str, str]:
    """(per request, the detail): a prompt and its reply must fit the per-request share, so that is the
    number shown; the total the engine holds goes in the detail."""
    if not total:
        return "-", "no context fits"
    per = total // max(parallel, 1)
    if parallel <= 1:
        return str(per), f"{total} tokens per request"
    return str(per), f"{per} tokens per request ({total} in all, {parallel} requests at once)"
