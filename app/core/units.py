"""Byte sizes as people read them: the one formatter every message, table and page uses.

Sizes are carried as ints of bytes everywhere; they become text only here, so the CLI, the API's
messages and the window all say "4.07 GiB" for the same file.
"""

from __future__ import annotations

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30


def fmt_bytes(n: int | None, *, unknown: str = "?") -> str:
    """`n` bytes as "1.50 GiB" from one GiB up, else "12.3 MiB"; `unknown` where the size is not known."""
    if n is None:
        return unknown
    if abs(n) >= GIB:
        return f"{n / GIB:.2f} GiB"
    return f"{n / MIB:.1f} MiB"
