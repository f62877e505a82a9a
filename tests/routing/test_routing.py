"""Routing: every model format x hardware x installed engines, pins, architectures and memory fit.

`decide` is pure, so the inputs are built straight from the dataclasses (facts shaped like what the format
readers return for real files); a few tests at the end run real generated files through `detect_format`.

Expected outcomes are written one character per lane, in `LANES` order
(llama.cpp, mistral.rs, mlx, vllm, sglang, sd.cpp, whisper.cpp, piper; the capability lane llama.cpp-compat
joins only when a second llama.cpp build is registered, and tests/lanes/engines/llamacpp/test_compat.py
covers it):
`*` chosen, and for the others the rejection kind: F format, H hardware, N not_installed, B broken_model,
A architecture, D does_not_fit, P pinned_elsewhere, L lower_preference.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from app.formats.detect import ModelFormat, ModelKind, detect_format
from app.formats.diffusers_meta import DiffusersComponent, DiffusersPipeline
from app.formats.gguf_layout import KIND_DIFFUSION, KIND_LLM, KIND_PROJECTOR, GGUFLayout, ProjectorFacts
from app.formats.gguf_meta import GGUFFacts
from app.formats.hf_config import config_facts, quantization_facts
from app.formats.safetensors_meta import SafetensorsModel, WeightsSummary, mlx_evidence
from app.formats.speech_meta import PiperVoice, WhisperGGML
from app.hardware.model import CPUInfo, GPUInfo, Hardware, MemoryInfo
from app.routing import LANES, Decision, FitCheck, LaneInstall, check_pin, decide
from app.routing.engines import title

GiB = 1024**3
CODES = {
    "F": "format",
    "H": "hardware",
    "N": "not_installed",
    "B": "broken_model",
    "A": "architecture",
    "D": "does_not_fit",
    "P": "pinned_elsewhere",
    "L": "lower_preference",
}

# ------------------------------------------------------------------------------------------- hardware


def _gpu(vendor: Any, name: str, cc: str | None, memory: int, *, index: int = 0, **kw: Any) -> GPUInfo:
    return GPUInfo(
        index=index,
        vendor=vendor,
        name=name,
        memory_total=memory,
        memory_free=memory - GiB,
        memory_used=GiB,
        driver_version="550.54" if vendor == "nvidia" else None,
        compute_capability=cc,
        unified_memory=kw.get("unified", False),
        pci_bus_id=None if vendor == "apple" else f"0000:0{index + 1}:00.0",
        source=kw.get("source", "nvml" if vendor == "nvidia" else "sysfs"),
    )


def machine(os: str, arch: str, *gpus: GPUInfo) -> Hardware:
    flags = ("neon", "dotprod") if arch == "arm64" else ("avx2", "fma")
    return Hardware(
        os=os,
        arch=arch,
        cpu=CPUInfo("test cpu", 8, 16, 16, None, flags),
        memory=MemoryInfo(total=64 * GiB, available=48 * GiB, swap_total=0, swap_free=0, cgroup_limit=None),
        gpus=gpus,
        engine_devices=(),
        bandwidth=None,
    )


RTX4090 = _gpu("nvidia", "NVIDIA GeForce RTX 4090", "8.9", 24 * GiB)
GTX1080TI = _gpu("nvidia", "NVIDIA GeForce GTX 1080 Ti", "6.1", 11 * GiB)
HW = {
    "cpu-linux": machine("linux", "x86_64"),
    "nvidia-8.9": machine("linux", "x86_64", RTX4090),
    "nvidia-6.1": machine("linux", "x86_64", GTX1080TI),
    "apple": machine(
        "darwin", "arm64", _gpu("apple", "Apple M2 Pro", None, 32 * GiB, unified=True, source="sysctl")
    ),
    "amd": machine("linux", "x86_64", _gpu("amd", "AMD Radeon RX 7900 XTX", None, 24 * GiB)),
}
V100 = machine("linux", "x86_64", _gpu("nvidia", "Tesla V100-SXM2-16GB", "7.0", 16 * GiB))
RTX3090 = machine("linux", "x86_64", _gpu("nvidia", "NVIDIA GeForce RTX 3090", "8.6", 24 * GiB))
WINDOWS_NVIDIA = machine("windows", "x86_64", RTX4090)
INTEL_MAC = machine("darwin", "x86_64")

# ---------------------------------------------------------------------------------------------- models


def gguf_layout(
    *, kind: str = KIND_LLM, arch: str | None = "llama", name: str = "m-Q4_K_M.gguf"
) -> GGUFLayout:
    path = Path("/models") / name
    n = 2
    facts = None
    if arch is not None:
        facts = GGUFFacts(
            architecture=arch,
            name="m",
            context_length=4096,
            block_count=n,
            embedding_length=64,
            head_count=4,
            head_count_kv=2,
            pooling_type=None,
            chat_template=None,
            file_type="mostly_q4_k_m",
            tensor_bytes=1000,
            file_bytes=2000,
        )
    projector = None
    if kind == KIND_PROJECTOR:
        projector = ProjectorFacts("mlp", True, False, 2, 32, 4, 224, 14, 64, None, None)
    return GGUFLayout(
        path=path,
        parts=(path,),
        kind=kind,
        architecture=arch,
        facts=facts,
        file_type="mostly_q4_k_m",
        block_count=n,
        context_length=4096,
        embedding_length=64,
        vocab_size=32000,
        head_count=(4,) * n,
        head_count_kv=(2,) * n,
        feed_forward_length=(128,) * n,
        key_length=16,
        value_length=16,
        key_length_swa=None,
        value_length_swa=None,
        kv_lora_rank=None,
        sliding_window=None,
        swa_kind=None,
        swa_layers=(False,) * n,
        swa_rule="none",
        recurrent=None,
        recurrent_layers=(False,) * n,
        kv_layers=(True,) * n,
        expert_count=None,
        expert_used_count=None,
        expert_shared_count=None,
        expert_feed_forward_length=None,
        layer_bytes=(400,) * n,
        token_embd_bytes=100,
        output_bytes=100,
        output_tied=False,
        other_bytes=0,
        other_tensors=(),
        tensor_count=20,
        tensor_bytes=1000,
        file_bytes=2000,
        tensor_types=(("Q4_K", 1000),),
        projector=projector,
    )


def gguf(arch: str = "llama", *, companions: tuple[str, ...] = ()) -> ModelFormat:
    layout = gguf_layout(arch=arch)
    return ModelFormat(
        ModelKind.GGUF,
        layout.path,
        files=layout.parts,
        companions=tuple(Path("/models") / c for c in companions),
        facts=layout,
    )


def hf_config(architecture: str = "LlamaForCausalLM", model_type: str = "llama", **extra: Any) -> dict:
    return {
        "architectures": [architecture],
        "model_type": model_type,
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "torch_dtype": "bfloat16",
        **extra,
    }


def weights_folder(
    config: Mapping[str, Any], *, dtype: str = "BF16", metadata_format: str = "pt"
) -> ModelFormat:
    """A safetensors (or MLX) folder as `detect_format` reports it, built from a config dict."""
    quant = quantization_facts(config)
    weights = WeightsSummary(
        tensor_count=291,
        total_bytes=16 * GiB,
        stored_elements=8 * GiB,
        parameter_count=8 * GiB,
        elements_by_dtype=((dtype, 8 * GiB),),
        bytes_by_dtype=((dtype, 16 * GiB),),
        largest_tensor_bytes=GiB,
        metadata_format=metadata_format,
    )
    folder = Path("/models/llama-3.1-8b")
    evidence = mlx_evidence(config, metadata_format, has_npz=False)
    model = SafetensorsModel(
        path=folder,
        config=config_facts(config),
        quantization=quant,
        weights=weights,
        files=("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"),
        index_total_size=16 * GiB,
        mlx_evidence=evidence,
    )
    kind = ModelKind.MLX if evidence else ModelKind.SAFETENSORS
    return ModelFormat(kind, folder, files=tuple(folder / f for f in model.files), facts=model)


def _ct_group(weights: dict, acts: dict | None = None) -> dict:
    group: dict[str, Any] = {"targets": ["Linear"], "weights": weights}
    if acts:
        group["input_activations"] = acts
    return {"config_groups": {"group_0": group}}


QUANT_CONFIGS: dict[str, dict] = {
    "awq": {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm", "zero_point": True},
    "gptq": {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True},
    "fp8": {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
    },
    "ct-fp8": {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        **_ct_group(
            {"num_bits": 8, "type": "float", "strategy": "channel"},
            {"num_bits": 8, "type": "float", "dynamic": True},
        ),
    },
    "ct-w4a16": {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        **_ct_group({"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}),
    },
    "bnb": {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"},
    "hqq": {"quant_method": "hqq", "nbits": 4},
}


def quantized(method: str) -> ModelFormat:
    return weights_folder(hf_config(quantization_config=QUANT_CONFIGS[method]), dtype="I32")


def mlx_folder() -> ModelFormat:
    return weights_folder(
        hf_config(quantization={"group_size": 64, "bits": 4}), dtype="U32", metadata_format="mlx"
    )


def diffusers() -> ModelFormat:
    comps = tuple(
        DiffusersComponent(n, lib, cls, True, ("diffusion_pytorch_model.safetensors",), None, GiB)
        for n, lib, cls in (
            ("text_encoder", "transformers", "CLIPTextModel"),
            ("unet", "diffusers", "UNet2DConditionModel"),
            ("vae", "diffusers", "AutoencoderKL"),
        )
    )
    folder = Path("/models/sdxl")
    return ModelFormat(
        ModelKind.DIFFUSERS,
        folder,
        facts=DiffusersPipeline(folder, "StableDiffusionXLPipeline", "0.30.0", comps),
    )


def whisper() -> ModelFormat:
    path = Path("/models/ggml-base.en.bin")
    facts = WhisperGGML(path, 51864, 1500, 512, 8, 6, 448, 512, 8, 6, 80, "f16", 147_964_211)
    return ModelFormat(ModelKind.WHISPER_GGML, path, files=(path,), facts=facts)


def piper() -> ModelFormat:
    onnx = Path("/models/en_US-lessac-medium.onnx")
    cfg = onnx.with_name(onnx.name + ".json")
    voice = PiperVoice(
        onnx, cfg, 22050, "medium", "en-us", "en_US", 1, "espeak", "lessac", "1.0.0", 63_000_000
    )
    return ModelFormat(ModelKind.PIPER, onnx, files=(onnx, cfg), facts=voice)


def special(kind: ModelKind, facts: GGUFLayout | None = None, problem: str | None = None) -> ModelFormat:
    path = facts.path if facts else Path("/models/thing")
    return ModelFormat(kind, path, problem, files=(path,), facts=facts)


UNKNOWN_PROBLEM = (
    "notes.txt is not a model this app knows (it starts with b'# no'); use a .gguf or a model folder"
)
BROKEN_GGUF = "m-Q4_K_M.gguf is truncated (its tensors need 4 GiB, the file has 1 GiB); download it again"
BROKEN_ST = (
    "llama has config.json but PyTorch .bin weights, which this app does not read; download its *.safetensors"
)

MODELS = {
    "gguf": gguf(),
    "gguf+mmproj": gguf(companions=("mmproj-model-f16.gguf",)),
    "gguf-diffusion": special(ModelKind.GGUF_DIFFUSION, gguf_layout(kind=KIND_DIFFUSION, arch="flux")),
    "gguf-diffusion-noarch": special(ModelKind.GGUF_DIFFUSION, gguf_layout(kind=KIND_DIFFUSION, arch=None)),
    "mmproj": special(
        ModelKind.MMPROJ, gguf_layout(kind=KIND_PROJECTOR, arch="clip", name="mmproj-f16.gguf")
    ),
    "safetensors": weights_folder(hf_config()),
    **{f"st-{m}": quantized(m) for m in QUANT_CONFIGS},
    "mlx": mlx_folder(),
    "diffusers": diffusers(),
    "whisper": whisper(),
    "piper": piper(),
    "unknown": special(ModelKind.UNKNOWN, problem=UNKNOWN_PROBLEM),
    "broken-gguf": ModelFormat(ModelKind.GGUF, Path("/models/m-Q4_K_M.gguf"), BROKEN_GGUF),
    "broken-safetensors": ModelFormat(ModelKind.SAFETENSORS, Path("/models/llama"), BROKEN_ST),
}

# --------------------------------------------------------------------------------------------- engines


# the lanes every decision weighs when no second llama.cpp build is registered (as in every case here)
TABLE_LANES = tuple(lane for lane in LANES if lane != "llama.cpp-compat")


def installs(*lanes: str, **kw: Any) -> dict[str, LaneInstall]:
    return {lane: LaneInstall(lane, True, kw.get("version", "1.0"), kw.get("archs")) for lane in lanes}


INSTALLED = {
    "all": installs(*TABLE_LANES),
    # mistral.rs was looked for and not found: the note rides along into the message
    "llama": {
        **installs("llama.cpp"),
        "mistral.rs": LaneInstall("mistral.rs", False, None, None, "mistralrs-server is not on PATH"),
    },
    "none": {},
}

# ------------------------------------------------------------------------------------------------ table

ANY_HW = tuple(HW)
ST_QUANT_CUDA = ("st-awq", "st-gptq", "st-fp8", "st-ct-fp8", "st-ct-w4a16", "st-bnb")
TABLE: list[tuple[str, tuple[str, ...], str, str, str]] = [
    # model, hardware, then the outcome with: every lane installed / only llama.cpp / nothing installed
    ("gguf", ANY_HW, "*LFFFFFF", "*NFFFFFF", "NNFFFFFF"),
    ("gguf+mmproj", ANY_HW, "*LFFFFFF", "*NFFFFFF", "NNFFFFFF"),
    ("gguf-diffusion", ANY_HW, "FFFFF*FF", "FFFFFNFF", "FFFFFNFF"),
    ("gguf-diffusion-noarch", ANY_HW, "FFFFF*FF", "FFFFFNFF", "FFFFFNFF"),
    ("mmproj", ANY_HW, "FFFFFFFF", "FFFFFFFF", "FFFFFFFF"),
    ("safetensors", ("cpu-linux", "nvidia-6.1", "amd"), "F*HHHFFF", "FNHHHFFF", "FNHHHFFF"),
    ("safetensors", ("nvidia-8.9",), "FLH*LFFF", "FNHNNFFF", "FNHNNFFF"),
    ("safetensors", ("apple",), "FL*HHFFF", "FNNHHFFF", "FNNHHFFF"),
    *[(m, ("nvidia-8.9",), "FFFL*FFF", "FFFNNFFF", "FFFNNFFF") for m in ST_QUANT_CUDA],
    *[
        (m, ("cpu-linux", "nvidia-6.1", "apple", "amd"), "FFFHHFFF", "FFFHHFFF", "FFFHHFFF")
        for m in ST_QUANT_CUDA
    ],
    ("st-hqq", ANY_HW, "FFFFFFFF", "FFFFFFFF", "FFFFFFFF"),
    # every machine here is Apple Silicon or Linux, where the CPU build of mlx runs an MLX folder
    ("mlx", ANY_HW, "FF*FFFFF", "FFNFFFFF", "FFNFFFFF"),
    ("diffusers", ANY_HW, "FFFFF*FF", "FFFFFNFF", "FFFFFNFF"),
    ("whisper", ANY_HW, "FFFFFF*F", "FFFFFFNF", "FFFFFFNF"),
    ("piper", ANY_HW, "FFFFFFF*", "FFFFFFFN", "FFFFFFFN"),
    ("unknown", ANY_HW, "BBBBBBBB", "BBBBBBBB", "BBBBBBBB"),
    ("broken-gguf", ANY_HW, "BBFFFFFF", "BBFFFFFF", "BBFFFFFF"),
    ("broken-safetensors", ANY_HW, "FBBBBFFF", "FBBBBFFF", "FBBBBFFF"),
]
CASES = [
    pytest.param(model, hw, inst, codes, id=f"{model}-{hw}-{inst}")
    for model, hws, *outcomes in TABLE
    for hw in hws
    for inst, codes in zip(INSTALLED, outcomes, strict=True)
]


def outcome(d: Decision) -> str:
    """The decision in the table's notation."""
    inv = {v: k for k, v in CODES.items()}
    kinds = {r.lane: inv[r.kind] for r in d.rejections}
    return "".join("*" if lane == d.lane else kinds[lane] for lane in TABLE_LANES)


