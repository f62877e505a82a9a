"""Slots: a limit on concurrent transfers that can be changed while transfers run.

asyncio.Semaphore's size is fixed at creation; the download concurrency setting applies without a restart,
so the limit is a number checked under a Condition. Lowering it lets the transfers running now finish and
starts no new one until fewer than the new limit run.
"""

from __future__ import annotations

import asyncio
from types import TracebackType


class Slots:
    def __init__(self, limit: int) -> None:
        self._limit = max(1, limit)
        self._busy = 0
        self._cond = asyncio.Condition()

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def busy(self) -> int:
        return self._busy

    async def resize(self, limit: int) -> None:
        """A new limit; waiting transfers start at once when it grew."""
        async with self._cond:
            self._limit = max(1, limit)
            self._cond.notify_all()

    async def __aenter__(self) -> Slots:
        async with self._cond:
            await self._cond.wait_for(lambda: self._busy < self._limit)
            self._busy += 1
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        async with self._cond:
            self._busy -= 1
            self._cond.notify_all()
