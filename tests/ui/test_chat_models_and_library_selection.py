"""Only chat models offered for chat, and the Library's selection following its model (issue 32, items 1-2).

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


from tests.support.desks import run_desk, selected_id
from tests.support.modelgen import write_piper_voice, write_whisper_ggml
from tests.support.tinymodels import CHAT, write_tiny_gguf


# ---- 1. only models that can chat are offered for chat ---------------------------------------------------
def test_speech_models_are_not_offered_for_chat(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path
) -> None:
    models = tmp_path / "models"
    # named so that they sort before the chat model: the old default was the first id
    write_whisper_ggml(models / "aaa-whisper-tiny.bin")
    write_piper_voice(models / "aab-voice", "aab-en_US-test-medium")
    write_tiny_gguf(models / "zz-chat.gguf", CHAT)

    async def body(desk: Any) -> None:
        kinds = {e.id: e.kind for e in desk.runtime.catalog.servable()}
        assert sorted(kinds.values()) == ["chat", "speech", "transcription"], kinds
        chat = desk.window.show_page("Chat")
        offered = [chat.model.itemData(i) for i in range(chat.model.count())]
        assert offered == ["zz-chat"], offered
        cid = chat.new_conversation()
        assert desk.chats.get(cid).model == "zz-chat"
        srv = desk.window.show_page("Server")
        srv.refresh_state()
        text = srv.snippet.toPlainText()
        assert 'model="zz-chat"' in text and "whisper" not in text and "voice" not in text
        # an old conversation that names the whisper model says it cannot chat, and sends nothing
        old = desk.chats.create("old", model="aaa-whisper-tiny", system_prompt="")
        chat = desk.window.show_page("Chat")
        chat.open(old)
        assert chat.model.currentText() == "aaa-whisper-tiny (cannot chat)"
        task = chat.send("hello")
        assert task is not None
        await asyncio.gather(task, return_exceptions=True)
        last = desk.chats.messages(old)[-1]
        assert last.role == "error" and "cannot chat" in last.content, last

    run_desk(qloop, qapp, isolated_env, models, body)


# ---- 2. the Library's selection follows the model; a to z ----------------------------------------------
def test_library_selection_follows_the_model_through_refresh_and_delete(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path
) -> None:
    models = tmp_path / "models"
    for name in ("m-model", "p-model", "t-model"):
        write_tiny_gguf(models / f"{name}.gguf", CHAT)

    async def body(desk: Any) -> None:
        lib = desk.window.show_page("Library")
        await lib.refresh()
        names = [lib.table.item(r, 0).text() for r in range(lib.table.rowCount())]
        assert names == ["m-model", "p-model", "t-model"], names  # a to z, not z to a
        assert lib.select("p-model")
        await desk.tasks.settle()
        assert lib.tune.model == "p-model" and "p-model" in lib.tune.title()
        # two more models arrive (one sorts before, one after): the row index of p-model moves
        for name in ("b-model", "z-model"):
            write_tiny_gguf(models / f"{name}.gguf", CHAT)
        await lib.refresh()
        await desk.tasks.settle()
        assert lib.table.rowCount() == 5
        assert selected_id(lib) == "p-model", selected_id(lib)
        assert lib.tune.model == "p-model"
        assert "p-model" in lib.detail.text()
        assert lib.buttons["Delete"].toolTip() == "Delete p-model"
        # the delete acts on the highlighted model, and afterwards nothing of it is shown
        task = lib.delete(confirm=False)
        assert task is not None
        await task
        await desk.tasks.settle()
        assert not (models / "p-model.gguf").exists()
        assert "p-model" not in [lib.table.item(r, 0).text() for r in range(lib.table.rowCount())]
        assert selected_id(lib) is None
        assert lib.tune.model is None and "p-model" not in lib.tune.title()
        assert "p-model" not in lib.detail.text() and "p-model" not in lib.tune.verdict.text()
        assert not lib.buttons["Delete"].isEnabled()

    run_desk(qloop, qapp, isolated_env, models, body)
