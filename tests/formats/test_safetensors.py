"""Safetensors folders and config.json: shapes, quantization schemes, parameter counts from headers."""

from __future__ import annotations

import json
import struct
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from app.formats.hf_config import config_facts, quantization_facts
from app.formats.safetensors_meta import (
    SafetensorsModel,
    SafetensorsProblem,
    WeightsSummary,
    model_from_metadata,
    read_header,
    read_safetensors_dir,
    summarize_headers,
)
from tests.support.modelgen import (
    LlamaDims,
    linear_tensors,
    llama_tensors,
    safetensors_header,
    write_hf_dir,
    write_safetensors,
)

DIMS = LlamaDims()


def read_ok(folder: Path) -> SafetensorsModel:
    model = read_safetensors_dir(folder)
    assert isinstance(model, SafetensorsModel), model
    return model


def test_plain_llama_folder(tmp_path: Path) -> None:
    write_hf_dir(tmp_path, DIMS.config(), llama_tensors(DIMS), metadata={"format": "pt"})
    model = read_ok(tmp_path)
    c = model.config
    assert c.architectures == ("LlamaForCausalLM",) and c.model_type == "llama"
    assert (c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads) == (64, 2, 4, 2)
    assert c.head_dim == 16 and c.vocab_size == 100 and c.max_position_embeddings == 8192
    assert c.torch_dtype == "bfloat16" and not c.is_vision_language
    assert c.sliding_window is None and c.expert_count is None
    assert model.quantization is None and model.mlx_evidence is None
    w = model.weights
    assert w is not None
    params = DIMS.logical_params()
    assert params == 2 * 100 * 64 + 5 * 64 + 2 * (2 * 64 * 64 + 2 * 32 * 64 + 3 * 128 * 64)
    assert w.parameter_count == w.stored_elements == params
    assert w.total_bytes == 2 * params  # all bf16
    assert w.elements_by_dtype == (("BF16", params),)
    assert w.tensor_count == 1 + 2 * 2 + 14 + 2
    assert w.largest_tensor_bytes == 128 * 64 * 2  # an FFN matrix beats the 100x64 embedding
    assert w.metadata_format == "pt"
    assert model.files == ("model.safetensors",) and model.index_total_size is None


def test_sharded_with_index(tmp_path: Path) -> None:
    write_hf_dir(tmp_path, DIMS.config(), llama_tensors(DIMS), shards=3)
    (tmp_path / "consolidated.safetensors").write_bytes(b"not read: the index lists the shards")
    model = read_ok(tmp_path)
    assert model.files == tuple(f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3))
    assert model.weights is not None
    assert model.weights.parameter_count == DIMS.logical_params()
    assert model.index_total_size == model.weights.total_bytes == 2 * DIMS.logical_params()


def test_sharded_missing_shard(tmp_path: Path) -> None:
    write_hf_dir(tmp_path, DIMS.config(), llama_tensors(DIMS), shards=2)
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    problem = read_safetensors_dir(tmp_path)
    assert isinstance(problem, SafetensorsProblem)
    assert "1 of 2 shards are missing" in problem.reason and "model-00002-of-00002" in problem.reason


def test_awq(tmp_path: Path) -> None:
    q = {"quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemm", "zero_point": True}
    write_hf_dir(tmp_path, DIMS.config(quantization_config=q), llama_tensors(DIMS, "awq", bits=4, group=32))
    model = read_ok(tmp_path)
    qf = model.quantization
    assert qf is not None and qf.method == "awq"
    assert (qf.bits, qf.group_size, qf.format, qf.scheme) == (4, 32, "gemm", "W4A16")
    assert ("zero_point", "true") in qf.details
    w = model.weights
    assert w is not None
    assert w.parameter_count == DIMS.logical_params()  # qweight unpacked 8 per int32, scales/zeros left out
    linear = sum(o * i for _, o, i in DIMS.linears())
    assert dict(w.elements_by_dtype)["I32"] == linear // 8 + sum(
        i // 32 * o // 8 for _, o, i in DIMS.linears()
    )


@pytest.mark.parametrize("bits", [4, 8])
def test_gptq(tmp_path: Path, bits: int) -> None:
    q = {"quant_method": "gptq", "bits": bits, "group_size": 32, "desc_act": False, "sym": True}
    write_hf_dir(
        tmp_path, DIMS.config(quantization_config=q), llama_tensors(DIMS, "gptq", bits=bits, group=32)
    )
    model = read_ok(tmp_path)
    qf = model.quantization
    assert qf is not None and (qf.method, qf.bits, qf.group_size) == ("gptq", bits, 32)
    assert ("desc_act", "false") in qf.details and ("sym", "true") in qf.details
    assert model.weights is not None and model.weights.parameter_count == DIMS.logical_params()
    assert model.weights.stored_elements < DIMS.logical_params()


