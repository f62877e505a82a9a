"""Running coroutines from Qt slots: disable what started it, report errors, re-enable, keep a reference."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from PySide6.QtWidgets import QWidget
from shiboken6 import isValid

from app.core.errors import SwitchyardError

log = logging.getLogger("switchyard.ui")


class Tasks:
    """Every coroutine the window starts; `settle()` waits for them (quit, tests)."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(
        self,
        coro: Coroutine[Any, Any, Any],
        *,
        disable: Iterable[QWidget] = (),
        report: Callable[[str], None] | None = None,
    ) -> asyncio.Task[Any]:
        widgets = list(disable)

        async def guarded() -> Any:
            for w in widgets:
                w.setEnabled(False)
            try:
                return await coro
            except asyncio.CancelledError:
                raise
            except SwitchyardError as exc:
                _tell(report, exc.message)
            except Exception as exc:  # a UI action never takes the window down; it says what failed
                log.exception("UI action failed")
                _tell(report, f"{type(exc).__name__}: {exc}")
            finally:
                for w in widgets:
                    if isValid(w):
                        w.setEnabled(True)
            return None

        task = asyncio.ensure_future(guarded())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        # a task cancelled before it first ran never awaited `coro`: close it (a no-op once it has run)
        task.add_done_callback(lambda _t: coro.close())
        return task

    async def settle(self, limit: float = 60) -> None:
        """Wait until no task is left (new ones started meanwhile included)."""
        deadline = asyncio.get_running_loop().time() + limit
        while self._tasks:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                raise TimeoutError(f"{len(self._tasks)} UI task(s) still running")
            await asyncio.wait(set(self._tasks), timeout=left)

    def cancel_all(self) -> None:
        for t in list(self._tasks):
            t.cancel()


def _tell(report: Callable[[str], None] | None, msg: str) -> None:
    try:
        if report is None:
            log.warning("%s", msg)
        else:
            report(msg)
    except RuntimeError:  # the widget that asked is gone (window closed meanwhile)
        log.warning("%s", msg)