def check_shape(d: Decision) -> None:
    """Every lane is either chosen or rejected exactly once, with something to say."""
    lanes = [r.lane for r in d.rejections] + ([d.lane] if d.lane else [])
    assert sorted(lanes) == sorted(TABLE_LANES)
    assert all(r.message.strip() for r in d.rejections)
    assert d.reasons and all(r.strip() for r in d.reasons)
    assert json.loads(json.dumps(d.public())) == d.public()


def test_table_covers_every_format_and_machine() -> None:
    models = {model for model, *_ in TABLE}
    assert models == set(MODELS)
    for model in models:
        assert {hw for m, hws, *_ in TABLE if m == model for hw in hws} == set(HW), model
    assert {f.kind for f in MODELS.values()} == set(ModelKind)


@pytest.mark.parametrize(("model", "hw", "inst", "codes"), CASES)
def test_routing_table(model: str, hw: str, inst: str, codes: str) -> None:
    d = decide(MODELS[model], hardware=HW[hw], installed=INSTALLED[inst], model_id="m")
    assert outcome(d) == codes
    assert d.lane == (TABLE_LANES[codes.index("*")] if "*" in codes else None)
    assert d.format_kind is MODELS[model].kind
    assert not d.pinned
    check_shape(d)


# ------------------------------------------------------------------------------------- what it says