def test_fp8_block_quantized(tmp_path: Path) -> None:
    q = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
    }
    write_hf_dir(tmp_path, DIMS.config(quantization_config=q), llama_tensors(DIMS, "fp8"))
    model = read_ok(tmp_path)
    qf = model.quantization
    assert qf is not None and (qf.method, qf.bits, qf.format, qf.scheme) == ("fp8", 8, "e4m3", "W8A8-fp8")
    assert ("weight_block_size", "[128, 128]") in qf.details and qf.group_size is None
    w = model.weights
    assert w is not None and w.parameter_count == DIMS.logical_params()
    linear = sum(o * i for _, o, i in DIMS.linears())
    assert dict(w.bytes_by_dtype)["F8_E4M3"] == linear  # one byte per weight


def test_compressed_tensors_w4a16(tmp_path: Path) -> None:
    q = {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32},
                "input_activations": None,
            }
        },
        "ignore": ["lm_head"],
    }
    write_hf_dir(tmp_path, DIMS.config(quantization_config=q), llama_tensors(DIMS, "compressed"))
    model = read_ok(tmp_path)
    qf = model.quantization
    assert qf is not None and qf.method == "compressed-tensors"
    assert (qf.bits, qf.group_size, qf.format, qf.scheme) == (4, 32, "pack-quantized", "W4A16")
    assert ("weights.strategy", "group") in qf.details
    assert model.weights is not None and model.weights.parameter_count == DIMS.logical_params()


def test_compressed_tensors_fp8_scheme() -> None:
    groups = {"g": {"weights": {"num_bits": 8, "type": "float"}, "input_activations": {"num_bits": 8}}}
    qf = quantization_facts(
        {"quantization_config": {"quant_method": "compressed-tensors", "config_groups": groups}}
    )
    assert qf is not None and qf.scheme == "W8A8-fp8" and qf.bits == 8


def test_bitsandbytes_config() -> None:
    q = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}
    qf = quantization_facts({"quantization_config": q})
    assert qf is not None and (qf.method, qf.bits, qf.format) == ("bitsandbytes", 4, "nf4")
    qf8 = quantization_facts({"quantization_config": {"quant_method": "bitsandbytes", "load_in_8bit": True}})
    assert qf8 is not None and qf8.bits == 8


def test_mlx_quantized_with_override(tmp_path: Path) -> None:
    override = "model.layers.0.mlp.down_proj"
    config = DIMS.config(quantization={"group_size": 32, "bits": 4, override: {"group_size": 32, "bits": 8}})
    tensors = llama_tensors(DIMS, "mlx", bits=4, group=32)
    for k in [k for k in tensors if k.startswith(override + ".")]:
        del tensors[k]
    tensors.update(linear_tensors(override, 64, 128, "mlx", 8, 32))
    write_hf_dir(tmp_path, config, tensors, metadata={"format": "mlx"})
    model = read_ok(tmp_path)
    qf = model.quantization
    assert qf is not None and (qf.method, qf.bits, qf.group_size, qf.format) == ("mlx", 4, 32, "affine")
    assert qf.layer_bits == ((override, 8),)
    assert model.weights is not None and model.weights.parameter_count == DIMS.logical_params()
    assert model.mlx_evidence is not None and "4-bit" in model.mlx_evidence
    assert model.weights.metadata_format == "mlx"


def test_mlx_unquantized_by_metadata(tmp_path: Path) -> None:
    write_hf_dir(tmp_path, DIMS.config(), llama_tensors(DIMS), metadata={"format": "mlx"})
    model = read_ok(tmp_path)
    assert model.quantization is None and model.mlx_evidence == 'the safetensors header says format "mlx"'


def test_vision_language_text_config(tmp_path: Path) -> None:
    text = {
        "model_type": "llama",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "vocab_size": 100,
        "max_position_embeddings": 4096,
    }
    config = {
        "architectures": ["LlavaForConditionalGeneration"],
        "model_type": "llava",
        "text_config": text,
        "vision_config": {"model_type": "clip_vision_model", "hidden_size": 32, "num_hidden_layers": 3},
        "torch_dtype": "float16",
    }
    tensors = llama_tensors(replace(DIMS, kv_heads=1), prefix="language_model.")
    tensors["vision_tower.vision_model.embeddings.patch_embedding.weight"] = ("BF16", (32, 3, 14, 14))
    write_hf_dir(tmp_path, config, tensors)
    model = read_ok(tmp_path)
    c = model.config
    assert c.is_vision_language and c.model_type == "llava" and c.text_model_type == "llama"
    assert (c.hidden_size, c.num_layers, c.num_kv_heads, c.vocab_size) == (
        64,
        2,
        1,
        100,
    )  # not the vision 32/3
    assert c.max_position_embeddings == 4096 and c.torch_dtype == "float16"
    assert model.weights is not None
    assert model.weights.parameter_count == replace(DIMS, kv_heads=1).logical_params() + 32 * 3 * 14 * 14


