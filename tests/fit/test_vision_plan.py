"""The vision projector in the memory plan, the launch and the explanation:

- the plan puts the projector where the launch does (`mmproj_use_gpu = gpu_layers != 0`): on GPU0 when a
  placement offloads layers, in host memory for a CPU-only placement, even on a machine with a GPU;
- `switchyard explain` and the fit bar show the projector's weights and its compute buffer as parts of
  their own;
- which projector loads is one rule (`ModelEntry.projector`): the `mmproj` override naming a projector,
  or "none", is followed by the start, by capabilities (/v1/models' lane) and by Ollama's /api/show.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from app.advice.explain import explain, render
from app.advice.inputs import AdviceInputs
from app.core.settings import Settings
from app.core.units import fmt_bytes
from app.fit.memory import FitParams, breakdown, projector_on_gpu
from app.fit.plan import Budget, plan_placements
from app.formats.gguf_layout import GGUFLayout, read_gguf_layout
from app.formats.gguf_meta import GGUFFacts, GGUFProblem, read_gguf
from app.hardware.model import Hardware
from app.lanes.engines.llamacpp.kind import LlamaCppKind, fit_for, plan_params
from app.library.model import ModelEntry
from app.library.pairing import vision_projector
from app.server.surfaces.ollama.translate import show
from tests.support.machines import machine as a_machine
from tests.support.machines import nvidia
from tests.support.tinymodels import write_tiny_gguf
from tests.support.visiongen import VisionSpec, write_tiny_mmproj

MIB = 1 << 20


def machine(*, gpus: int) -> Hardware:
    """64 GiB of RAM and `gpus` 24 GiB NVIDIA cards (23 GiB free each)."""
    cards = tuple(nvidia(24 * 1024, index=i, free_mib=23 * 1024) for i in range(gpus))
    return a_machine(ram_gib=64, gpus=cards)


@pytest.fixture
def vision_model(tmp_path: Path) -> tuple[ModelEntry, Path]:
    folder = tmp_path / "models" / "vision"
    model = write_tiny_gguf(folder / "tiny-vl.gguf")
    proj = write_tiny_mmproj(folder / "mmproj-tiny-vl-f32.gguf")
    write_tiny_mmproj(folder / "other-projector.gguf", VisionSpec(seed=3, image_size=64))
    facts = read_gguf(model)
    assert isinstance(facts, GGUFFacts)
    return ModelEntry("vision/tiny-vl", model, facts, None, (model,), mmproj=proj), proj


def _devices(report: object) -> dict[str, dict[str, int]]:
    doc = report.public()  # type: ignore[attr-defined]
    return {d["device"]: d for d in doc["chosen"]["devices"]}


# ---- the plan follows the launch --------------------------------------------------------------------
def test_breakdown_puts_the_projector_where_the_launch_does(vision_model: tuple[ModelEntry, Path]) -> None:
    entry, _ = vision_model
    layout = read_gguf_layout(entry.path)
    assert isinstance(layout, GGUFLayout)
    params = FitParams(ctx_size=512, projector_bytes=3 * MIB, projector_compute_bytes=MIB)
    # a machine with a GPU, a CPU-only placement: the launch passes mmproj_use_gpu=False
    cpu_only = {
        d.device: d
        for d in breakdown(layout, params=FitParams(**{**params.__dict__, "gpu_layers": 0}), gpu_devices=1)
    }
    assert cpu_only["CPU"].projector == 3 * MIB and cpu_only["CPU"].projector_compute == MIB
    assert cpu_only["GPU0"].projector == 0 and cpu_only["GPU0"].projector_compute == 0
    offload = {
        d.device: d
        for d in breakdown(layout, params=FitParams(**{**params.__dict__, "gpu_layers": 99}), gpu_devices=2)
    }
    assert offload["GPU0"].projector == 3 * MIB and offload["GPU0"].projector_compute == MIB
    assert offload["CPU"].projector == 0 and offload["GPU1"].projector == 0
    assert projector_on_gpu(0, gpu_devices=1) is False and projector_on_gpu(5, gpu_devices=1) is True
    assert projector_on_gpu(5, gpu_devices=0) is False


@pytest.mark.parametrize(("gpu_layers", "device"), [(0, "CPU"), (-1, "GPU0")])
def test_the_planned_placement_and_the_launch_agree(
    vision_model: tuple[ModelEntry, Path], gpu_layers: int, device: str
) -> None:
    """On a machine with a GPU: a CPU-only setting (gpu_layers 0) puts the projector in host memory and
    starts it with mmproj_use_gpu off; the automatic placement offloads, and both put it on GPU0."""
    entry, _ = vision_model
    settings = Settings.flat(model_overrides={entry.id: {"gpu_layers": gpu_layers, "ctx_size": 512}})
    hw = machine(gpus=1)
    report = fit_for(entry, settings, hardware=hw)
    assert not isinstance(report, GGUFProblem) and report.chosen is not None
    devices = _devices(report)
    assert devices[device]["projector"] > 100_000 and devices[device]["projector_compute"] > 0
    assert sum(d["projector"] for name, d in devices.items() if name != device) == 0
    launch = plan_params(entry, settings, fit=report)
    assert launch.mmproj_use_gpu is (device != "CPU")
    assert projector_on_gpu(report.chosen.gpu_layers, gpu_devices=1) is launch.mmproj_use_gpu


def test_plan_placements_cpu_placement_keeps_the_projector_on_the_host(
    vision_model: tuple[ModelEntry, Path],
) -> None:
    entry, _ = vision_model
    layout = read_gguf_layout(entry.path)
    assert isinstance(layout, GGUFLayout)
    hw = machine(gpus=1)
    params = FitParams(ctx_size=512, projector_bytes=3 * MIB, projector_compute_bytes=MIB)
    report = plan_placements(layout, hw, params=params, budget=Budget.of(hw))
    by_name = {p.name: p for p in report.placements}
    cpu = {d.device: d for d in by_name["cpu"].devices}
    assert cpu["CPU"].projector == 3 * MIB and all(d.projector == 0 for n, d in cpu.items() if n != "CPU")


# ---- explain and the fit bar ------------------------------------------------------------------------
def test_explain_text_has_projector_columns(vision_model: tuple[ModelEntry, Path]) -> None:
    entry, _ = vision_model
    settings = Settings.flat(model_overrides={entry.id: {"ctx_size": 512}})
    doc = explain(entry, inputs=AdviceInputs(settings=settings, hardware=machine(gpus=0), pins={})).public()
    text = render(doc)
    head = next(line for line in text.splitlines() if line.strip().startswith("device"))
    assert "projector" in head and "proj. compute" in head
    cpu = next(line for line in text.splitlines() if line.strip().startswith("CPU "))
    chosen = doc["fit"]["chosen"]["devices"][0]
    assert chosen["projector"] > 0 and chosen["projector_compute"] > 0

    def cell(heading: str) -> str:  # the right-aligned figure under `heading`
        end = head.index(heading) + len(heading)
        return " ".join(cpu[:end].split()[-2:])

    assert cell("projector") == fmt_bytes(chosen["projector"])
    assert cell("proj. compute") == fmt_bytes(chosen["projector_compute"])
    assert cell("compute") == fmt_bytes(chosen["compute"])  # the text model's own buffer, apart
    assert cell("total") == fmt_bytes(chosen["total"])
    # a text model's table has no projector columns
    text_only = ModelEntry("tiny", entry.path, entry.facts, None, (entry.path,))
    plain = render(
        explain(text_only, inputs=AdviceInputs(settings=settings, hardware=machine(gpus=0), pins={})).public()
    )
    assert "projector" not in plain


# ---- one rule for which projector loads -------------------------------------------------------------
def test_override_naming_a_projector_and_none(vision_model: tuple[ModelEntry, Path]) -> None:
    entry, paired = vision_model
    text_only = ModelEntry("vision/tiny-text", entry.path, entry.facts, None, (entry.path,))
    kind = LlamaCppKind()
    plain = Settings()
    # the pairing alone
    assert entry.projector(plain) == paired and "vision" in kind.capabilities(entry, plain)
    assert "vision" in show(entry, plain)["capabilities"]
    assert "vision" not in kind.capabilities(text_only, plain)
    # an override naming a projector gives a model with none paired its vision, everywhere
    named = Settings.flat(model_overrides={text_only.id: {"mmproj": "other-projector.gguf"}})
    other = entry.path.parent / "other-projector.gguf"
    assert text_only.projector(named) == other
    assert "vision" in kind.capabilities(text_only, named)
    assert "vision" in show(text_only, named)["capabilities"]
    assert text_only.public(named)["vision"] is True and text_only.public(named)["mmproj"] == str(other)
    found = vision_projector(text_only, named)
    assert found is not None and found[0] == other
    assert plan_params(text_only, named).mmproj_path == str(other)
    # "none" turns the paired projector off, everywhere
    off = Settings.flat(model_overrides={entry.id: {"mmproj": "none"}})
    assert entry.projector(off) is None
    assert "vision" not in kind.capabilities(entry, off)
    assert "vision" not in show(entry, off)["capabilities"]
    assert entry.public(off)["vision"] is False and entry.public(off)["mmproj"] is None
    assert vision_projector(entry, off) is None and plan_params(entry, off).mmproj_path == ""