def route(
    model: str | ModelFormat, hw: Hardware | str = "cpu-linux", inst: str = "all", **kw: Any
) -> Decision:
    fmt = MODELS[model] if isinstance(model, str) else model
    hardware = HW[hw] if isinstance(hw, str) else hw
    installed = kw.pop("installed", INSTALLED[inst])
    d = decide(fmt, hardware=hardware, installed=installed, model_id=kw.pop("model_id", "m"), **kw)
    check_shape(d)
    return d


def message(d: Decision, lane: str) -> str:
    r = d.rejection(lane)
    assert r is not None
    return r.message


def test_gguf_reasons_name_the_format_and_the_projector() -> None:
    d = route("gguf+mmproj")
    assert "GGUF is llama.cpp's own format" in d.reasons[0]
    assert "mmproj-model-f16.gguf" in d.reasons[0]
    assert "No GPU" in " ".join(d.reasons)
    assert "llama.cpp 1.0 is installed." in d.reasons
    assert "switchyard pin m mistral.rs" in message(d, "mistral.rs")
    assert "llama.cpp or mistral.rs run it" in message(d, "vllm")


def test_projector_alone_has_no_lane() -> None:
    d = route("mmproj")
    assert d.lane is None
    assert "a vision projector is loaded with its model, not on its own" in d.reasons[0]
    assert "a vision projector is loaded with its model, not on its own" in message(d, "llama.cpp")


