"""LoRA import wording, models folders rescanned on focus, and the Lanes page's engines table (issue 32,
items 10, 11).

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


# ---- 11. a LoRA import is refused in the window's words; dropped files show when the window comes back ---
def test_lora_import_words_and_models_seen_when_the_window_comes_back(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path
) -> None:
    from PySide6.QtWidgets import QWidget

    from tests.support.loragen import write_tiny_lora

    models = tmp_path / "models"
    write_tiny_gguf(models / "base.gguf", CHAT)
    lora = write_tiny_lora(tmp_path / "elsewhere" / "style-lora.gguf", CHAT)

    async def body(desk: Any) -> None:
        w = desk.window
        lib = w.show_page("Library")
        await lib.refresh()
        task = lib.import_path(Path(lora))
        await asyncio.gather(task, return_exceptions=True)
        said = lib.status.text()
        assert "LoRA adapter" in said and "LoRA adapters" in said, said
        assert "model_overrides" not in said and "{" not in said and "[" not in said, said
        # a model copied into the folder while another window is in front: seen when this one is back
        other = QWidget()
        other.show()
        other.activateWindow()
        await asyncio.sleep(0.1)
        write_tiny_gguf(models / "dropped.gguf", CHAT)
        await asyncio.sleep(RESCAN_PAUSE)
        w.activateWindow()
        await asyncio.sleep(0.2)
        await desk.tasks.settle()
        names = [lib.table.item(r, 0).text() for r in range(lib.table.rowCount())]
        assert "dropped" in names, names
        chat = w.pages["Chat"]
        assert "dropped" in [chat.model.itemData(i) for i in range(chat.model.count())]
        other.close()

    run_desk(qloop, qapp, isolated_env, models, body)


RESCAN_PAUSE = 2.1  # the window reads the folders at most every 2 s


# ---- 10. the Lanes page: short health cells, no Install of an engine this machine cannot run -------------
def test_engines_table_is_brief_and_refuses_cuda_installs_without_a_gpu(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path
) -> None:
    async def body(desk: Any) -> None:
        assert not [g for g in (desk.runtime.hardware.gpus or ()) if g.vendor == "nvidia"], (
            "needs no GPU here"
        )
        lanes = desk.window.show_page("Lanes")
        panel = lanes.engines
        table = panel.table
        for r in range(table.rowCount()):
            cell = table.item(r, 5)
            assert len(cell.text()) <= 70 and "pip install" not in cell.text(), cell.text()
            assert cell.toolTip().startswith(cell.text().rstrip("…"))  # the whole text is in the tooltip
        row = next(i for i, r in enumerate(panel.rows) if r["engine"] == "vllm")
        table.selectRow(row)
        await asyncio.sleep(0)
        assert not panel.install_btn.isEnabled()
        assert "NVIDIA GPU" in panel.install_btn.toolTip(), panel.install_btn.toolTip()

    run_desk(qloop, qapp, isolated_env, tmp_path / "models", body)
