"""Long titles, small sizes, plain sentences, one empty chat, and voice buttons off with the reason (issue
32, items 5, 7, 14, 15, 17).

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

from PySide6.QtCore import Qt

from tests.support.desks import run_desk
from tests.support.modelgen import write_whisper_ggml
from tests.support.tinymodels import CHAT, write_tiny_gguf


# ---- 5, 14, 15, 17: long titles, small sizes, sentences, Ctrl+N, the About box ---------------------------
def test_long_titles_small_files_plain_sentences_and_one_empty_chat(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path
) -> None:
    from PySide6.QtTest import QTest

    from app.ui import fmt
    from app.ui.explain_view import _speed

    models = tmp_path / "models"
    write_tiny_gguf(models / "tiny.gguf", CHAT)
    small = write_whisper_ggml(models / "small-whisper.bin")  # a model of some KiB
    assert 1024 < small < 1024 * 1024

    async def body(desk: Any) -> None:
        w = desk.window
        w.activateWindow()  # shortcuts go to the active window
        await asyncio.sleep(0.1)
        # 17: Ctrl+N twice leaves one empty chat, not two
        QTest.keyClick(w, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
        QTest.keyClick(w, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
        chat = w.pages["Chat"]
        assert len(desk.chats.conversations()) == 1
        assert "F9" in w.about_text()
        # 5: a long title and a long loading line do not widen the window past a 1024-px screen
        chat.rename(chat.current, "How do I write a Python decorator that caches results per argument")
        chat.phase.setText(
            "Loading acme/Some-Long-Model-Name-Instruct-Q4_K_M… the first reply waits for the model to start"
        )
        await asyncio.sleep(0.1)
        assert w.width() == 1024 and w.minimumSizeHint().width() <= 1024, w.minimumSizeHint()
        # 14: a model of some KiB is not "0.0 MiB"
        lib = w.show_page("Library")
        await lib.refresh()
        row = next(r for r in range(lib.table.rowCount()) if "small" in lib.table.item(r, 0).text())
        size = lib.table.item(row, 3).text()
        assert size.endswith("KiB") and not size.startswith("0.0"), size
        # 15: the Settings page says what it applied in its own words
        settings = w.show_page("Settings")
        settings.endpoint.setText("http://127.0.0.1:9")
        assert settings.save()
        await settings.applying
        said = settings.saved.text()
        assert "Hugging Face mirror" in said and "hf_endpoint" not in said, said

    run_desk(qloop, qapp, isolated_env, models, body)
    # 15: numbers and sentences that read whole
    assert fmt.tps(0.04) == "0.04" and fmt.tps(0.43) == "0.43" and fmt.tps(3.42) == "3.4"
    assert fmt.verdict({"verdict": "cpu", "tokens_per_s_range": [0.04, 0.4]}).endswith("(0.04-0.4 tok/s)")
    assert fmt.size(4608) == "4.5 KiB" and fmt.size(512) == "512 B"
    none = _speed({"speed_note": ""}, None, True)
    assert "predicted not" not in none and "measured not" not in none, none
    assert _speed({"tokens_per_s": 12.0}, 9.5, True).endswith("measured 9.5 tok/s")


# ---- 7. voice buttons without the audio package are off, saying why -------------------------------------
def test_voice_buttons_are_off_with_the_reason_when_audio_is_missing(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path, monkeypatch: Any
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "sounddevice", None)  # as a `make run` without the gui extra has it

    async def body(desk: Any) -> None:
        chat = desk.window.show_page("Chat")
        await asyncio.sleep(0.05)
        voice = chat.voice
        assert not voice.talk_btn.isEnabled() and not voice.read_btn.isEnabled()
        assert "sounddevice" in voice.talk_btn.toolTip() and "pip install" not in voice.talk_btn.toolTip()
        assert "sounddevice" in voice.missing.text()
        # audio the caller brings (a test's source, another sink) needs no package: the buttons come back
        voice.source_factory = lambda: None  # type: ignore[assignment,return-value]
        voice.sink = object()  # type: ignore[assignment]
        voice.refresh_devices()
        assert voice.talk_btn.isEnabled() and voice.read_btn.isEnabled()

    run_desk(qloop, qapp, isolated_env, tmp_path / "models", body)