def test_unknown_and_broken_models_carry_the_problem() -> None:
    d = route("unknown")
    assert UNKNOWN_PROBLEM in d.reasons[0]
    assert all(r.message == UNKNOWN_PROBLEM for r in d.rejections)
    d = route("broken-gguf")
    assert BROKEN_GGUF in d.reasons[0]
    assert message(d, "llama.cpp") == BROKEN_GGUF
    assert "does not run" not in message(d, "vllm") and "GGUF" in message(d, "vllm")
    blank = route(ModelFormat(ModelKind.UNKNOWN, Path("/models/x")))
    assert "not a model format Switchyard knows" in blank.reasons[0]


def test_not_installed_says_how_to_install_and_keeps_the_note() -> None:
    d = route("gguf", inst="llama")
    assert "mistralrs-server is not on PATH" in message(d, "mistral.rs")
    d = route("safetensors", "nvidia-8.9", inst="none")
    assert "pip install vllm" in message(d, "vllm")
    assert "pip install sglang" in message(d, "sglang")
    assert "every lane that reads it was turned down (not installed, hardware)" in d.reasons[0]


def test_plain_safetensors_fall_back_and_say_which_lanes_came_first() -> None:
    d = route("safetensors", "cpu-linux")
    assert d.lane == "mistral.rs"
    assert "vLLM, SGLang and MLX come first for plain safetensors (LlamaForCausalLM)" in d.reasons[1]
    assert "(hardware)" in d.reasons[1]
    assert "NVIDIA GPU" in message(d, "vllm") and "no GPU" in message(d, "vllm")
    assert "Apple Silicon" in message(d, "mlx")
    assert "download a GGUF build" in message(d, "llama.cpp")
    amd = route("safetensors", "amd")
    assert "AMD Radeon RX 7900 XTX" in message(amd, "sglang")


