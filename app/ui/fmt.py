"""Small text helpers shared by the pages."""

from __future__ import annotations

import time
from typing import Any

from app.advice.hub_fit import VERDICT_WORDS
from app.core.units import fmt_bytes


def size(n: int | None) -> str:
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
    if v.get("verdict") == "cpu" and v.get("tokens_per_s"):
        tps = float(v["tokens_per_s"])
        word += f" (~{tps / 1000:.0f}k tok/s)" if tps >= 10_000 else f" (~{tps:.0f} tok/s)"
    return word
