"""Every wait on a local engine, bounded: a request gets no further than engine_read_timeout_s without a
byte from the engine (while no other request on it makes progress), then 504 engine_unresponsive, and
the lane is failed and restarted (app/lanes/lane.py, `Lane.guard`).

A remote answers for itself (its connection has its own timeouts): its waits are plain awaits.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from typing import TypeVar

from app.lanes.lane import Lane, Progress
from app.lanes.target import Target

T = TypeVar("T")


async def engine_wait(target: Target, aw: Awaitable[T], *, since: float | None = None) -> T:
    """`aw`'s result, bounded by the read timeout of `target`'s engine when it is a local lane; `since`:
    when this request last heard from the engine (default: now)."""
    if not isinstance(target, Lane):
        return await aw
    return await target.guard(aw, since=time.monotonic() if since is None else since)


def progress_of(target: Target) -> Progress | None:
    """Where the byte relay marks the engine's progress (a local lane's), or None for a remote."""
    return target.progress if isinstance(target, Lane) else None
