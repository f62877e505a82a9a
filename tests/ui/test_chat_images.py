"""The Chat page with images, offscreen, on the real Runtime and a real llama.cpp vision lane (a tiny model
with a generated projector, tests/support/visiongen.py): attach by the button's path and by a clipboard
paste, send,
get an answer, see the thumbnails in the history; the button is off for a text-only model; the stats line.
SWITCHYARD_SCREENSHOT_DIR=docs/screenshots refreshes docs/screenshots/chat-image.png."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
pytest.importorskip("PySide6")
pytest.importorskip("qasync")

from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QColor, QDropEvent, QGuiApplication, QImage

from app.core.paths import Paths
from app.core.settings import Settings
from app.ui.pages.chat import _stats
from tests.support.tinymodels import write_tiny_gguf
from tests.support.visiongen import png_bytes, write_tiny_mmproj

VL = "vision/tiny-vl"


def _picture() -> QImage:
    """A picture a person could recognise in the screenshot: a sun over a sea."""
    image = QImage(320, 200, QImage.Format.Format_RGB888)
    image.fill(QColor(135, 190, 235))
    for y in range(120, 200):
        for x in range(320):
            image.setPixelColor(x, y, QColor(30, 90, 160))
    for y in range(30, 90):
        for x in range(130, 190):
            if (x - 160) ** 2 + (y - 60) ** 2 < 900:
                image.setPixelColor(x, y, QColor(250, 200, 40))
    return image


def test_chat_sends_images_and_shows_them(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path
) -> None:
    from app.ui.desktop import Desktop

    models = tmp_path / "models"
    write_tiny_gguf(models / "vision" / "tiny-vl.gguf")
    write_tiny_mmproj(models / "vision" / "mmproj-tiny-vl-f32.gguf")
    write_tiny_gguf(models / "tiny.gguf")  # no projector beside it: text only
    photo = tmp_path / "photo.png"
    photo.write_bytes(png_bytes(48, 32, seed=3))
    settings = Settings.flat(
        port=0,
        models_dirs=(models,),
        idle_ttl_s=0,
        model_overrides={VL: {"ctx_size": 1024, "parallel": 1}},
    )

    out = Path(os.environ.get("SWITCHYARD_SCREENSHOT_DIR") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)

    async def scenario() -> None:
        async with Desktop(Paths(home=isolated_env), settings, qapp=qapp) as desk:
            chat = desk.window.show_page("Chat")
            # a text-only model: the button is off and says why; an image is refused with the same words
            chat.new_conversation(model="tiny")
            assert not chat.attach_btn.isEnabled()
            assert "tiny has no vision" in chat.attach_btn.toolTip()
            assert chat.attach_file(photo) is False and "no vision" in chat.status.text()
            assert chat.pending == []

            cid = chat.new_conversation(model=VL)
            assert chat.attach_btn.isEnabled()
            assert chat.attach_file(photo)  # what the button's file dialog hands over
            QGuiApplication.clipboard().setImage(_picture())
            chat.input.paste()  # Ctrl+V: the image becomes an attachment, not text
            assert [(p.width, p.height) for p in chat.pending] == [(48, 32), (320, 200)]
            assert chat.input.toPlainText() == "" and chat.pending_row.count() == 3  # two + the stretch
            assert chat.attach_bytes(b"not an image", name="notes.txt") is False
            assert "notes.txt could not be read as an image" in chat.status.text()
            chat.remove_pending(0)
            assert [(p.width, p.height) for p in chat.pending] == [(320, 200)]
            # dropped on the page from a file manager: a file URL, attached again (its path is not text)
            drop = QMimeData()
            drop.setUrls([QUrl.fromLocalFile(str(photo))])
            chat.dropEvent(
                QDropEvent(
                    QPointF(10, 10),
                    Qt.DropAction.CopyAction,
                    drop,
                    Qt.MouseButton.LeftButton,
                    Qt.KeyboardModifier.NoModifier,
                )
            )
            assert len(chat.pending) == 2 and chat.input.toPlainText() == ""
            # random weights may stop at once or emit half a character: ask for all the tokens
            desk.chats.configure(cid, sampling={"ignore_eos": True, "max_tokens": 6})
            chat.open(cid)
            chat.input.setPlainText("What is in these pictures?")
            task = chat.send()
            assert task is not None and chat.pending == [] and chat.pending_row.count() == 1
            await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 120)
            msgs = desk.chats.messages(cid)
            assert [m.role for m in msgs] == ["user", "assistant"], [(m.role, m.content) for m in msgs]
            assert [(a.width, a.height) for a in msgs[0].images] == [(320, 200), (48, 32)]
            reply = msgs[1]
            assert reply.content and reply.meta["tokens"] > 0
            # the lane saw both images: each is 16 prompt tokens on this projector, beside the text
            assert reply.meta["context_used"] > 2 * 16
            assert reply.meta.get("prompt_per_s") and reply.meta.get("gen_per_s")
            text = chat.view.toPlainText()
            assert "prompt " in text and "generation " in text and "tok/s" in text
            html = chat.view.toHtml()
            assert all(f"chatimg:{a.id}" in html for a in msgs[0].images)
            chat.view.document().adjustSize()  # laid out: the thumbnails were asked for
            assert {a.id for a in msgs[0].images} <= set(chat.view.thumbs)
            assert all(not chat.view.thumbs[a.id].isNull() for a in msgs[0].images)
            desk.window.resize(1200, 800)
            await asyncio.sleep(0.2)
            shot = out / "chat-image.png"
            assert desk.window.grab().save(str(shot))
            assert shot.stat().st_size > 10_000

    qloop.run_until_complete(asyncio.wait_for(scenario(), 180))


def test_stats_line_says_what_speculative_decoding_accepted() -> None:
    meta = {"ttft_s": 0.1, "tok_per_s": 9.0, "prompt_per_s": 500.0, "gen_per_s": 42.5, "draft_n": 16}
    line = _stats({**meta, "draft_accepted": 12})
    assert "draft: accepted 12 of 16 (75 %)" in line and "generation 42.5 tok/s" in line
    assert "9.0 tok/s" not in line  # the engine's own speed replaces the one measured here
    assert "draft" not in _stats({"ttft_s": 0.1, "tok_per_s": 9.0}) and "9.0 tok/s" in _stats(
        {"tok_per_s": 9.0}
    )
