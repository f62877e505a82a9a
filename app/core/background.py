"""A task that lives as long as a block: started on entry, cancelled and awaited on the way out, so that
nothing a part started outlives it (the feeds, drains and timers that servers and runtimes keep)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from typing import Any


async def cancelled(task: asyncio.Task[Any] | None) -> None:
    """Cancel `task` and wait until it has finished; its cancellation is not raised here."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


@contextlib.asynccontextmanager
async def running(coro: Coroutine[Any, Any, Any], *, name: str) -> AsyncIterator[asyncio.Task[Any]]:
    """Run `coro` as a task for the length of the block."""
    task = asyncio.create_task(coro, name=name)
    try:
        yield task
    finally:
        await cancelled(task)