def test_sliding_window_and_layer_types() -> None:
    gemma3 = config_facts(
        {
            "model_type": "gemma3_text",
            "hidden_size": 640,
            "num_attention_heads": 4,
            "head_dim": 256,
            "sliding_window": 512,
            "sliding_window_pattern": 6,
            "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
            "dtype": "bfloat16",
        }
    )
    assert gemma3.head_dim == 256  # written, not 640 / 4
    assert gemma3.sliding_window == 512 and gemma3.sliding_window_pattern == 6
    assert gemma3.layer_types[5] == "full_attention" and gemma3.torch_dtype == "bfloat16"
    qwen2 = config_facts({"sliding_window": 131072, "use_sliding_window": False, "num_attention_heads": 8})
    assert qwen2.sliding_window is None and qwen2.num_kv_heads == 8  # defaults to the attention heads


def test_moe_config() -> None:
    mixtral = config_facts({"num_local_experts": 8, "num_experts_per_tok": 2})
    assert (mixtral.expert_count, mixtral.expert_used_count) == (8, 2)
    deepseek = config_facts({"n_routed_experts": 64, "num_experts_per_tok": 6})
    assert (deepseek.expert_count, deepseek.expert_used_count) == (64, 6)


def test_in_memory_headers_match_the_folder(tmp_path: Path) -> None:
    q = {"quant_method": "awq", "bits": 4, "group_size": 32}
    config: dict[str, Any] = DIMS.config(quantization_config=q)
    tensors = llama_tensors(DIMS, "awq")
    write_hf_dir(tmp_path, config, tensors)
    local = read_ok(tmp_path)
    header = safetensors_header(tensors)
    assert read_header(tmp_path / "model.safetensors") == header
    remote = model_from_metadata(config, [header], files=["model.safetensors"])
    assert isinstance(remote, SafetensorsModel)
    assert remote.weights == local.weights and remote.config == local.config
    assert remote.quantization == local.quantization and remote.path is None
    summary = summarize_headers([header], quantization=local.quantization)
    assert isinstance(summary, WeightsSummary) and summary.parameter_count == DIMS.logical_params()


def test_header_entry_size_mismatch() -> None:
    header = {"w": {"dtype": "F16", "shape": [4, 4], "data_offsets": [0, 16]}}
    problem = summarize_headers([header])
    assert isinstance(problem, SafetensorsProblem)
    assert "declares 16 bytes but F16 [4, 4] needs 32" in problem.reason


def _write_raw(path: Path, header: bytes, data: bytes = b"", length: int | None = None) -> None:
    path.write_bytes(struct.pack("<Q", len(header) if length is None else length) + header + data)


def test_broken_safetensors_files(tmp_path: Path) -> None:
    cases: dict[str, tuple[bytes, str]] = {}
    (tmp_path / "empty.safetensors").write_bytes(b"")
    cases["empty.safetensors"] = (b"", "empty")
    (tmp_path / "short.safetensors").write_bytes(b"\x01\x02")
    cases["short.safetensors"] = (b"", "truncated")
    _write_raw(tmp_path / "huge.safetensors", b"{}", length=1 << 40)
    cases["huge.safetensors"] = (b"", "header length")
    _write_raw(tmp_path / "json.safetensors", b"{not json")
    cases["json.safetensors"] = (b"", "not valid JSON")
    good = json.dumps({"w": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]}}).encode()
    _write_raw(tmp_path / "cut.safetensors", good, b"\0" * 10)
    cases["cut.safetensors"] = (b"", "truncated: its tensors need")
    bad = json.dumps({"w": {"dtype": "F32", "shape": [8], "data_offsets": [0]}}).encode()
    _write_raw(tmp_path / "entry.safetensors", bad)
    cases["entry.safetensors"] = (b"", "malformed")
    for name, (_, expect) in cases.items():
        problem = read_header(tmp_path / name)
        assert isinstance(problem, SafetensorsProblem), name
        assert expect in problem.reason, (name, problem.reason)
        assert "download" in problem.reason


def test_broken_config_json(tmp_path: Path) -> None:
    write_safetensors(tmp_path / "model.safetensors", {"w": ("F32", (4,))})
    (tmp_path / "config.json").write_text("{oops")
    problem = read_safetensors_dir(tmp_path)
    assert isinstance(problem, SafetensorsProblem) and "config.json is not valid JSON" in problem.reason
    (tmp_path / "config.json").write_text("[1, 2]")
    problem = read_safetensors_dir(tmp_path)
    assert isinstance(problem, SafetensorsProblem) and "not hold a JSON object" in problem.reason
