"""The fit bar ("Why?") shows a vision projector's weights and its compute buffer as parts of their own,
never lumped into compute, with their sizes in the legend; a text model's legend names no projector."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
pytest.importorskip("PySide6")

from PySide6.QtWidgets import QLabel

from app.advice.explain import explain
from app.advice.inputs import AdviceInputs
from app.core.settings import Settings
from app.formats.gguf_meta import GGUFFacts, read_gguf
from app.hardware.probe import probe
from app.library.model import ModelEntry
from app.ui.explain_view import ExplainView, MemoryBar, device_parts
from app.ui.fmt import size
from tests.support.tinymodels import write_tiny_gguf
from tests.support.visiongen import write_tiny_mmproj


def test_the_bar_has_projector_parts(qapp: Any, tmp_path: Path) -> None:
    model = write_tiny_gguf(tmp_path / "tiny-vl.gguf")
    proj = write_tiny_mmproj(tmp_path / "mmproj-tiny-vl-f32.gguf")
    facts = read_gguf(model)
    assert isinstance(facts, GGUFFacts)
    inputs = AdviceInputs(
        settings=Settings.flat(model_overrides={"vl": {"ctx_size": 512}}),
        hardware=probe(engine=False),
        pins={},
    )
    doc = explain(ModelEntry("vl", model, facts, None, (model,), mmproj=proj), inputs=inputs).public()
    chosen = doc["fit"]["chosen"]
    dev = next(d for d in chosen["devices"] if d["projector"])  # where the launch puts it
    parts = device_parts(dev, used=0)
    assert parts["projector"] == dev["projector"] > 100_000
    assert parts["projector_compute"] == dev["projector_compute"] > 0
    assert parts["compute"] == dev["compute"] + dev["overhead"] + dev["prompt_cache"]  # no projector in it
    view = ExplainView(doc)
    bar = next(b for b in view.findChildren(MemoryBar) if b.parts["projector"])
    keys = [k for k, _x, _w in bar.bar_layout(400)["segments"]]
    assert "projector" in keys and "projector_compute" in keys
    assert bar.total == dev["total"] + bar.parts["used"]  # every part of the plan is drawn, once
    legend = " ".join(lab.text() for lab in view.findChildren(QLabel))
    assert f"vision projector {size(dev['projector'])}" in legend
    assert f"projector compute {size(dev['projector_compute'])}" in legend
    # the same model without its projector: no projector in the legend
    plain = ExplainView(explain(ModelEntry("t", model, facts, None, (model,)), inputs=inputs).public())
    assert "projector" not in " ".join(lab.text() for lab in plain.findChildren(QLabel))
