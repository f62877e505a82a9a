"""The Chat page's thinking, offscreen, on the real Runtime and a real llama.cpp lane whose template thinks
(tests/support/thinkmodel.py): the toggle is kept per conversation, the reply's reasoning streams into a fold
above
the answer, and the fold opens and closes. Screenshots at 1024x640 and 1600x1000 go to
SWITCHYARD_SCREENSHOT_DIR (docs/screenshots refreshes chat-thinking-*.png)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
pytest.importorskip("PySide6")
pytest.importorskip("qasync")

from PySide6.QtCore import QUrl

from app.core.paths import Paths
from app.core.settings import Settings
from app.ui.chat_thinking import EFFORT_KEY
from tests.support.thinkmodel import ANSWER, REASONED, THOUGHT, write_thinker
from tests.support.tinymodels import write_tiny_gguf
from tests.support.ui_pictures import save


def test_chat_thinking_toggle_and_folded_reasoning(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path
) -> None:
    from app.ui.desktop import Desktop

    models = tmp_path / "models"
    write_thinker(models / "thinker.gguf")
    write_tiny_gguf(models / "tiny.gguf")
    settings = Settings.flat(port=0, models_dirs=(models,), idle_ttl_s=0)
    out = Path(os.environ.get("SWITCHYARD_SCREENSHOT_DIR") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)

    async def scenario() -> None:
        async with Desktop(Paths(home=isolated_env), settings, qapp=qapp) as desk:
            chat = desk.window.show_page("Chat")
            other = desk.chats.create("Other", model="tiny", system_prompt="")
            desk.chats.add(other, "user", "hello")  # not empty: a new chat does not reuse it
            cid = chat.new_conversation(model="thinker")
            assert cid != other
            # untouched, the template's default stands: nothing is sent for it
            assert chat.thinking.isChecked() and EFFORT_KEY not in desk.chats.get(cid).sampling
            chat.thinking.setChecked(False)
            assert desk.chats.get(cid).sampling[EFFORT_KEY] == "none"
            chat.open(other)  # per conversation: the other one keeps its own (untouched) setting
            assert chat.thinking.isChecked() and EFFORT_KEY not in desk.chats.get(other).sampling
            chat.open(cid)
            assert not chat.thinking.isChecked()
            chat.thinking.setChecked(True)
            assert desk.chats.get(cid).sampling[EFFORT_KEY] == "medium"

            # random weights think nothing: the grammar pins a thought and an answer
            # (tests/support/thinkmodel.py)
            sampling = {**desk.chats.get(cid).sampling, "grammar": REASONED, "max_tokens": 60}
            desk.chats.configure(cid, sampling=sampling)
            chat.open(cid)
            chat.input.setPlainText("What is the answer?")
            task = chat.send()
            assert task is not None
            await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 120)
            msgs = desk.chats.messages(cid)
            assert [m.role for m in msgs] == ["user", "assistant"], [(m.role, m.content) for m in msgs]
            reply = msgs[1]
            assert reply.content == ANSWER and reply.meta["reasoning"] == THOUGHT + "\n"
            # the history the model gets back holds the answer only
            assert all(THOUGHT not in str(m.get("content")) for m in desk.chats.history(cid))

            folded = chat.view.toPlainText()
            assert "Thought (2 words)" in folded and ANSWER in folded and THOUGHT not in folded
            assert folded.index("Thought (2 words)") < folded.index(ANSWER)  # above the answer
            for width, height in ((1024, 640), (1600, 1000)):
                desk.window.resize(width, height)
                await asyncio.sleep(0.3)  # laid out at the new size (no nested processEvents under qasync)
                save(desk.window, out / f"chat-thinking-folded-{width}.png")
            chat._link(QUrl(f"think:{reply.id}"))  # the fold's link, as a click on it sends it
            opened = chat.view.toPlainText()
            assert THOUGHT in opened and opened.index(THOUGHT) < opened.index(ANSWER)
            for width, height in ((1024, 640), (1600, 1000)):
                desk.window.resize(width, height)
                await asyncio.sleep(0.3)  # laid out at the new size (no nested processEvents under qasync)
                save(desk.window, out / f"chat-thinking-open-{width}.png")
            chat._link(QUrl(f"think:{reply.id}"))
            assert THOUGHT not in chat.view.toPlainText()

    qloop.run_until_complete(asyncio.wait_for(scenario(), 240))