def test_nvidia_reason_names_the_card_and_its_compute_capability() -> None:
    d = route("safetensors", "nvidia-8.9")
    assert d.lane == "vllm"
    assert "RTX 4090 here has compute capability 8.9; vLLM needs 7.0 or newer" in " ".join(d.reasons)
    old = route("safetensors", "nvidia-6.1")
    assert "needs compute capability 7.0 or newer; the NVIDIA GeForce GTX 1080 Ti here is 6.1" in message(
        old, "vllm"
    )


def test_apple_silicon_runs_plain_safetensors_on_mlx() -> None:
    d = route("safetensors", "apple")
    assert d.lane == "mlx"
    assert "Metal" in " ".join(d.reasons)
    assert "Linux" in message(d, "vllm")


def test_mlx_folder_on_linux_is_the_slow_cpu_fallback() -> None:
    linux = route("mlx", "nvidia-8.9")
    assert linux.lane == "mlx"
    assert any("CPU build of MLX" in r and "slow" in r for r in linux.reasons)
    mac = route("mlx", "apple")
    assert not any("slow" in r for r in mac.reasons)


@pytest.mark.parametrize("hw", [INTEL_MAC, WINDOWS_NVIDIA], ids=["intel-mac", "windows"])
def test_mlx_needs_apple_silicon_or_linux(hw: Hardware) -> None:
    d = route("mlx", hw)
    assert outcome(d) == "FFHFFFFF"
    assert "Apple Silicon" in message(d, "mlx")


def test_cuda_lanes_need_linux() -> None:
    d = route("safetensors", WINDOWS_NVIDIA)
    assert outcome(d) == "F*HHHFFF"
    assert "Linux only" in message(d, "vllm") and "WSL2" in message(d, "vllm")


@pytest.mark.parametrize(
    ("model", "hw", "codes", "needs"),
    [
        ("st-awq", V100, "FFFHHFFF", "7.5 or newer for AWQ kernels"),
        ("st-gptq", V100, "FFFL*FFF", None),
        ("st-fp8", RTX3090, "FFFHHFFF", "8.9 or newer for FP8 weights"),
        ("st-ct-fp8", RTX3090, "FFFHHFFF", "8.9 or newer for FP8 weights"),
        ("st-ct-w4a16", RTX3090, "FFFL*FFF", None),
        ("st-fp8", HW["nvidia-8.9"], "FFFL*FFF", None),
    ],
)
def test_quantized_weights_need_their_compute_capability(
    model: str, hw: Hardware, codes: str, needs: str | None
) -> None:
    d = route(model, hw)
    assert outcome(d) == codes
    if needs:
        assert needs in message(d, "sglang") and needs in message(d, "vllm")
        assert "GGUF build" in message(d, "vllm")


