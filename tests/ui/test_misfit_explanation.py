"""The misfit's explanation in the window's words (issue 32, last round).

The real widgets offscreen, with a real Desktop where a page needs one (tests/support/desks.py)."""

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


# ---- last round: the misfit's explanation in the window's words ------------------------------------------
def test_misfit_explanation_reads_in_the_windows_words(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path
) -> None:
    """A plan that cannot run gives no speed figure; its advice names the Library's settings, not a
    command-line flag, and its token counts are grouped."""
    from PySide6.QtWidgets import QLabel

    from app.ui.explain_view import ExplainDialog
    from tests.support.tinymodels import CHAT, write_tiny_gguf

    models = tmp_path / "models"
    write_tiny_gguf(models / "tiny.gguf", CHAT)

    async def body(desk: Any) -> None:
        over = await desk.runtime.explain("tiny", overrides={"ctx_size": 200_000_000, "kv_type": "f32"})
        dlg = ExplainDialog("tiny", over.public(), desk.window)
        dlg.show()
        texts = [lab.text() for lab in dlg.findChildren(QLabel)]
        speed = next(t for t in texts if "<b>Speed</b>" in t)
        assert "tok/s" not in speed and "does not fit" in speed, speed
        advice = [t for t in texts if t.startswith("To make it fit")]
        assert advice, texts
        joined = " ".join(advice)
        assert "--" not in joined, joined  # no command-line flags
        assert "200,000,000" in joined and "200000000" not in joined, joined
        dlg.close()

    run_desk(qloop, qapp, isolated_env, models, body)
