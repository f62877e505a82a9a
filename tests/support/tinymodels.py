"""Tiny GGUF models written by the tests themselves (random weights, byte-fallback vocabulary).

llama.cpp loads and generates from these; the output is arbitrary bytes, so tests assert on
structure or pin the text with a grammar.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Hermes 2 Pro / Qwen 2.5 style: tools listed in the system turn, calls as <tool_call>{json}</tool_call>.
# llama.cpp's template analysis derives its tool-call parser and grammar from this template.
HERMES_TOOLS = (
    "{%- if tools %}<|im_start|>system\n# Tools\n<tools>\n"
    "{%- for t in tools %}\n{{ t | tojson }}\n{%- endfor %}\n</tools>\n"
    'For each call return <tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call><|im_end|>\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response>"
    "<|im_end|>\n"
    "{% elif m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n"
    "{% if m.content %}{{ m.content }}{% endif %}"
    "{%- for tc in m.tool_calls %}\n<tool_call>\n"
    '{"name": "{{ tc.function.name }}", "arguments": '
    "{{ tc.function.arguments | tojson if tc.function.arguments is mapping else tc.function.arguments }}}"
    "\n</tool_call>{%- endfor %}<|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class TinySpec:
    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 128
    n_ctx_train: int = 2048
    pooling: int | None = None  # 1 = mean: an embedding model
    seed: int = 0
    chat_template: str = CHATML


CHAT = TinySpec()
EMBED = TinySpec(pooling=1, seed=1)
LARGE = TinySpec(n_embd=512, n_layer=8, n_head=8, n_head_kv=4, n_ff=1536, seed=2)
# between the two: tokens take about a millisecond, so a stream is a steady run of small events
MEDIUM = TinySpec(n_embd=256, n_layer=4, n_head=4, n_head_kv=2, n_ff=768, n_ctx_train=4096, seed=3)


def _vocab() -> tuple[list[bytes], list[float], list[int]]:
    tokens: list[bytes] = [b"<unk>", b"<s>", b"</s>"]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    for b in range(256):
        tokens.append(f"<0x{b:02X}>".encode())
        types.append(gguf.TokenType.BYTE)
    for word in ["\u2581", "\u2581the", "\u2581answer", "\u2581is", "\u258142", "a", "e", "t"]:
        tokens.append(word.encode())
        types.append(gguf.TokenType.NORMAL)
    scores = [0.0] * 3 + [-1000.0] * 256 + [-float(i) for i in range(len(tokens) - 259)]
    return tokens, scores, [int(t) for t in types]


def _add_vocab(w: gguf.GGUFWriter, template: Any, *, add_bos: bool = True) -> int:
    """The shared byte-level llama vocabulary, its special ids and `template`; returns its size."""
    tokens, scores, types = _vocab()
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    if add_bos:
        w.add_add_bos_token(True)
    w.add_chat_template(template)
    return len(tokens)


def write_tiny_gguf(path: Path, spec: TinySpec = CHAT) -> Path:
    """Write a llama-architecture GGUF with f32 random weights; returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(spec.seed)
    tokens = _vocab()[0]
    n_vocab = len(tokens)
    head_dim = spec.n_embd // spec.n_head
    kv_dim = head_dim * spec.n_head_kv
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-embed" if spec.pooling else "tiny-chat")
    w.add_context_length(spec.n_ctx_train)
    w.add_embedding_length(spec.n_embd)
    w.add_block_count(spec.n_layer)
    w.add_feed_forward_length(spec.n_ff)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_head_kv)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    if spec.pooling is not None:
        w.add_pooling_type(gguf.PoolingType(spec.pooling))
    _add_vocab(w, spec.chat_template)

    def t(name: str, *shape: int) -> None:
        data = rng.standard_normal(shape).astype(np.float32) * 0.02
        if name.endswith("norm.weight"):
            data = np.ones(shape, dtype=np.float32)
        w.add_tensor(name, data)

    t("token_embd.weight", n_vocab, spec.n_embd)
    for i in range(spec.n_layer):
        p = f"blk.{i}."
        t(p + "attn_norm.weight", spec.n_embd)
        t(p + "attn_q.weight", spec.n_embd, spec.n_embd)
        t(p + "attn_k.weight", kv_dim, spec.n_embd)
        t(p + "attn_v.weight", kv_dim, spec.n_embd)
        t(p + "attn_output.weight", spec.n_embd, spec.n_embd)
        t(p + "ffn_norm.weight", spec.n_embd)
        t(p + "ffn_gate.weight", spec.n_ff, spec.n_embd)
        t(p + "ffn_up.weight", spec.n_ff, spec.n_embd)
        t(p + "ffn_down.weight", spec.n_embd, spec.n_ff)
    t("output_norm.weight", spec.n_embd)
    t("output.weight", n_vocab, spec.n_embd)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_unknown_arch_gguf(path: Path, arch: str = "nosucharch") -> Path:
    """A well-formed GGUF whose architecture llama.cpp does not know: it passes our header check
    and makes the engine exit during load."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_gemma2_gguf(path: Path, *, window: int = 256, seed: int = 5) -> Path:
    """A gemma2 GGUF (every other layer slides over `window` tokens) that llama.cpp loads and runs:
    the sliding-window shape for the memory model's checks."""
    n_embd, n_layer, n_head, n_kv, n_ff, head_dim = 128, 4, 4, 2, 256, 32
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tokens = _vocab()[0]
    w = gguf.GGUFWriter(str(path), "gemma2")
    w.add_name("tiny-gemma2")
    w.add_context_length(8192)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_sliding_window(window)
    w.add_attn_logit_softcapping(50.0)
    w.add_final_logit_softcapping(30.0)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    _add_vocab(w, CHATML, add_bos=False)

    def t(name: str, *shape: int) -> None:
        norm = "norm" in name
        data = np.ones(shape, np.float32) if norm else rng.standard_normal(shape).astype(np.float32) * 0.02
        w.add_tensor(name, data)

    t("token_embd.weight", len(tokens), n_embd)  # gemma ties the output to the embedding
    for i in range(n_layer):
        p = f"blk.{i}."
        t(p + "attn_norm.weight", n_embd)
        t(p + "attn_q.weight", n_head * head_dim, n_embd)
        t(p + "attn_k.weight", n_kv * head_dim, n_embd)
        t(p + "attn_v.weight", n_kv * head_dim, n_embd)
        t(p + "attn_output.weight", n_embd, n_head * head_dim)
        t(p + "post_attention_norm.weight", n_embd)
        t(p + "ffn_norm.weight", n_embd)
        t(p + "ffn_gate.weight", n_ff, n_embd)
        t(p + "ffn_up.weight", n_ff, n_embd)
        t(p + "ffn_down.weight", n_embd, n_ff)
        t(p + "post_ffw_norm.weight", n_embd)
    t("output_norm.weight", n_embd)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# Qwen3-Reranker's layout: a qwen3 decoder, rank pooling, and a classifier head `cls.output` with one row
