"""The Library page on the real Runtime, offscreen: a vision model is marked and its projector counted in
its size and named in the detail (the `mmproj` override followed: one named, one "none"); a model's last
eval score is shown; the context is the per-request figure; long names are never cut at 1024 px."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
pytest.importorskip("PySide6")
pytest.importorskip("qasync")

from app.core.paths import Paths
from app.core.settings import Settings
from app.quality.store import CaseResult, EvalStore
from app.ui import fmt
from app.ui.pages.library import COLUMNS
from tests.support.tinymodels import write_tiny_gguf
from tests.support.visiongen import write_tiny_mmproj

VL = "vision/tiny-vl"
LONG_70B = "acme-Meta-Llama-3.1-70B-Instruct-abliterated-Q4_K_M"
LONG_8B = "acme-Meta-Llama-3.1-8B-Instruct-abliterated-Q4_K_M"


def test_library_page_vision_eval_context_names(
    qloop: asyncio.AbstractEventLoop, qapp: Any, tmp_path: Path, isolated_env: Path
) -> None:
    from app.ui.desktop import Desktop

    models = tmp_path / "models"
    write_tiny_gguf(models / "vision" / "tiny-vl.gguf")
    proj = write_tiny_mmproj(models / "vision" / "mmproj-tiny-vl-f32.gguf")
    write_tiny_gguf(models / "vision" / "tiny-vl-off.gguf")  # paired too, but its override says "none"
    write_tiny_gguf(models / "tiny.gguf")  # no projector beside it; its override names one
    for name in (LONG_70B, LONG_8B):
        write_tiny_gguf(models / f"{name}.gguf")
    paths = Paths(home=isolated_env)
    run = EvalStore(paths.evals_db)  # a finished eval of `tiny`, as `switchyard eval` records it
    rid = run.start(model="tiny", suite="arithmetic", source="builtin", threshold=0.5)
    run.add_case(rid, CaseResult(case_id="c1", score=1.0, weight=1.0, reason="", answer="4", seconds=0.1))
    run.finish(rid, score=0.9, passed=True)
    settings = Settings.flat(
        port=0,
        models_dirs=(models,),
        idle_ttl_s=0,
        model_overrides={
            "tiny": {"mmproj": "vision/mmproj-tiny-vl-f32.gguf", "ctx_size": 1024, "parallel": 4},
            "vision/tiny-vl-off": {"mmproj": "none"},
        },
    )

    async def scenario() -> None:
        async with Desktop(paths, settings, qapp=qapp) as desk:
            w = desk.window
            w.resize(1024, 700)
            w.show()
            lib = w.show_page("Library")
            await lib.refresh()
            await desk.tasks.settle()
            rows = {lib.table.item(r, 0).text(): r for r in range(lib.table.rowCount())}
            assert {VL, "tiny", "vision/tiny-vl-off", LONG_70B, LONG_8B} <= set(rows)

            def cell(model: str, column: str) -> Any:
                return lib.table.item(rows[model], COLUMNS.index(column))

            # vision: marked for the paired model and the one whose override names a projector, not for
            # the one whose override is "none"
            assert cell(VL, "Format").text() == "gguf + vision"
            assert cell("tiny", "Format").text() == "gguf + vision"
            assert cell("vision/tiny-vl-off", "Format").text() == "gguf"
            assert proj.name in cell(VL, "Format").toolTip()
            # the size counts the projector beside the weights
            doc = {d["id"]: d for d in lib.rows}
            weights = int(doc[VL]["size"])
            with_proj = weights + proj.stat().st_size
            assert cell(VL, "Size").data(256 + 1) == with_proj  # Qt.UserRole + 1: the sort key
            assert cell(VL, "Size").text() == fmt.size(with_proj)
            assert "vision projector" in cell(VL, "Size").toolTip()
            assert cell("vision/tiny-vl-off", "Size").data(256 + 1) == int(doc["vision/tiny-vl-off"]["size"])
            # the last eval score, and none where nothing was evaluated
            assert cell("tiny", "Eval").text() == "0.90 pass"
            assert "arithmetic" in cell("tiny", "Eval").toolTip()
            assert cell(VL, "Eval").text() == "-"
            # the detail of the selected model: its projector, the context per request, its last eval
            assert lib.select("tiny")
            await desk.tasks.settle()
            detail = lib.detail.text()
            assert f"Vision projector: {proj}" in detail
            assert "256 tokens per request (1024 in all, 4 requests at once)" in detail
            assert "Last eval: Suite arithmetic: score 0.90 pass" in detail
            # long names: the whole name is in the tooltip, and a name wider than its column wraps onto
            # more lines instead of being cut, so the 70B and the 8B stay apart
            for name in (LONG_70B, LONG_8B):
                item = cell(name, "Name")
                assert item.toolTip() == name and item.text() == name
            assert lib.table.wordWrap()
            lib.table.resizeRowsToContents()
            col = lib.table.columnWidth(0)
            metrics = lib.table.fontMetrics()
            long_row = rows[LONG_70B]
            # as many lines as the name needs at this width (two at 1024 px with the default font)
            lines = -(-metrics.horizontalAdvance(LONG_70B) // col)
            assert lib.table.rowHeight(long_row) >= lines * metrics.height()

    qloop.run_until_complete(scenario())