def test_quantized_reasons_and_format_rejections() -> None:
    d = route("st-awq", "nvidia-8.9")
    assert d.reasons[0].startswith(
        "This is AWQ-quantized safetensors (LlamaForCausalLM), which needs CUDA kernels"
    )
    assert "AWQ-quantized safetensors" in message(d, "mistral.rs")
    ct = route("st-ct-fp8", "nvidia-8.9")
    assert "compressed-tensors W8A8-fp8 safetensors" in ct.reasons[0]
    assert "8.9 or newer for FP8 weights" in " ".join(ct.reasons)
    hqq = route("st-hqq", "nvidia-8.9")
    assert "'hqq'" in hqq.reasons[0] and "'hqq'" in message(hqq, "vllm")


def test_gpu_with_unreadable_compute_capability_is_tried_with_a_warning() -> None:
    hw = machine("linux", "x86_64", _gpu("nvidia", "NVIDIA A100", None, 80 * GiB, source="sysfs"))
    d = route("safetensors", hw)
    assert d.lane == "vllm"
    assert any("could not be read" in r for r in d.reasons)


def test_best_of_several_nvidia_gpus_counts() -> None:
    hw = machine("linux", "x86_64", GTX1080TI, _gpu("nvidia", "NVIDIA L40S", "8.9", 48 * GiB, index=1))
    d = route("st-fp8", hw)
    assert d.lane == "sglang"
    assert "L40S" in " ".join(d.reasons)


# ------------------------------------------------------------------------------------------------- pins


def test_pin_to_a_lane_that_can_run_it_wins() -> None:
    d = route("gguf", pins={"m": "mistral.rs"})
    assert outcome(d) == "P*FFFFFF"
    assert d.pinned
    assert d.reasons[0] == "You pinned this model to mistral.rs."
    assert "mistral.rs reads GGUF too" in d.reasons[1]
    assert "you pinned this model to mistral.rs" in message(d, "llama.cpp")


def test_pin_to_the_usual_lane_marks_the_others_pinned_elsewhere() -> None:
    d = route("safetensors", "nvidia-8.9", pins={"m": "sglang"})
    assert outcome(d) == "FPHP*FFF"
    assert d.pinned
    d = route("safetensors", "nvidia-8.9", pins={"m": "vllm"})
    assert outcome(d) == "FPH*PFFF"


def test_pins_of_other_models_do_not_apply() -> None:
    d = route("gguf", pins={"other": "mistral.rs"})
    assert outcome(d) == "*LFFFFFF" and not d.pinned


@pytest.mark.parametrize(
    ("model", "hw", "inst", "pin", "codes", "why"),
    [
        ("gguf", "cpu-linux", "llama", "mistral.rs", "*NFFFFFF", "(not installed)"),
        ("gguf", "nvidia-8.9", "all", "vllm", "*LFFFFFF", "(format)"),
        ("safetensors", "cpu-linux", "all", "vllm", "F*HHHFFF", "(hardware)"),
        ("st-fp8", RTX3090, "all", "sglang", "FFFHHFFF", "8.9 or newer"),
        ("mmproj", "cpu-linux", "all", "llama.cpp", "FFFFFFFF", "(format)"),
        ("gguf", "cpu-linux", "none", "llama.cpp", "NNFFFFFF", "(not installed)"),
        ("gguf", "cpu-linux", "all", "ollama", "*LFFFFFF", "no lane named 'ollama'"),
    ],
)
def test_pin_refused_falls_back_and_says_why_first(
    model: str, hw: str | Hardware, inst: str, pin: str, codes: str, why: str
) -> None:
    d = route(model, hw, inst, pins={"m": pin})
    assert outcome(d) == codes
    assert not d.pinned
    assert d.reasons[0].startswith(f"The pin to {title(pin)} was refused: ")
    assert "was refused" in d.reasons[0] and why in d.reasons[0]
    fmt = MODELS[model]
    refusal = check_pin(fmt, pin, hardware=HW[hw] if isinstance(hw, str) else hw, installed=INSTALLED[inst])
    assert refusal is not None and why in refusal and refusal in d.reasons[0]


def test_pin_refused_when_it_does_not_fit() -> None:
    def fit(lane: str) -> FitCheck | None:
        return (
            FitCheck(False, "needs 9.1 GiB, 6.0 GiB free") if lane == "mistral.rs" else FitCheck(True, "ok")
        )

    d = route("gguf", pins={"m": "mistral.rs"}, fit=fit)
    assert outcome(d) == "*DFFFFFF"
    assert "does not fit" in d.reasons[0] and "needs 9.1 GiB, 6.0 GiB free" in d.reasons[0]
    assert check_pin(
        MODELS["gguf"], "mistral.rs", hardware=HW["cpu-linux"], installed=INSTALLED["all"], fit=fit
    )


