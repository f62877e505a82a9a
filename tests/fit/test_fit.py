"""The memory model: predictions checked against the real llama.cpp engine, and placements on
captured machine shapes (a 24 GiB NVIDIA card, a 6 GiB one, Apple unified memory, CPU only)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from app.core.errors import ModelTooLargeError
from app.core.paths import Paths
from app.core.settings import Settings
from app.fit.memory import MIB, FitParams, breakdown, kv_layer_bytes, split_weights
from app.fit.plan import GIB, Budget, plan_placements
from app.formats.gguf_layout import GGUFLayout, read_gguf_layout
from app.lanes.engines.plan import StartContext
from app.runtime import Runtime
from tests.support.machines import machine, nvidia, unified_gpu
from tests.support.tinymodels import CHAT, LARGE, TinySpec, write_gemma2_gguf, write_tiny_gguf


def read_layout(path: str) -> GGUFLayout:
    lay = read_gguf_layout(Path(path))
    assert isinstance(lay, GGUFLayout)
    return lay


def within(predicted: int, measured: int, *, rel: float = 0.05, abs_mib: float = 16) -> bool:
    return abs(predicted - measured) <= max(rel * measured, abs_mib * MIB)


SHAPES = {
    "tiny": (CHAT, {"parallel": 1}),
    "tiny-4-slots": (CHAT, {"parallel": 4}),
    "large": (LARGE, {"parallel": 4}),
    "gqa-1-kv-head": (
        TinySpec(n_embd=256, n_layer=4, n_head=8, n_head_kv=1, n_ff=512, seed=3),
        {"parallel": 2},
    ),
    "kv-q8_0": (LARGE, {"kv_type": "q8_0", "flash_attn": "on", "parallel": 2}),
    "kv-q4_0": (LARGE, {"kv_type": "q4_0", "flash_attn": "on", "parallel": 2}),
    "no-flash-attn": (
        TinySpec(n_embd=128, n_layer=3, n_ff=384, seed=4),
        {"flash_attn": "off", "parallel": 2},
    ),
    "sliding-window-gemma2": (None, {"parallel": 2}),
}


@pytest.mark.parametrize("shape", list(SHAPES))
async def test_prediction_matches_llama_cpp(tmp_path: Path, shape: str) -> None:
    spec, settings = SHAPES[shape]
    models = tmp_path / "models"
    if spec is None:
        write_gemma2_gguf(models / f"{shape}.gguf")
    else:
        write_tiny_gguf(models / f"{shape}.gguf", spec)
    rt = Runtime(settings=Settings.flat(models_dirs=(models,), **settings), paths=Paths.from_env())  # type: ignore[arg-type]
    async with rt:
        lane = await rt.supervisor.ensure(shape)
        assert lane.plan is not None and lane.plan.fit is not None and lane.measured is not None
        predicted = {d.device: d for d in lane.plan.fit.chosen.devices}["CPU"]  # type: ignore[union-attr]
        measured = lane.measured.devices["CPU"]
        report = f"{shape}: predicted {predicted.public()} measured {measured}"
        # weights and KV follow llama.cpp's own arithmetic: they must agree to the log's 0.01 MiB rounding
        assert within(predicted.weights, measured["weights"], rel=0.001, abs_mib=0.02), report
        assert within(predicted.kv_cache, measured["kv_cache"], rel=0.001, abs_mib=0.02), report
        if shape.startswith("sliding"):  # the sliding layers really are smaller than the full ones
            assert lane.plan.fit.chosen is not None
            per_layer = kv_layer_bytes(
                read_layout(lane.plan.params.model_path), params=lane.plan.fit.chosen.params
            )
            assert per_layer[0] < per_layer[1]
        assert within(predicted.compute, measured["compute"]), report
        # the plan is what runs
        assert lane.plan.params.ctx_size == lane.plan.fit.chosen.params.ctx_size  # type: ignore[union-attr]


def test_kv_formula_by_hand(model_store: Path) -> None:
    lay = read_gguf_layout(model_store / "tiny.gguf")
    assert isinstance(lay, GGUFLayout)
    # 2 layers x 2 KV heads x (16 + 16) dims x 2 bytes x 1024 cells
    assert sum(kv_layer_bytes(lay, params=FitParams(ctx_size=1024))) == 2 * 2 * 32 * 2 * 1024
    q8 = sum(kv_layer_bytes(lay, params=FitParams(ctx_size=1024, kv_type="q8_0")))
    assert q8 == round(2 * 2 * 32 * (34 / 32) * 1024)


def test_sliding_window_layers_are_capped(model_store: Path) -> None:
    lay = read_gguf_layout(model_store / "tiny.gguf")
    assert isinstance(lay, GGUFLayout)
    swa = dataclasses.replace(lay, sliding_window=512, swa_layers=(True, False))
    p = FitParams(ctx_size=32768, parallel=2, n_ubatch=512)
    per_layer = kv_layer_bytes(swa, params=p)
    # the sliding layer holds min(16384, pad(512 + 512)) = 1024 cells per sequence, the full one 32768
    assert per_layer[0] == 1024 * 2 * 2 * 32 * 2
    assert per_layer[1] == 32768 * 2 * 32 * 2


def llama8b_like(base: GGUFLayout) -> GGUFLayout:
    """An 8B-class Q4_K_M shape: 32 layers of ~137 MiB, 8 KV heads of 128, 128k vocab."""
    n = 32
    return dataclasses.replace(
        base,
        block_count=n,
        embedding_length=4096,
        vocab_size=128256,
        head_count=(32,) * n,
        head_count_kv=(8,) * n,
        feed_forward_length=(14336,) * n,
        key_length=128,
        value_length=128,
        kv_layers=(True,) * n,
        swa_layers=(False,) * n,
        sliding_window=None,
        layer_bytes=(137 * MIB,) * n,
        token_embd_bytes=282 * MIB,
        output_bytes=411 * MIB,
        other_bytes=0,
        context_length=131072,
        file_type="mostly_q4_k_m",
    )


@pytest.fixture
def big(model_store: Path) -> GGUFLayout:
    lay = read_gguf_layout(model_store / "tiny.gguf")
    assert isinstance(lay, GGUFLayout)
    return llama8b_like(lay)


def test_full_offload_on_a_24_gib_card(big: GGUFLayout) -> None:
    hw = machine(ram_gib=64, gpus=(nvidia(24564),))
    r = plan_placements(big, hw, params=FitParams(ctx_size=8192), budget=Budget.of(hw))
    assert r.verdict == "gpu" and r.chosen is not None and r.chosen.gpu_layers == 33
    gpu = {d.device: d for d in r.chosen.devices}["GPU0"]
    assert gpu.weights == 32 * 137 * MIB + 411 * MIB  # every layer and the output layer
    assert gpu.kv_cache == 32 * 8192 * 8 * 256 * 2  # 1 GiB of f16 KV at 8k
    host = {d.device: d for d in r.chosen.devices}["CPU"]
    assert host.weights == 282 * MIB  # the token embedding stays on the host
    assert r.chosen.max_ctx is not None and r.chosen.max_ctx > 8192
    assert r.chosen.tokens_per_s is None and "GPU memory bandwidth" in r.chosen.speed_note


def test_partial_offload_on_a_6_gib_card(big: GGUFLayout) -> None:
    hw = machine(ram_gib=32, gpus=(nvidia(6144, "NVIDIA GeForce RTX 2060"),))
    r = plan_placements(big, hw, params=FitParams(ctx_size=8192), budget=Budget.of(hw))
    assert r.verdict == "partial" and r.chosen is not None
    assert 0 < r.chosen.gpu_layers < 32
    names = [p.name for p in r.placements]
    assert names == ["gpu", "partial", "cpu"]
    assert not r.placements[0].fits and r.placements[0].short_by["GPU0"] > 0
    # one more layer would not fit: the search found the most
    host_w, gpu_w = split_weights(big, gpu_layers=r.chosen.gpu_layers + 1)
    more = breakdown(
        big, params=dataclasses.replace(r.chosen.params, gpu_layers=r.chosen.gpu_layers + 1), gpu_devices=1
    )
    assert {d.device: d for d in more}["GPU0"].total > Budget.of(hw).devices["GPU0"]
    assert gpu_w > 0 and host_w > 0


def test_cpu_only_with_speed(big: GGUFLayout) -> None:
    hw = machine(ram_gib=16)
    r = plan_placements(big, hw, params=FitParams(ctx_size=4096), budget=Budget.of(hw))
    assert r.verdict == "cpu" and r.chosen is not None and [p.name for p in r.placements] == ["cpu"]
    raw = r.chosen.raw_tokens_per_s
    assert raw is not None and 5 < raw < 15  # 40 GB/s over ~4.8 GB a token
    # nothing measured on this machine: a range, not one optimistic figure
    assert r.chosen.tokens_per_s is None and r.chosen.tokens_per_s_range is not None
    assert "tokens/s (not measured yet)" in r.summary


def test_apple_unified_memory_counts_ram(big: GGUFLayout) -> None:
    apple = unified_gpu("apple", "Apple M3 Max", source="sysctl")
    hw = dataclasses.replace(machine(ram_gib=36, gpus=(apple,)), os="darwin", arch="arm64")
    r = plan_placements(big, hw, params=FitParams(ctx_size=8192), budget=Budget.of(hw))
    assert r.verdict == "gpu"


def test_too_large_gives_advice(big: GGUFLayout) -> None:
    hw = machine(ram_gib=4)
    r = plan_placements(big, hw, params=FitParams(ctx_size=8192), budget=Budget.of(hw), ctx_is_auto=False)
    assert r.verdict == "too_large" and r.chosen is None and not r.fits
    text = " ".join(r.advice)
    assert "Q3_K_M" in text or "Q2_K" in text
    assert "needs" in r.summary and "free" in r.summary


def test_explicit_context_is_refused_with_largest_that_fits(big: GGUFLayout) -> None:
    hw = machine(ram_gib=8)
    r = plan_placements(big, hw, params=FitParams(ctx_size=131072), budget=Budget.of(hw), ctx_is_auto=False)
    assert not r.fits
    assert r.advice[0].startswith("a context of ") and "asked for 131072" in r.advice[0]
    assert any("q8_0 KV cache" in a for a in r.advice)


def test_advice_says_whether_each_step_is_enough(big: GGUFLayout) -> None:
    # the weights (about 4.7 GiB) overfill 5 GiB with what else is running: a smaller quantization that
    # fits is named as enough
    hw = machine(ram_gib=5)
    r = plan_placements(big, hw, params=FitParams(ctx_size=2048), budget=Budget.of(hw), ctx_is_auto=False)
    assert not r.fits
    quant = [a for a in r.advice if "quantization" in a]
    assert len(quant) == 1 and quant[0].endswith("enough to fit"), r.advice
    # a 4M-token context: the KV cache is what is large, so no quantization is offered (it would not fit),
    # and the q8_0 KV cache says it is not enough on its own, with what is still missing
    hw = machine(ram_gib=16)
    r = plan_placements(big, hw, params=FitParams(ctx_size=4 << 20), budget=Budget.of(hw), ctx_is_auto=False)
    assert not r.fits and not any("quantization" in a for a in r.advice), r.advice
    kv = next(a for a in r.advice if "q8_0" in a)
    assert "not enough on its own: still " in kv and "GiB short" in kv
    assert r.advice[0].startswith("a context of ")


def test_auto_context_shrinks_to_fit(big: GGUFLayout) -> None:
    hw = machine(ram_gib=8)
    r = plan_placements(big, hw, params=FitParams(ctx_size=131072), budget=Budget.of(hw), ctx_is_auto=True)
    assert r.fits and r.chosen is not None and r.ctx_reduced_from == 131072
    assert 0 < r.chosen.params.ctx_size < 131072 and "reduced from 131072" in r.summary


def test_loaded_lanes_reduce_the_gpu_budget(big: GGUFLayout) -> None:
    hw = machine(ram_gib=64, gpus=(nvidia(24564),))
    alone = plan_placements(big, hw, params=FitParams(ctx_size=8192), budget=Budget.of(hw))
    beside = plan_placements(
        big, hw, params=FitParams(ctx_size=8192), budget=Budget.of(hw, used={"GPU0": 18 * GIB})
    )
    assert alone.verdict == "gpu" and beside.verdict == "partial"
    assert (beside.chosen.max_ctx or 0) < (alone.chosen.max_ctx or 0)  # type: ignore[union-attr]


async def test_gateway_refuses_a_model_that_does_not_fit(tmp_path: Path) -> None:
    models = tmp_path / "models"
    write_tiny_gguf(models / "large.gguf", LARGE)
    # 8 layers x 4 KV heads x 128 dims x 2 bytes = 8 KiB a cell: 8M cells need 64 GiB of KV cache
    settings = Settings.flat(
        models_dirs=(models,), parallel=1, model_overrides={"large": {"ctx_size": 8 << 20}}
    )
    rt = Runtime(settings=settings, paths=Paths.from_env())
    async with rt:
        with pytest.raises(ModelTooLargeError, match="does not fit") as exc:
            await rt.supervisor.ensure("large")
        msg = exc.value.message
        assert "switchyard explain large" in msg and "a context of" in msg and "q8_0" in msg
        lane = rt.supervisor.get_lane("large")
        assert lane.proc is None  # no engine was started


def test_enforce_fit_off_plans_but_does_not_refuse(tmp_path: Path) -> None:
    from app.hardware.probe import probe
    from app.lanes.engines.llamacpp.kind import build_plan
    from app.library.catalog import Catalog

    models = tmp_path / "models"
    write_tiny_gguf(models / "large.gguf", LARGE)
    entry = Catalog([models]).get("large")
    hw = probe(engine=False)
    huge = {"large": {"ctx_size": 8 << 20}}
    with pytest.raises(ModelTooLargeError):
        build_plan(entry, Settings.flat(model_overrides=huge), StartContext(ppid=1, port=1, hardware=hw))
    plan = build_plan(
        entry,
        Settings.flat(model_overrides=huge, enforce_fit=False),
        StartContext(ppid=1, port=1, hardware=hw),
    )
    assert plan.fit is not None and not plan.fit.fits
    assert plan.params.ctx_size == 8 << 20  # the user's choice runs as asked


def test_no_offload_when_llama_cpp_sees_no_gpu(big: GGUFLayout) -> None:
    from app.hardware.model import EngineDevice

    cpu_dev = EngineDevice(
        name="CPU", description="test cpu", type="cpu", memory_free=None, memory_total=None
    )
    hw = dataclasses.replace(machine(ram_gib=64, gpus=(nvidia(24564),)), engine_devices=(cpu_dev,))
    r = plan_placements(big, hw, params=FitParams(ctx_size=8192), budget=Budget.of(hw))
    assert r.verdict == "cpu" and [p.name for p in r.placements] == ["cpu"]  # the CPU-only wheel
    cuda = EngineDevice(name="CUDA0", description="RTX 4090", type="gpu", memory_free=None, memory_total=None)
    hw = dataclasses.replace(hw, engine_devices=(cpu_dev, cuda))
    assert plan_placements(big, hw, params=FitParams(ctx_size=8192), budget=Budget.of(hw)).verdict == "gpu"


def test_integrated_gpus_other_than_apple_are_not_counted_twice(big: GGUFLayout) -> None:
    igpu = unified_gpu("intel", "Intel UHD 770", source="sysfs", pci_bus_id="0000:00:02.0")
    hw = machine(ram_gib=16, gpus=(igpu,))
    r = plan_placements(big, hw, params=FitParams(ctx_size=4096), budget=Budget.of(hw))
    assert r.verdict == "cpu" and set(Budget.of(hw).devices) == {"CPU"}


def test_engine_device_names_match_the_plan() -> None:
    from app.lanes.footprint import device_name

    assert [
        device_name(n) for n in ("CPU_Mapped", "CPU_REPACK", "CUDA0", "CUDA1", "Vulkan0", "ROCm2", "Metal")
    ] == [
        "CPU",
        "CPU",
        "GPU0",
        "GPU1",
        "GPU0",
        "GPU2",
        "GPU0",
    ]
