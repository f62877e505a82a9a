"""Each engine kind declares which builds its package comes in (app/hardware/build_choice.py BuildRule), and
the build chosen for a machine follows that declaration: the choice itself names no engine."""

from __future__ import annotations

import dataclasses

from app.hardware.build_choice import ONE_BUILD, BuildRule, choose_build
from app.hardware.model import Hardware
from app.lanes.engines.registry import engine_kinds
from tests.lanes.install.test_runtimes_build import ANCIENT, H200, M3, MI300, XEON


def _build(lane: str, hw: Hardware) -> tuple[str, str]:
    c = choose_build(lane, hw, rule=engine_kinds()[lane].build_rule)
    return c.build, c.reason


def test_gpu_only_engines_say_what_they_need() -> None:
    for lane in ("vllm", "sglang"):
        assert _build(lane, H200)[0] == "cuda13" and _build(lane, MI300)[0] == "rocm"
        build, why = _build(lane, XEON)
        assert build == "cpu" and why.endswith(f"{lane} needs a CUDA or ROCm GPU")


def test_a_backend_without_a_build_falls_back_to_cpu_and_says_so() -> None:
    assert _build("mistral.rs", MI300) == (
        "cpu",
        f"{_build('llama.cpp', MI300)[1]}; mistral.rs has no rocm build: CPU",
    )
    assert _build("mistral.rs", XEON) == _build("llama.cpp", XEON)  # the CPU backend: its own reason
    assert _build("llama.cpp", ANCIENT)[0] == "vulkan"  # llama.cpp has every backend's build
    # MLX's CUDA wheels are Linux-only: the same card on Windows takes the CPU build
    windows = dataclasses.replace(H200, os="windows")
    assert _build("mlx", H200)[0] == "cuda13" and _build("mlx", windows)[0] == "cpu"
    assert _build("mlx", M3)[0] == "metal"


def test_one_build_engines_take_cpu() -> None:
    one = [lane for lane, k in engine_kinds().items() if k.build_rule == ONE_BUILD]
    assert set(one) == {"llama.cpp-compat", "sd.cpp", "whisper.cpp", "piper"}
    assert all(_build(lane, H200) == ("cpu", "one build only") for lane in one)
    rule = BuildRule(name="x", builds=frozenset({"cuda12"}), needs="an NVIDIA GPU")
    assert choose_build("x", XEON, rule=rule, packages={"cpu": "x-cpu"}).package == "x-cpu"