def test_check_pin_accepts_a_lane_that_can_run_it() -> None:
    for lane in ("llama.cpp", "mistral.rs"):
        assert check_pin(MODELS["gguf"], lane, hardware=HW["cpu-linux"], installed=INSTALLED["all"]) is None
    assert (
        check_pin(MODELS["safetensors"], "sglang", hardware=HW["nvidia-8.9"], installed=INSTALLED["all"])
        is None
    )
    refusal = check_pin(MODELS["safetensors"], "mlx", hardware=HW["nvidia-8.9"], installed=INSTALLED["all"])
    assert refusal is not None and refusal.startswith("MLX cannot run this model (hardware)")


# ---------------------------------------------------------------------------------------- architectures


def test_architecture_the_engine_version_does_not_list() -> None:
    installed = {
        **INSTALLED["all"],
        **installs("vllm", version="0.6.3", archs=frozenset({"LlamaForCausalLM"})),
    }
    gemma = weights_folder(hf_config("Gemma3ForCausalLM", "gemma3"))
    d = route(gemma, "nvidia-8.9", installed=installed)
    assert outcome(d) == "FLHA*FFF"
    msg = message(d, "vllm")
    assert "vLLM 0.6.3 does not support the Gemma3ForCausalLM architecture" in msg
    assert "upgrade vLLM" in msg and "SGLang" in msg
    assert "vLLM comes first" in d.reasons[1] and "(architecture)" in d.reasons[1]
    # the same engine runs the architecture it does list
    assert route("safetensors", "nvidia-8.9", installed=installed).lane == "vllm"


def test_gguf_architecture_and_unknown_version() -> None:
    installed = {
        **INSTALLED["all"],
        "llama.cpp": LaneInstall("llama.cpp", True, None, frozenset({"llama", "qwen2"})),
    }
    d = route(gguf("qwen3next"), installed=installed)
    assert outcome(d) == "A*FFFFFF"
    assert "the installed llama.cpp (version unknown) does not support the qwen3next" in message(
        d, "llama.cpp"
    )
    assert route(gguf("qwen2"), installed=installed).lane == "llama.cpp"


def test_architecture_matches_model_type_and_ignores_case() -> None:
    installed = {**INSTALLED["all"], **installs("vllm", archs=frozenset({"LLAMA"}))}
    assert route("safetensors", "nvidia-8.9", installed=installed).lane == "vllm"


def test_unknown_architecture_lists_let_any_model_through() -> None:
    d = route(gguf("nosucharch"))
    assert d.lane == "llama.cpp"


# ------------------------------------------------------------------------------------------------- fit


def test_does_not_fit_turns_the_lane_down_with_the_summary() -> None:
    calls: list[str] = []

    def fit(lane: str) -> FitCheck | None:
        calls.append(lane)
        if lane in ("vllm", "sglang"):
            return FitCheck(False, "weights 16.1 GiB + KV cache 2.0 GiB > 23.0 GiB free on the RTX 4090")
        return None

    d = route("safetensors", "nvidia-8.9", fit=fit)
    assert outcome(d) == "F*HDDFFF"
    assert message(d, "vllm").startswith("weights 16.1 GiB")
    assert "turned down (does not fit, hardware)" in d.reasons[1]
    assert not any(r.startswith("It fits") for r in d.reasons)  # unknown for mistral.rs: nothing said
    assert sorted(calls) == ["mistral.rs", "sglang", "vllm"]  # only lanes that passed every other check


def test_fits_is_a_reason() -> None:
    d = route("gguf", fit=lambda lane: FitCheck(True, "all 33 layers on the GPU, 32768 tokens of context"))
    assert d.reasons[-1] == "It fits: all 33 layers on the GPU, 32768 tokens of context"


def test_nothing_fits_means_no_lane() -> None:
    d = route("gguf", fit=lambda lane: FitCheck(False, "needs 70 GiB, the machine has 64 GiB"))
    assert outcome(d) == "DDFFFFFF"
    assert d.lane is None
    assert "(does not fit)" in d.reasons[0]


# ---------------------------------------------------------------------------------------- output forms


def test_public_is_json_with_every_rejection() -> None:
    d = route("gguf", inst="llama", model_id="tiny-llama")
    pub = d.public()
    assert pub["model_id"] == "tiny-llama" and pub["format"] == "gguf" and pub["lane"] == "llama.cpp"
    assert pub["pinned"] is False
    assert [r["lane"] for r in pub["rejections"]] == [lane for lane in TABLE_LANES if lane != "llama.cpp"]
    assert pub["rejections"][0]["kind"] == "not_installed"


