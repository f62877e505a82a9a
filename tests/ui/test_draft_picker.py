"""The draft picker: only smaller drafts with the same tokenizer, their effect, plain words (issue 32, item
3).

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
from tests.support.tinymodels import CHAT, write_tiny_gguf


# ---- 3. the draft picker offers only smaller drafts, says their effect, in plain words --------------------
def test_draft_picker_offers_only_smaller_drafts_with_their_effect(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path
) -> None:
    import json

    from tests.support.tinymodels import MEDIUM

    models = tmp_path / "models"
    write_tiny_gguf(models / "small.gguf", CHAT)
    write_tiny_gguf(models / "big.gguf", MEDIUM)  # the same tokenizer, many times the size

    async def body(desk: Any) -> None:
        lib = desk.window.show_page("Library")
        tune = lib.tune
        labels = [tune.spec.itemText(i) for i in range(tune.spec.count())]
        assert not [t for t in labels if "_" in t or t in ("ngram", "draft")], labels  # no engine names
        tune.show_model("small")
        await tune.pairing
        tune.spec.setCurrentIndex(tune.spec.findData("draft"))
        await asyncio.sleep(0)
        box = tune.pages["draft"].draft
        offered = [box.itemData(i) for i in range(box.count())]
        assert "big" not in offered, [box.itemText(i) for i in range(box.count())]
        assert [box.itemText(i) for i in range(box.count())] == ["none qualifies"]
        # the big model tuned: the small one is proposed, with how much smaller it is and what to expect
        tune.show_model("big")
        await tune.pairing
        tune.spec.setCurrentIndex(tune.spec.findData("draft"))
        await asyncio.sleep(0)
        assert box.itemText(0).startswith("small (proposed, ") and "x smaller" in box.itemText(0)
        note = tune.pages["draft"].note.text()
        assert "of one of this model's steps" in note and "faster" in note, note
        # a larger draft named in settings.json is shown refused, saying why, and cannot be saved
        raw = json.loads(desk.paths.settings_file.read_text()) if desk.paths.settings_file.exists() else {}
        raw.setdefault("model_overrides", {})["small"] = {"speculative": {"type": "draft", "draft": "big"}}
        desk.paths.settings_file.write_text(json.dumps(raw))
        tune.show_model("small")
        await tune.pairing
        await tune._task
        assert box.currentText() == "big (refused)", box.currentText()
        assert "the size of the model" in tune.pages["draft"].note.text()
        assert "Cannot be applied" in tune.verdict.text() and tune.save() is False

    run_desk(qloop, qapp, isolated_env, models, body)