# per label; llama.cpp scores a (query, document) pair from the last token through that head.
RERANK_LABELS = ("yes", "no")


def write_tiny_reranker(path: Path, *, seed: int = 11) -> Path:
    """A qwen3-architecture reranker GGUF (pooling type rank) that llama.cpp loads with `--reranking` and
    scores with finite relevance scores; random weights, so only the shape of the ranking is meaningful."""
    n_embd, n_layer, n_head, n_kv, n_ff = 64, 2, 4, 2, 128
    head_dim = n_embd // n_head
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tokens = _vocab()[0]
    w = gguf.GGUFWriter(str(path), "qwen3")
    w.add_name("tiny-rerank")
    w.add_context_length(2048)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_pooling_type(gguf.PoolingType.RANK)
    w.add_classifier_output_labels(list(RERANK_LABELS))
    # llama.cpp's server fills a named "rerank" template with the pair, as real reranker GGUFs ship it
    _add_vocab(w, [{"name": "rerank", "template": "query: {query}\ndocument: {document}\n"}])

    def t(name: str, *shape: int) -> None:
        norm = "norm" in name
        data = np.ones(shape, np.float32) if norm else rng.standard_normal(shape).astype(np.float32) * 0.02
        w.add_tensor(name, data)

    t("token_embd.weight", len(tokens), n_embd)
    for i in range(n_layer):
        p = f"blk.{i}."
        t(p + "attn_norm.weight", n_embd)
        t(p + "attn_q.weight", n_head * head_dim, n_embd)
        t(p + "attn_k.weight", n_kv * head_dim, n_embd)
        t(p + "attn_v.weight", n_kv * head_dim, n_embd)
        t(p + "attn_output.weight", n_embd, n_head * head_dim)
        t(p + "attn_q_norm.weight", head_dim)
        t(p + "attn_k_norm.weight", head_dim)
        t(p + "ffn_norm.weight", n_embd)
        t(p + "ffn_gate.weight", n_ff, n_embd)
        t(p + "ffn_up.weight", n_ff, n_embd)
        t(p + "ffn_down.weight", n_embd, n_ff)
    t("output_norm.weight", n_embd)
    t("cls.output.weight", len(RERANK_LABELS), n_embd)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_mellum_gguf(path: Path, *, seed: int = 7) -> Path:
    """A tiny Mellum (JetBrains' MoE: attention with q/k norms, 4 experts, 2 used) that llama.cpp runs:
    an architecture xllamacpp 2026.10 loads and 2026.4 does not
    (tests/lanes/engines/llamacpp/test_compat.py)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    n_embd, n_layer, n_head, n_kv, n_exp, n_used, n_ff_exp = 64, 2, 4, 2, 4, 2, 64
    hd = n_embd // n_head
    w = gguf.GGUFWriter(str(path), "mellum")
    w.add_name("tiny-mellum")
    w.add_context_length(2048)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff_exp * n_used)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_dimension_count(hd)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(n_exp)
    w.add_expert_used_count(n_used)
    w.add_expert_feed_forward_length(n_ff_exp)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    n_vocab = _add_vocab(w, CHATML)

    def t(name: str, *shape: int) -> None:
        data = rng.standard_normal(shape).astype(np.float32) * 0.02
        w.add_tensor(name, np.ones(shape, dtype=np.float32) if name.endswith("norm.weight") else data)

    t("token_embd.weight", n_vocab, n_embd)
    for i in range(n_layer):
        p = f"blk.{i}."
        for name, shape in (
            ("attn_norm", (n_embd,)),
            ("attn_q", (n_embd, n_embd)),
            ("attn_k", (hd * n_kv, n_embd)),
            ("attn_v", (hd * n_kv, n_embd)),
            ("attn_output", (n_embd, n_embd)),
            ("attn_q_norm", (hd,)),
            ("attn_k_norm", (hd,)),
            ("ffn_norm", (n_embd,)),
            ("ffn_gate_inp", (n_exp, n_embd)),
            ("ffn_gate_exps", (n_exp, n_ff_exp, n_embd)),
            ("ffn_up_exps", (n_exp, n_ff_exp, n_embd)),
            ("ffn_down_exps", (n_exp, n_embd, n_ff_exp)),
        ):
            t(f"{p}{name}.weight", *shape)
    t("output_norm.weight", n_embd)
    t("output.weight", n_vocab, n_embd)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