def test_rejections_list_the_formats_lanes_first() -> None:
    d = route("st-awq", "nvidia-8.9")
    assert [r.lane for r in d.rejections][:1] == ["vllm"]
    d = route("safetensors", "cpu-linux")
    assert [r.lane for r in d.rejections][:3] == ["vllm", "sglang", "mlx"]


def test_render_text_explains_the_choice_and_every_rejection() -> None:
    d = route("safetensors", "nvidia-8.9", pins={"llama-3.1-8b": "sglang"}, model_id="llama-3.1-8b")
    text = d.render_text()
    lines = text.splitlines()
    assert lines[0] == "model:  llama-3.1-8b (safetensors)"
    assert lines[1] == "lane:   SGLang (pinned)"
    assert "  - You pinned this model to SGLang." in lines
    for name in ("vLLM", "MLX", "mistral.rs", "llama.cpp", "Piper", "stable-diffusion.cpp", "whisper.cpp"):
        assert any(line.startswith(f"  {name} [") for line in lines), name
    assert "  vLLM [pinned elsewhere]" in lines
    assert all(len(line) <= 100 for line in lines)
    none = route("mmproj").render_text()
    assert "lane:   none" in none


# -------------------------------------------------------------------------------------------- real files


def test_real_files_route_like_their_facts(tmp_path: Path) -> None:
    from tests.support.modelgen import (
        DIMS_DEFAULT,
        GGUFSpec,
        llama_tensors,
        write_diffusers,
        write_gguf,
        write_hf_dir,
        write_mmproj,
        write_piper_voice,
        write_whisper_ggml,
    )

    write_gguf(tmp_path / "chat" / "chat-Q8_0.gguf", GGUFSpec())
    write_mmproj(tmp_path / "chat" / "mmproj-chat-f16.gguf")
    write_mmproj(tmp_path / "proj" / "mmproj-alone.gguf")
    write_hf_dir(
        tmp_path / "hf", DIMS_DEFAULT.config(), llama_tensors(DIMS_DEFAULT), metadata={"format": "pt"}
    )
    awq = DIMS_DEFAULT.config(quantization_config={"quant_method": "awq", "bits": 4, "group_size": 32})
    write_hf_dir(tmp_path / "awq", awq, llama_tensors(DIMS_DEFAULT, "awq"))
    write_hf_dir(
        tmp_path / "mlx", DIMS_DEFAULT.config(), llama_tensors(DIMS_DEFAULT), metadata={"format": "mlx"}
    )
    write_diffusers(tmp_path / "sd")
    write_whisper_ggml(tmp_path / "ggml-tiny.en.bin")
    voice = write_piper_voice(tmp_path / "voice")
    expected = {
        tmp_path / "chat": ("nvidia-8.9", "llama.cpp"),
        tmp_path / "proj" / "mmproj-alone.gguf": ("cpu-linux", None),
        tmp_path / "hf": ("nvidia-8.9", "vllm"),
        tmp_path / "awq": ("nvidia-8.9", "sglang"),
        tmp_path / "mlx": ("apple", "mlx"),
        tmp_path / "sd": ("amd", "sd.cpp"),
        tmp_path / "ggml-tiny.en.bin": ("cpu-linux", "whisper.cpp"),
        voice: ("apple", "piper"),
        tmp_path / "nothing-here": ("cpu-linux", None),
    }
    for path, (hw, lane) in expected.items():
        fmt = detect_format(path)
        d = route(fmt, hw)
        assert d.lane == lane, (path, fmt.kind, fmt.problem, d.reasons)
    chat = route(detect_format(tmp_path / "chat"))
    assert "mmproj-chat-f16.gguf" in chat.reasons[0]


def test_pin_command_in_messages_quotes_the_model_id() -> None:
    d = route("gguf", model_id="my model")
    assert "`switchyard pin 'my model' mistral.rs`" in message(d, "mistral.rs")
    d = route("gguf", model_id="Qwen/Qwen3-8B-GGUF:Q4_K_M")
    assert "`switchyard pin Qwen/Qwen3-8B-GGUF:Q4_K_M mistral.rs`" in message(d, "mistral.rs")


def test_an_encoder_folder_is_turned_down_by_every_lane_with_the_reason() -> None:
    bert = weights_folder(hf_config("BertModel", "bert"))
    d = route(bert, "nvidia-8.9", installed=INSTALLED["all"])
    assert d.lane is None
    assert "BertModel (an encoder or classifier), not a text-generation model" in d.reasons[0]
    # a generative head of any family still routes
    assert route(weights_folder(hf_config("T5ForConditionalGeneration", "t5")), "nvidia-8.9").lane is not None
