"""The Chat page's Thinking box follows the chosen model: off, with the reason, for a model whose chat
template has no thinking switch (before: ticked and enabled for every model, doing nothing for most), on for
a thinking template."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before pytest-qt makes its QApplication


def test_the_thinking_box_follows_the_models_template(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path
) -> None:
    pytest.importorskip("qasync")
    from tests.support.desks import run_desk
    from tests.support.thinkmodel import write_thinker
    from tests.support.tinymodels import CHAT, write_tiny_gguf

    models = tmp_path / "models"
    write_thinker(models / "thinker.gguf")
    write_tiny_gguf(models / "plain.gguf", CHAT)  # ChatML: no enable_thinking, no reasoning_effort
    seen: dict[str, tuple[bool, str]] = {}

    async def body(desk: Any) -> None:
        chat = desk.window.show_page("Chat")
        for mid in ("plain", "thinker", "plain"):
            chat.model.setCurrentIndex(chat.model.findData(mid))
            await asyncio.sleep(0)
            seen[mid] = (chat.thinking.isEnabled(), chat.thinking.toolTip())

    run_desk(qloop, qapp, isolated_env, models, body)
    enabled, tip = seen["plain"]
    assert not enabled and "has no thinking switch" in tip and "plain" in tip
    enabled, tip = seen["thinker"]
    assert enabled and "no thinking switch" not in tip
