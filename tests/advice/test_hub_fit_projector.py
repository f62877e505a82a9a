"""Fit before download counts the vision projector a pull would fetch: its header is read from the fake hub
with Range requests like the model's, and the hub plan equals the local plan of the paired files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.advice.hub_fit import fit_detail
from app.advice.inputs import AdviceInputs
from app.core.paths import Paths
from app.core.settings import Settings
from app.formats.gguf_meta import GGUFFacts, GGUFProblem, read_gguf
from app.hardware.model import Hardware
from app.hardware.probe import probe
from app.hub.browse import Hub
from app.hub.token import TokenStore
from app.lanes.engines.llamacpp.kind import fit_for
from app.library.model import ModelEntry
from tests.support.fakehub import FakeHub, gguf_repo_files
from tests.support.tinymodels import write_tiny_gguf
from tests.support.visiongen import VisionSpec, write_tiny_mmproj

REPO = "org/tiny-vl-GGUF"


def _device_memory(plan: dict[str, Any]) -> dict[str, int]:
    memory: dict[str, int] = plan["chosen"]["devices"][0]
    return memory


def test_hub_fit_counts_the_pulled_projector(fake_hub: FakeHub, tmp_path: Path) -> None:
    model = write_tiny_gguf(tmp_path / "tiny-vl-Q8_0.gguf")
    # two projectors: a pull takes the F16 one, here the larger encoder (so the two cannot be confused)
    f16 = write_tiny_mmproj(tmp_path / "mmproj-tiny-vl-F16.gguf", VisionSpec(image_size=64))
    f32 = write_tiny_mmproj(tmp_path / "mmproj-tiny-vl-F32.gguf")
    files = gguf_repo_files("tiny-vl", {"Q8_0": model})
    files[f16.name], files[f32.name] = f16.read_bytes(), f32.read_bytes()
    fake_hub.add_repo(REPO, files, tags=["gguf"])
    fake_hub.add_repo("org/text-GGUF", gguf_repo_files("text", {"Q8_0": model}), tags=["gguf"])
    paths, settings = Paths.from_env(), Settings()
    hub = Hub(paths, settings, tokens=TokenStore(paths, settings, env={}))
    hardware: Hardware = probe(engine=False)
    inputs = AdviceInputs(settings=settings, hardware=hardware, pins={})
    client = hub.client()

    on_hub = fit_detail(client.detail(REPO), reader=client.reader, inputs=inputs).fit["quantizations"]["Q8_0"]  # type: ignore[index]
    assert on_hub["projector"] == f16.name
    assert fake_hub.served[f"{REPO}/{f16.name}"] > 0 and f"{REPO}/{f32.name}" not in fake_hub.served
    facts = read_gguf(model)
    assert isinstance(facts, GGUFFacts)
    local = fit_for(
        ModelEntry("local", model, facts, None, (model,), mmproj=f16), settings, hardware=hardware
    )
    assert not isinstance(local, GGUFProblem)
    # the memory per device is the local plan's, projector included (speed notes may differ by source)
    assert on_hub["plan"]["chosen"]["devices"] == local.public()["chosen"]["devices"]
    assert on_hub["verdict"] == local.verdict
    memory = _device_memory(on_hub["plan"])
    assert memory["projector"] > 0 and memory["projector_compute"] > 0

    text = fit_detail(client.detail("org/text-GGUF"), reader=client.reader, inputs=inputs).fit[
        "quantizations"
    ]["Q8_0"]  # type: ignore[index]
    assert text["projector"] is None
    assert _device_memory(text["plan"])["projector"] == 0
    total = _device_memory(on_hub["plan"])["total"] - _device_memory(text["plan"])["total"]
    assert total == memory["projector"] + memory["projector_compute"]  # the projector is the difference
