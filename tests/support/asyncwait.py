"""Waiting inside a running event loop (asyncio or qasync) for a condition the loop itself brings about."""

from __future__ import annotations

import asyncio
from typing import Any


async def until(check: Any, *, limit: float = 60, what: str = "condition") -> Any:
    """Let the loop (Qt and asyncio both) run until check() is truthy; returns that value."""
    deadline = asyncio.get_running_loop().time() + limit
    while True:
        value = check()
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)
