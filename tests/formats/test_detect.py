"""detect_format on every kind of model file and folder, and on broken ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.formats.detect import ModelKind, detect_format
from app.formats.diffusers_meta import DiffusersPipeline
from app.formats.gguf_layout import GGUFLayout
from app.formats.safetensors_meta import SafetensorsModel
from app.formats.speech_meta import PiperVoice, WhisperGGML
from tests.support.modelgen import (
    DIMS_DEFAULT,
    GGUFSpec,
    WhisperSpec,
    llama_tensors,
    write_diffusers,
    write_diffusion_gguf,
    write_gguf,
    write_hf_dir,
    write_mmproj,
    write_piper_voice,
    write_safetensors,
    write_whisper_ggml,
)


def test_gguf_file(tmp_path: Path) -> None:
    w = write_gguf(tmp_path / "m.gguf", GGUFSpec(arch="qwen2", n_layer=3))
    fmt = detect_format(w.path)
    assert fmt.kind is ModelKind.GGUF and fmt.ok and fmt.problem is None
    assert isinstance(fmt.facts, GGUFLayout) and fmt.facts.architecture == "qwen2"
    assert fmt.files == (w.path,)


def test_gguf_folder_with_projector(tmp_path: Path) -> None:
    w = write_gguf(tmp_path / "model-Q4.gguf", GGUFSpec())
    proj = write_mmproj(tmp_path / "mmproj-model-f16.gguf")
    fmt = detect_format(tmp_path)
    assert fmt.kind is ModelKind.GGUF and fmt.path == w.path
    assert fmt.companions == (proj.path,)


def test_folder_with_two_gguf_models(tmp_path: Path) -> None:
    write_gguf(tmp_path / "a.gguf", GGUFSpec())
    write_gguf(tmp_path / "b.gguf", GGUFSpec())
    fmt = detect_format(tmp_path)
    assert fmt.kind is ModelKind.UNKNOWN and "2 GGUF models (a.gguf, b.gguf)" in (fmt.problem or "")


def test_mmproj(tmp_path: Path) -> None:
    fmt = detect_format(write_mmproj(tmp_path / "vision.gguf").path)  # found by its keys, not its name
    assert fmt.kind is ModelKind.MMPROJ and fmt.ok
    assert isinstance(fmt.facts, GGUFLayout) and fmt.facts.projector is not None


@pytest.mark.parametrize("arch", ["flux", None])
def test_diffusion_gguf(tmp_path: Path, arch: str | None) -> None:
    fmt = detect_format(write_diffusion_gguf(tmp_path / "unet.gguf", arch=arch).path)
    assert fmt.kind is ModelKind.GGUF_DIFFUSION and fmt.ok


def test_multipart_gguf_folder(tmp_path: Path) -> None:
    w = write_gguf(tmp_path / "m.gguf", GGUFSpec(n_layer=3, split_max_tensors=10))
    fmt = detect_format(tmp_path)
    assert fmt.kind is ModelKind.GGUF and fmt.path == w.paths[0] and fmt.files == w.paths
    assert detect_format(w.paths[2]).files == w.paths


def test_safetensors_folder_and_its_files(tmp_path: Path) -> None:
    write_hf_dir(
        tmp_path, DIMS_DEFAULT.config(), llama_tensors(DIMS_DEFAULT), shards=2, metadata={"format": "pt"}
    )
    for target in (tmp_path, tmp_path / "config.json", tmp_path / "model-00001-of-00002.safetensors"):
        fmt = detect_format(target)
        assert fmt.kind is ModelKind.SAFETENSORS and fmt.ok and fmt.path == tmp_path
        assert isinstance(fmt.facts, SafetensorsModel) and fmt.facts.config.num_layers == 2
        assert len(fmt.files) == 2


def test_mlx_by_quantization_key(tmp_path: Path) -> None:
    config = DIMS_DEFAULT.config(quantization={"group_size": 32, "bits": 4})
    write_hf_dir(tmp_path, config, llama_tensors(DIMS_DEFAULT, "mlx"))
    fmt = detect_format(tmp_path)
    assert fmt.kind is ModelKind.MLX and fmt.ok
    assert isinstance(fmt.facts, SafetensorsModel) and fmt.facts.quantization is not None
    assert fmt.facts.quantization.bits == 4


def test_mlx_by_header_metadata(tmp_path: Path) -> None:
    write_hf_dir(tmp_path, DIMS_DEFAULT.config(), llama_tensors(DIMS_DEFAULT), metadata={"format": "mlx"})
    assert detect_format(tmp_path).kind is ModelKind.MLX


def test_mlx_by_weights_npz(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(DIMS_DEFAULT.config()))
    (tmp_path / "weights.npz").write_bytes(b"PK\x03\x04")
    fmt = detect_format(tmp_path)
    assert fmt.kind is ModelKind.MLX and fmt.ok
    assert isinstance(fmt.facts, SafetensorsModel) and fmt.facts.weights is None
    assert fmt.facts.mlx_evidence == "the folder has weights.npz"


def test_plain_safetensors_is_not_mlx(tmp_path: Path) -> None:
    write_hf_dir(tmp_path, DIMS_DEFAULT.config(), llama_tensors(DIMS_DEFAULT), metadata={"format": "pt"})
    assert detect_format(tmp_path).kind is ModelKind.SAFETENSORS


def test_diffusers_pipeline(tmp_path: Path) -> None:
    expected = write_diffusers(tmp_path)
    fmt = detect_format(tmp_path)
    assert fmt.kind is ModelKind.DIFFUSERS and fmt.ok
    p = fmt.facts
    assert isinstance(p, DiffusersPipeline)
    assert p.class_name == "StableDiffusionPipeline" and p.diffusers_version == "0.30.0"
    parts = {c.name: c for c in p.components}
    assert set(parts) == {"unet", "vae", "text_encoder", "tokenizer", "scheduler", "safety_checker"}
    assert parts["unet"].weight_bytes == expected["unet"]  # the fp16 variant is not counted twice
    assert parts["unet"].weight_files == ("diffusion_pytorch_model.safetensors",)
    assert (
        parts["text_encoder"].library == "transformers"
        and parts["text_encoder"].class_name == "CLIPTextModel"
    )
    assert parts["safety_checker"].library is None and not parts["safety_checker"].present
    assert parts["tokenizer"].weight_bytes == 0
    assert p.weight_bytes == sum(expected.values())


def test_diffusers_only_variant_counted(tmp_path: Path) -> None:
    write_diffusers(tmp_path)
    (tmp_path / "unet" / "diffusion_pytorch_model.safetensors").unlink()
    p = detect_format(tmp_path).facts
    assert isinstance(p, DiffusersPipeline)
    unet = next(c for c in p.components if c.name == "unet")
    assert unet.variant == "fp16" and unet.weight_bytes == 32 * 4 * 9 * 2 * 2


def test_whisper_ggml(tmp_path: Path) -> None:
    size = write_whisper_ggml(tmp_path / "ggml-tiny.en.bin")
    fmt = detect_format(tmp_path / "ggml-tiny.en.bin")
    assert fmt.kind is ModelKind.WHISPER_GGML and fmt.ok
    w = fmt.facts
    assert isinstance(w, WhisperGGML)
    assert (w.n_audio_layer, w.n_text_layer, w.n_audio_state, w.n_mels) == (4, 4, 384, 80)
    assert w.size_name == "tiny" and not w.multilingual and w.ftype == "f16"
    assert w.n_audio_ctx == 1500 and w.n_text_ctx == 448 and w.file_bytes == size
    assert detect_format(tmp_path).kind is ModelKind.WHISPER_GGML  # the folder holding it


def test_whisper_large_v3_quantized(tmp_path: Path) -> None:
    spec = WhisperSpec(
        n_vocab=51866, n_audio_layer=32, n_text_layer=32, n_audio_state=1280, n_mels=128, ftype=1009
    )
    write_whisper_ggml(tmp_path / "ggml-large-v3-q5_1.bin", spec)
    w = detect_format(tmp_path / "ggml-large-v3-q5_1.bin").facts
    assert isinstance(w, WhisperGGML)
    assert w.size_name == "large" and w.multilingual and w.n_mels == 128
    assert w.ftype == "q5_1"  # 1009: quantization version 1, type 9


def test_whisper_truncated(tmp_path: Path) -> None:
    p = tmp_path / "ggml-base.bin"
    write_whisper_ggml(p, WhisperSpec(n_audio_layer=6))
    p.write_bytes(p.read_bytes()[:200])
    fmt = detect_format(p)
    assert fmt.kind is ModelKind.WHISPER_GGML and "truncated" in (fmt.problem or "")


def test_ggml_that_is_not_whisper(tmp_path: Path) -> None:
    p = tmp_path / "old-llama.bin"
    write_whisper_ggml(p, WhisperSpec(n_mels=0))
    fmt = detect_format(p)
    assert fmt.kind is ModelKind.UNKNOWN and "not whisper's" in (fmt.problem or "")


def test_piper_voice_three_ways(tmp_path: Path) -> None:
    onnx = write_piper_voice(tmp_path)
    for target in (onnx, onnx.with_name(onnx.name + ".json"), tmp_path):
        fmt = detect_format(target)
        assert fmt.kind is ModelKind.PIPER and fmt.ok and fmt.path == onnx
        v = fmt.facts
        assert isinstance(v, PiperVoice)
        assert (v.sample_rate, v.espeak_voice, v.language_code, v.quality) == (
            22050,
            "en-us",
            "en_US",
            "medium",
        )
        assert v.num_speakers == 1 and v.onnx_bytes == onnx.stat().st_size
        assert fmt.files == (onnx, onnx.with_name(onnx.name + ".json"))


def test_piper_without_config(tmp_path: Path) -> None:
    onnx = write_piper_voice(tmp_path)
    onnx.with_name(onnx.name + ".json").unlink()
    for target in (onnx, tmp_path):
        fmt = detect_format(target)
        assert fmt.kind is ModelKind.PIPER and "has no en_US-test-medium.onnx.json" in (fmt.problem or "")


def test_piper_bad_model_bytes(tmp_path: Path) -> None:
    onnx = write_piper_voice(tmp_path, audio={"sample_rate": 16000})
    onnx.write_bytes(b"<html>not found</html>")
    fmt = detect_format(onnx)
    assert fmt.kind is ModelKind.PIPER and "not an ONNX model" in (fmt.problem or "")


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("m.gguf", ModelKind.GGUF),
        ("ggml-base.bin", ModelKind.WHISPER_GGML),
        ("voice.onnx", ModelKind.PIPER),
        ("x.safetensors", ModelKind.UNKNOWN),
    ],
)
def test_zero_byte_files(tmp_path: Path, name: str, kind: ModelKind) -> None:
    (tmp_path / name).write_bytes(b"")
    fmt = detect_format(tmp_path / name)
    assert fmt.kind is kind and not fmt.ok
    assert fmt.problem == f"{name} is empty; download it again"


def test_truncated_gguf(tmp_path: Path) -> None:
    w = write_gguf(tmp_path / "m.gguf", GGUFSpec())
    w.path.write_bytes(w.path.read_bytes()[:-4000])
    fmt = detect_format(w.path)
    assert fmt.kind is ModelKind.GGUF and "truncated" in (fmt.problem or "")


def test_corrupt_config_json(tmp_path: Path) -> None:
    write_safetensors(tmp_path / "model.safetensors", {"w": ("F32", (4,))})
    (tmp_path / "config.json").write_text('{"hidden_size": ')
    fmt = detect_format(tmp_path)
    assert fmt.kind is ModelKind.SAFETENSORS and "config.json is not valid JSON" in (fmt.problem or "")


def test_corrupt_model_index(tmp_path: Path) -> None:
    (tmp_path / "model_index.json").write_text("")
    fmt = detect_format(tmp_path)
    assert fmt.kind is ModelKind.DIFFUSERS and fmt.problem == "model_index.json is empty; download it again"


def test_pytorch_bin_folder(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(DIMS_DEFAULT.config()))
    (tmp_path / "pytorch_model.bin").write_bytes(b"PK\x03\x04")
    fmt = detect_format(tmp_path)
    assert fmt.kind is ModelKind.SAFETENSORS and "PyTorch .bin weights" in (fmt.problem or "")


def test_lone_safetensors_file(tmp_path: Path) -> None:
    write_safetensors(tmp_path / "lora.safetensors", {"w": ("F16", (4, 4))})
    fmt = detect_format(tmp_path / "lora.safetensors")
    assert fmt.kind is ModelKind.UNKNOWN and "lone safetensors file" in (fmt.problem or "")


def test_unknown_things(tmp_path: Path) -> None:
    missing = detect_format(tmp_path / "nope")
    assert missing.kind is ModelKind.UNKNOWN and "nothing at" in (missing.problem or "")
    (tmp_path / "notes.txt").write_text("hello")
    text = detect_format(tmp_path / "notes.txt")
    assert text.kind is ModelKind.UNKNOWN and "starts with b'hell'" in (text.problem or "")
    empty = tmp_path / "empty"
    empty.mkdir()
    folder = detect_format(empty)
    assert folder.kind is ModelKind.UNKNOWN and (folder.problem or "").startswith("no model found in empty")
