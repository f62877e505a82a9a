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
    if v.get("verdict") == "cpu" and (said := predicted(v.get("tokens_per_s"), band)):
        parts.append(said)
    if v.get("measured_tokens_per_s"):  # with its unit: a bare "measured 8417" read as a count
        parts.append(f"measured {tps(float(v['measured_tokens_per_s']))} tok/s")
    return f"{word} ({'; '.join(parts)})" if parts else word


def predicted(tokens_per_s: Any, band: Any) -> str | None:
    """The predicted speed as every page says it: "~12 tok/s" once calibrated, else the bandwidth's range
    "1.1k-11k tok/s" (both ends in one style), "under 0.01 tok/s", or None with nothing to go on."""
    if tokens_per_s:
        return f"~{tps(float(tokens_per_s))} tok/s"
    if not band:
        return None
    return speed_range(float(band[0]), float(band[1]))


def speed_range(low: float, high: float) -> str:
    """A range of tokens/s; one whose low end rounds away is "under HIGH" (never "0-0.4" or "0-0")."""
    if high < 0.01:
        return "under 0.01 tok/s"
    return f"{tps(low)}-{tps(high)} tok/s" if low >= 0.01 else f"under {tps(high)} tok/s"


def tps(n: float) -> str:
    """A speed in tokens/s, short: 12, 3.4, 0.04, 1.1k, 15k (two figures below 1: never "0.0"; thousands
    as k, so a range's two ends read alike: "1.1k-11k", not "1114-11k")."""
    if n >= 9_950:
        return f"{n / 1000:.0f}k"
    if n >= 999.5:
        return f"{n / 1000:.1f}k"
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
