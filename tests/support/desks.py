"""A real Desktop over a models folder, for the window tests: started, shown at a size, driven, settled."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt

from app.core.paths import Paths
from app.core.settings import Settings


def run_desk(
    qloop: asyncio.AbstractEventLoop,
    qapp: Any,
    home: Path,
    models: Path,
    body: Callable[[Any], Awaitable[None]],
    *,
    size: tuple[int, int] = (1024, 640),
    timeout: float = 90,
) -> None:
    from app.ui.desktop import Desktop

    settings = Settings.flat(port=0, models_dirs=(models,), idle_ttl_s=0, monitor_interval_s=0)

    async def scenario() -> None:
        async with Desktop(Paths(home=home), settings, qapp=qapp) as desk:
            desk.window.resize(*size)
            desk.window.show()
            await body(desk)
            await desk.tasks.settle()

    qloop.run_until_complete(asyncio.wait_for(scenario(), timeout))


def selected_id(lib: Any) -> str | None:
    rows = lib.table.selectionModel().selectedRows()
    item = lib.table.item(rows[0].row(), 0) if rows else None
    return str(item.data(Qt.ItemDataRole.UserRole)) if item else None
