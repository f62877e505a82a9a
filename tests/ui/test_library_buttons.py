"""The Library's buttons are off where they cannot act on the selected model, saying why (issue 32, last
round: buttons enabled when they cannot act): Unload of a model not loaded, Load and Delete of a loaded
one, Check for update of a file that did not come from Hugging Face, Chat with a whisper model. Pressing
one of them used to answer with an error line instead."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
pytest.importorskip("PySide6")
pytest.importorskip("qasync")

from tests.support.asyncwait import until
from tests.support.desks import run_desk


def _off(lib: Any) -> dict[str, str]:
    """The buttons that are off, with the tooltip that says why."""
    return {n: b.toolTip() for n, b in lib.buttons.items() if not b.isEnabled()}


def test_library_buttons_follow_what_the_selected_model_can_do(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path
) -> None:
    from tests.support.modelgen import write_whisper_ggml
    from tests.support.tinymodels import CHAT, write_tiny_gguf

    models = tmp_path / "models"
    write_tiny_gguf(models / "tiny.gguf", CHAT)
    write_whisper_ggml(models / "ears.bin")

    async def body(desk: Any) -> None:
        lib = desk.window.show_page("Library")
        await desk.tasks.settle()
        assert set(_off(lib)) == set(lib.buttons) - {"Import…"}  # nothing selected: nothing to act on
        lib.select("tiny")
        off = _off(lib)
        assert set(off) == {"Unload", "Check for update"}, off
        assert off["Unload"] == "tiny is not loaded" and "Hugging Face" in off["Check for update"]
        assert lib.buttons["Load"].toolTip() == "Load tiny"  # on, naming what it acts on
        lib.buttons["Load"].click()
        await until(lambda: "Load" in _off(lib) and "Unload" not in _off(lib), what="loaded", limit=60)
        await desk.tasks.settle()
        off = _off(lib)
        assert set(off) == {"Load", "Delete", "Check for update"}, off
        assert "unload it first" in off["Delete"]
        lib.buttons["Unload"].click()
        await until(lambda: "Unload" in _off(lib), what="unloaded", limit=60)
        await desk.tasks.settle()
        assert set(_off(lib)) == {"Unload", "Check for update"}, _off(lib)
        lib.select("ears")
        off = _off(lib)
        assert "Chat" in off and "cannot chat" in off["Chat"], off
        assert not lib.status.text(), lib.status.text()  # nothing was pressed that could only fail

    run_desk(qloop, qapp, isolated_env, models, body)
