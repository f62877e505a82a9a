"""A task that lives as long as a block: started on entry, cancelled and awaited on the way out, so that
nothing a part started outlives it (the feeds, drains and timers that servers and runtimes keep)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine, Iterable
from typing import Any

import aiohttp


async def cancelled(task: asyncio.Task[Any] | None) -> None:
    """Cancel `task` and wait until it has finished; its cancellation is not raised here."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def all_cancelled(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Cancel every task of `tasks`, then wait until all have finished; neither their cancellation nor
    what they raised is raised here (a part shutting down keeps nothing of its work's failures)."""
    pending = list(tasks)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


async def until_done(fut: asyncio.Future[Any]) -> None:
    """Until `fut` is done, whatever its outcome (retrieved, not raised here). A cancellation of the
    caller meanwhile waits for it too, and goes on once it is done: where a caller's end must come after
    what it waits on (a thread holding a file's lock, since a cancelled `asyncio.to_thread` returns at
    once while its thread runs on; a task still letting go of what the caller is about to take)."""
    cancelled = False
    while not fut.done():
        try:
            await asyncio.wait({fut})
        except asyncio.CancelledError:
            cancelled = True
    if not fut.cancelled():
        fut.exception()  # what it raised is its owner's to read (and is not logged as unretrieved)
    if cancelled:
        raise asyncio.CancelledError


@contextlib.asynccontextmanager
async def running(coro: Coroutine[Any, Any, Any], *, name: str) -> AsyncIterator[asyncio.Task[Any]]:
    """Run `coro` as a task for the length of the block."""
    task = asyncio.create_task(coro, name=name)
    try:
        yield task
    finally:
        await cancelled(task)


class SessionOwner:
    """A part that owns one aiohttp client session while it is entered (the supervisor's to its engines,
    the remotes' to theirs): it opens it on entry and closes it on exit; `http` is the session between."""

    _http: aiohttp.ClientSession | None = None

    def open_http(self, session: aiohttp.ClientSession) -> aiohttp.ClientSession:
        self._http = session
        return session

    async def close_http(self) -> None:
        if self._http is not None:
            await self._http.close()

    @property
    def http(self) -> aiohttp.ClientSession:
        assert self._http is not None, f"{type(self).__name__} used outside its context"
        return self._http
