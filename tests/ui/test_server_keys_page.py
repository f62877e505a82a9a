"""A new API key leaves the screen; idle buttons are off (issue 32, last round).

Each drives the real widgets offscreen, with a real Desktop over a models folder of tiny generated models
(tests/support/desks.py); one file a Desktop or two, as each Qt file runs in a process of its own."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
pytest.importorskip("PySide6")
pytest.importorskip("qasync")


from tests.support.desks import run_desk


# ---- last round: a new API key does not stay on screen; buttons are off when they cannot act -------------
def test_new_key_leaves_the_screen_and_idle_buttons_are_off(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path
) -> None:
    async def body(desk: Any) -> None:
        w = desk.window
        srv = w.show_page("Server")
        assert not srv.revoke_btn.isEnabled()  # no key selected
        key = srv.create_key("laptop")
        assert key and srv.new_key.text() == key
        srv.keys.selectRow(0)
        assert srv.revoke_btn.isEnabled()
        w.show_page("Chat")
        assert srv.new_key.text() == "", "the key stayed on the Server page after leaving it"
        chat = w.pages["Chat"]
        chat.new_conversation()
        assert not chat.regen_btn.isEnabled() and not chat.edit_btn.isEnabled()
        assert not chat.copy_btn.isEnabled()

    run_desk(qloop, qapp, isolated_env, tmp_path / "models", body)
