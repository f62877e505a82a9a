"""GGUF layouts read from generated files: KV heads, key/value lengths, sliding windows, experts, recurrent
layers, per-layer bytes, multi-part models, projectors and diffusion GGUFs."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.formats.gguf_layout import GGUFLayout, read_gguf_layout
from app.formats.gguf_meta import GGUFProblem, read_gguf
from app.formats.gguf_rules import resolve_swa, swa_period_layers
from tests.support.modelgen import GGUFSpec, Written, write_diffusion_gguf, write_gguf, write_mmproj


def layout_of(tmp_path: Path, spec: GGUFSpec, name: str = "m.gguf") -> tuple[GGUFLayout, Written]:
    written = write_gguf(tmp_path / name, spec)
    layout = read_gguf_layout(written.path)
    assert isinstance(layout, GGUFLayout), layout
    return layout, written


def test_gqa_model_facts_and_bytes(tmp_path: Path) -> None:
    spec = GGUFSpec(n_layer=3, n_embd=128, n_head=8, n_head_kv=2, n_ff=256, n_vocab=50, n_ctx=8192)
    layout, w = layout_of(tmp_path, spec)
    assert layout.kind == "llm" and layout.architecture == "llama"
    assert layout.block_count == 3 and layout.context_length == 8192
    assert layout.head_count == (8, 8, 8)
    assert layout.head_count_kv == (2, 2, 2)
    assert layout.key_length == 16 and layout.value_length == 16  # 128 / 8
    assert layout.vocab_size == 50
    assert layout.file_type == "all_f32"
    # f32 layer: 2 norms + q,o (128x128) + k,v (32x128) + 3 ffn (256x128)
    per_layer = 4 * (2 * 128 + 2 * 128 * 128 + 2 * 32 * 128 + 3 * 256 * 128)
    assert layout.layer_bytes == (per_layer,) * 3
    assert [w.layer_bytes(i) for i in range(3)] == [per_layer] * 3
    assert layout.largest_layer_bytes == per_layer
    assert layout.token_embd_bytes == 50 * 128 * 4
    assert layout.output_bytes == 50 * 128 * 4 + 128 * 4  # output.weight + output_norm.weight
    assert not layout.output_tied
    assert layout.other_bytes == 0 and layout.other_tensors == ()
    total = sum(layout.layer_bytes) + layout.token_embd_bytes + layout.output_bytes + layout.other_bytes
    assert total == layout.tensor_bytes == sum(w.tensor_bytes.values())
    assert layout.tensor_count == 3 * 9 + 3
    assert layout.kv_layers == (True, True, True)
    assert layout.swa_layers == (False, False, False) and layout.sliding_window is None
    assert "full attention" in layout.swa_rule
    assert layout.recurrent is None and layout.recurrent_layers == (False, False, False)
    assert layout.expert_count is None and not layout.is_moe
    assert layout.facts is not None and layout.facts.head_count_kv == 2
    assert layout.file_bytes == w.path.stat().st_size
    public = layout.public()
    assert public["head_count_kv"] == [2, 2, 2] and public["largest_layer_bytes"] == per_layer
    assert public["swa_layers"] == 0 and public["kv_layers"] == 3


def test_explicit_key_and_value_length(tmp_path: Path) -> None:
    layout, _ = layout_of(tmp_path, GGUFSpec(n_embd=64, n_head=4, n_head_kv=1, head_dim=32, value_dim=24))
    assert layout.key_length == 32 and layout.value_length == 24  # not 64 / 4
    assert layout.key_lengths == (32, 32) and layout.value_lengths == (24, 24)


def test_per_layer_kv_heads_array(tmp_path: Path) -> None:
    layout, w = layout_of(tmp_path, GGUFSpec(n_layer=4, n_head=4, n_head_kv=(4, 2, 1, 2)))
    assert layout.head_count_kv == (4, 2, 1, 2)
    assert layout.facts is not None and layout.facts.head_count_kv == 4  # GGUFFacts keeps the largest
    assert layout.layer_bytes == tuple(w.layer_bytes(i) for i in range(4))
    assert layout.layer_bytes[0] > layout.layer_bytes[1] > layout.layer_bytes[2]  # fewer K/V rows


def test_gemma2_alternates_with_default_window(tmp_path: Path) -> None:
    layout, _ = layout_of(tmp_path, GGUFSpec(arch="gemma2", n_layer=6))
    assert layout.sliding_window == 4096  # llama.cpp's gemma2 default when the key is absent
    assert layout.swa_kind == "standard"
    assert layout.swa_layers == (True, False, True, False, True, False)


def test_gemma3_five_local_one_global(tmp_path: Path) -> None:
    layout, _ = layout_of(tmp_path, GGUFSpec(arch="gemma3", n_layer=12, sliding_window=1024))
    assert layout.sliding_window == 1024
    assert [i for i, s in enumerate(layout.swa_layers) if not s] == [5, 11]
    assert layout.swa_layer_count == 10
    assert "period 6" in layout.swa_rule


def test_gemma3_without_window_is_full_attention(tmp_path: Path) -> None:
    layout, _ = layout_of(tmp_path, GGUFSpec(arch="gemma3", n_layer=6))
    assert layout.sliding_window is None and not any(layout.swa_layers)


def test_cohere2_three_local_one_global(tmp_path: Path) -> None:
    layout, _ = layout_of(tmp_path, GGUFSpec(arch="cohere2", n_layer=8, sliding_window=4096))
    assert layout.swa_layers == (True, True, True, False) * 2


def test_header_period_overrides_the_arch_rule(tmp_path: Path) -> None:
    layout, _ = layout_of(tmp_path, GGUFSpec(arch="gemma3", n_layer=8, sliding_window=512, swa_pattern=4))
    assert layout.swa_layers == (True, True, True, False) * 2
    assert "from the header" in layout.swa_rule


def test_header_bool_pattern_per_layer(tmp_path: Path) -> None:
    pattern = (True, True, False, True, False)
    layout, _ = layout_of(
        tmp_path, GGUFSpec(arch="gemma4", n_layer=5, sliding_window=512, swa_pattern=pattern)
    )
    assert layout.swa_layers == pattern and layout.sliding_window == 512


def test_pattern_of_wrong_length_is_a_problem(tmp_path: Path) -> None:
    w = write_gguf(
        tmp_path / "m.gguf", GGUFSpec(arch="gemma4", n_layer=3, sliding_window=8, swa_pattern=(True,))
    )
    problem = read_gguf_layout(w.path)
    assert isinstance(problem, GGUFProblem)
    assert "1 entries for 3 layers" in problem.reason and "download" in problem.reason


def test_llama4_chunked_attention(tmp_path: Path) -> None:
    layout, _ = layout_of(tmp_path, GGUFSpec(arch="llama4", n_layer=8))
    assert layout.swa_kind == "chunked" and layout.sliding_window == 8192
    assert layout.swa_layers == (True, True, True, False) * 2


def test_phi3_window_is_ignored_like_llama_cpp(tmp_path: Path) -> None:
    layout, _ = layout_of(tmp_path, GGUFSpec(arch="phi3", n_layer=4, sliding_window=2047))
    assert layout.sliding_window is None and layout.swa_layers == (False,) * 4
    assert "disables" in layout.swa_rule


def test_smallthinker_dense_first_fixed_window(tmp_path: Path) -> None:
    layout, _ = layout_of(tmp_path, GGUFSpec(arch="smallthinker", n_layer=8, sliding_window=1000))
    assert layout.sliding_window == 4096  # llama.cpp pins it
    assert layout.swa_layers == (False, True, True, True) * 2


def test_window_without_rule_or_pattern_is_full_attention(tmp_path: Path) -> None:
    layout, _ = layout_of(tmp_path, GGUFSpec(arch="qwen2", n_layer=4, sliding_window=32768))
    assert layout.sliding_window is None and not any(layout.swa_layers)


def test_swa_period_rule() -> None:
    assert swa_period_layers(4, 0) == (True,) * 4  # 0 marks every layer, as in llama.cpp
    assert swa_period_layers(4, 1) == (False,) * 4
    assert swa_period_layers(6, 3, dense_first=True) == (False, True, True, False, True, True)
    exaone = resolve_swa("exaone4", n_layer=64, window=None, pattern=None)
    assert exaone.window == 4096 and exaone.layers[:4] == (True, True, True, False)
    assert resolve_swa("exaone4", n_layer=30, window=4096, pattern=None).window is None


def test_moe_experts(tmp_path: Path) -> None:
    spec = GGUFSpec(n_layer=2, n_expert=8, n_expert_used=2, n_ff_exp=32)
    layout, w = layout_of(tmp_path, spec)
    assert layout.is_moe and layout.expert_count == 8 and layout.expert_used_count == 2
    assert layout.expert_feed_forward_length == 32
    experts = 3 * 8 * 32 * 64 * 4 + 8 * 64 * 4  # gate/up/down experts + router, f32
    attn = 4 * (2 * 64 + 2 * 64 * 64 + 2 * 32 * 64)
    assert layout.layer_bytes == (experts + attn, experts + attn)
    assert layout.layer_bytes[0] == w.layer_bytes(0)


def test_mamba_recurrent_state(tmp_path: Path) -> None:
    ssm = {"conv_kernel": 4, "inner_size": 128, "state_size": 16, "time_step_rank": 4}
    layout, w = layout_of(tmp_path, GGUFSpec(arch="mamba", n_layer=3, n_head=0, n_head_kv=0, ssm=ssm))
    assert layout.recurrent is not None
    assert layout.recurrent.state_size == 16 and layout.recurrent.conv_kernel == 4
    assert layout.recurrent.group_count is None  # not in the header
    assert layout.recurrent_layers == (True, True, True)
    assert layout.kv_layers == (False, False, False)
    assert layout.key_length == 0  # no attention heads
    assert layout.recurrent.conv_state_elements(64) == 3 * 128  # (d_conv - 1) * d_inner
    assert layout.recurrent.ssm_state_elements(64) == 16 * 128
    assert layout.layer_bytes[0] == w.layer_bytes(0) == 4 * (2 * 64 + 256 * 64 + 64 * 128 + 3 * 128 * 64)


def test_jamba_hybrid_layers(tmp_path: Path) -> None:
    ssm = {"conv_kernel": 4, "inner_size": 128, "state_size": 16}
    layout, _ = layout_of(tmp_path, GGUFSpec(arch="jamba", n_layer=4, n_head_kv=(0, 2, 0, 0), ssm=ssm))
    assert layout.recurrent_layers == (True, False, True, True)
    assert layout.kv_layers == (False, True, False, False)


def test_qwen3next_full_attention_interval(tmp_path: Path) -> None:
    spec = GGUFSpec(arch="qwen3next", n_layer=8, extra_kv={"{arch}.full_attention_interval": 4})
    layout, _ = layout_of(tmp_path, spec)
    assert layout.recurrent is not None and layout.recurrent.full_attention_interval == 4
    assert layout.recurrent_layers == (True, True, True, False) * 2
    assert layout.kv_layers == (False, False, False, True) * 2


def test_gemma3n_shares_kv_after_layer_20(tmp_path: Path) -> None:
    layout, _ = layout_of(tmp_path, GGUFSpec(arch="gemma3n", n_layer=24, sliding_window=512, dtype="f16"))
    assert layout.kv_layers == (True,) * 20 + (False,) * 4
    assert [i for i, s in enumerate(layout.swa_layers) if not s] == [4, 9, 14, 19]


def test_shared_kv_layers_key(tmp_path: Path) -> None:
    spec = GGUFSpec(n_layer=6, extra_kv={"{arch}.attention.shared_kv_layers": 2})
    layout, _ = layout_of(tmp_path, spec)
    assert layout.kv_layers == (True,) * 4 + (False,) * 2


def test_multipart_totals_from_all_parts(tmp_path: Path) -> None:
    spec = GGUFSpec(n_layer=4, split_max_tensors=10)
    w = write_gguf(tmp_path / "big.gguf", spec)
    assert len(w.paths) == 4 and w.paths[0].name == "big-00001-of-00004.gguf"
    first = read_gguf_layout(w.paths[0])
    middle = read_gguf_layout(w.paths[2])
    listed = read_gguf_layout(list(reversed(w.paths)))
    assert isinstance(first, GGUFLayout)
    assert first == middle == listed
    assert first.parts == w.paths
    assert first.tensor_bytes == sum(w.tensor_bytes.values())
    assert first.file_bytes == sum(p.stat().st_size for p in w.paths)
    assert first.layer_bytes == tuple(w.layer_bytes(i) for i in range(4))
    assert first.vocab_size == 40 and first.head_count_kv == (2,) * 4  # header from the first part
    assert first.facts is not None and first.facts.tensor_bytes == first.tensor_bytes
    single = read_gguf(w.paths[0])  # the catalog's reader still sees one part
    assert not isinstance(single, GGUFProblem) and single.tensor_bytes < first.tensor_bytes


def test_multipart_missing_part(tmp_path: Path) -> None:
    w = write_gguf(tmp_path / "big.gguf", GGUFSpec(n_layer=3, split_max_tensors=10))
    w.paths[1].unlink()
    problem = read_gguf_layout(w.paths[0])
    assert isinstance(problem, GGUFProblem)
    assert "1 of 3 parts are missing" in problem.reason and w.paths[1].name in problem.reason


def test_multipart_wrong_count(tmp_path: Path) -> None:
    w = write_gguf(tmp_path / "big.gguf", GGUFSpec(n_layer=3, split_max_tensors=10))
    problem = read_gguf_layout(list(w.paths[:2]))
    assert isinstance(problem, GGUFProblem) and "has 3 parts but 2 were found" in problem.reason


def test_tied_output_and_vocab_from_embedding(tmp_path: Path) -> None:
    spec = GGUFSpec(n_vocab=30, tied_output=True, token_list=False)
    layout, _ = layout_of(tmp_path, spec)
    assert layout.output_tied
    assert layout.output_bytes == 64 * 4  # only output_norm
    assert layout.vocab_size == 30  # token_embd's second dimension


def test_vocab_size_key_wins(tmp_path: Path) -> None:
    layout, _ = layout_of(tmp_path, GGUFSpec(n_vocab=48, vocab_size_key=True))
    assert layout.vocab_size == 48


def test_quantized_bytes(tmp_path: Path) -> None:
    layout, w = layout_of(tmp_path, GGUFSpec(dtype="q8_0"))
    q_layer = (2 * 64 * 64 + 2 * 32 * 64 + 3 * 128 * 64) // 32 * 34
    assert layout.layer_bytes[0] == q_layer + 2 * 64 * 4 == w.layer_bytes(0)
    types = dict(layout.tensor_types)
    assert types["Q8_0"] == 2 * q_layer + 2 * (40 * 64 // 32 * 34)
    assert layout.file_type == "mostly_q8_0"


def test_other_tensors_are_listed(tmp_path: Path) -> None:
    layout, _ = layout_of(tmp_path, GGUFSpec(extra_tensors=(("rope_freqs.weight", (8,)),)))
    assert layout.other_bytes == 32 and layout.other_tensors == (("rope_freqs.weight", 32),)


def test_mmproj_projector(tmp_path: Path) -> None:
    w = write_mmproj(tmp_path / "mmproj-model-f32.gguf")
    layout = read_gguf_layout(w.path)
    assert isinstance(layout, GGUFLayout)
    assert layout.is_projector and layout.architecture == "clip"
    assert layout.projector is not None
    assert layout.projector.projector_type == "mlp"
    assert layout.projector.has_vision_encoder and not layout.projector.has_audio_encoder
    assert layout.projector.vision_block_count == 2 and layout.projector.image_size == 224
    assert layout.projector.patch_size == 14 and layout.projector.projection_dim == 64
    assert layout.tensor_bytes == sum(w.tensor_bytes.values())
    assert layout.vocab_size is None


@pytest.mark.parametrize("arch", ["flux", None])
def test_diffusion_gguf(tmp_path: Path, arch: str | None) -> None:
    w = write_diffusion_gguf(tmp_path / "d.gguf", arch=arch)
    layout = read_gguf_layout(w.path)
    assert isinstance(layout, GGUFLayout)
    assert layout.is_diffusion and layout.architecture == arch
    assert layout.tensor_bytes == (96 * 32 + 128 * 32) * 2
    assert (layout.facts is None) == (arch is None)


@pytest.mark.parametrize(
    ("content", "expect"),
    [(b"", "empty"), (b"PK\x03\x04zip", "not a GGUF"), (b"GGUF\x03\x00\x00\x00junk", "corrupt")],
)
def test_broken_files(tmp_path: Path, content: bytes, expect: str) -> None:
    p = tmp_path / "x.gguf"
    p.write_bytes(content)
    problem = read_gguf_layout(p)
    assert isinstance(problem, GGUFProblem) and expect in problem.reason


def test_truncated_tensor_data(tmp_path: Path) -> None:
    w = write_gguf(tmp_path / "m.gguf", GGUFSpec())
    data = w.path.read_bytes()
    w.path.write_bytes(data[:-3000])
    problem = read_gguf_layout(w.path)
    assert isinstance(problem, GGUFProblem)
    assert "truncated" in problem.reason and "download it again" in problem.reason
