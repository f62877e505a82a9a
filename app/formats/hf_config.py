"""Facts from a Hugging Face `config.json`: the text model's shape and how its weights are quantized.

Vision-language configs keep the language model under `text_config` (also `llm_config`, `language_config`);
its fields win over the top level. A field the config does not write is None — transformers fills some from
class defaults we cannot see — except two conventions transformers applies to every model:
`num_key_value_heads` defaults to `num_attention_heads` and `head_dim` to `hidden_size / num_attention_heads`.
`sliding_window` is None when the config says `use_sliding_window: false` (qwen2 writes a window it ignores).

Quantization: `quantization_config.quant_method` (awq, gptq, fp8, bitsandbytes, compressed-tensors, mxfp4 or
whatever is written) or MLX's own `quantization` object (`{"bits", "group_size"}` plus per-module overrides).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_CONFIG_BYTES = 16 * 1024 * 1024
_TEXT_KEYS = ("text_config", "llm_config", "language_config")


@dataclass(frozen=True)
class ConfigProblem:
    reason: str


@dataclass(frozen=True)
class QuantizationFacts:
    method: str  # "awq", "gptq", "fp8", "bitsandbytes", "compressed-tensors", "mxfp4", "mlx", or as written
    bits: int | None  # weight bits
    group_size: int | None  # weights per scale; -1 (GPTQ) = one group per output channel; None = not grouped
    format: str | None  # awq version, gptq checkpoint_format, fp8 fmt, bnb 4-bit type, compressed-tensors
    scheme: str | None  # e.g. "W4A16", "W8A8-fp8"
    details: tuple[tuple[str, str], ...] = ()  # other settings as written, e.g. ("desc_act", "True")
    layer_bits: tuple[tuple[str, int | None], ...] = ()  # MLX per-module overrides; None = not quantized


@dataclass(frozen=True)
class ConfigFacts:
    architectures: tuple[str, ...]
    model_type: str | None
    text_model_type: str | None  # model_type inside text_config, when there is one
    is_vision_language: bool  # the text facts came from a nested text config
    hidden_size: int | None
    num_layers: int | None
    num_heads: int | None
    num_kv_heads: int | None
    head_dim: int | None
    vocab_size: int | None
    max_position_embeddings: int | None
    sliding_window: int | None
    sliding_window_pattern: int | None  # gemma3-style period, where written
    layer_types: tuple[str, ...]  # e.g. ("sliding_attention", "full_attention", ...), where written
    torch_dtype: str | None
    expert_count: int | None
    expert_used_count: int | None
    tie_word_embeddings: bool | None


def read_config(path: Path) -> dict[str, Any] | ConfigProblem:
    """The JSON object in `path`; a problem for a missing, empty, huge or corrupt file."""
    try:
        size = path.stat().st_size
        if size == 0:
            return ConfigProblem(f"{path.name} is empty; download it again")
        if size > MAX_CONFIG_BYTES:
            return ConfigProblem(f"{path.name} is {size} bytes, too large for a config; replace it")
        data = json.loads(path.read_bytes())
    except OSError as exc:
        return ConfigProblem(f"cannot read {path.name}: {exc.strerror or exc}")
    except (ValueError, UnicodeDecodeError) as exc:
        return ConfigProblem(f"{path.name} is not valid JSON ({exc}); download it again")
    if not isinstance(data, dict):
        return ConfigProblem(f"{path.name} does not hold a JSON object; download it again")
    return data


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)


def _first_int(cfg: Mapping[str, Any], *keys: str) -> int | None:
    for k in keys:
        v = _int(cfg.get(k))
        if v is not None:
            return v
    return None


def _text(config: Mapping[str, Any]) -> tuple[Mapping[str, Any], bool]:
    for k in _TEXT_KEYS:
        nested = config.get(k)
        if isinstance(nested, Mapping):
            return nested, True
    return config, False


def config_facts(config: Mapping[str, Any]) -> ConfigFacts:
    text, nested = _text(config)

    def pick(*keys: str) -> int | None:
        v = _first_int(text, *keys)
        return v if v is not None or not nested else _first_int(config, *keys)

    hidden = pick("hidden_size", "n_embd", "d_model")
    heads = pick("num_attention_heads", "n_head", "num_heads")
    kv = pick("num_key_value_heads", "num_kv_heads", "multi_query_group_num", "n_head_kv")
    head_dim = pick("head_dim")
    if head_dim is None and hidden and heads:
        head_dim = hidden // heads
    window = _int(text.get("sliding_window"))
    if text.get("use_sliding_window") is False:
        window = None
    layer_types = text.get("layer_types")
    dtype = text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype") or config.get("dtype")
    tie = text.get("tie_word_embeddings", config.get("tie_word_embeddings"))
    archs = config.get("architectures") or text.get("architectures") or ()
    return ConfigFacts(
        architectures=tuple(str(a) for a in archs) if isinstance(archs, list) else (),
        model_type=config.get("model_type") if isinstance(config.get("model_type"), str) else None,
        text_model_type=text.get("model_type")
        if nested and isinstance(text.get("model_type"), str)
        else None,
        is_vision_language=nested,
        hidden_size=hidden,
        num_layers=pick("num_hidden_layers", "n_layer", "num_layers"),
        num_heads=heads,
        num_kv_heads=kv if kv is not None else heads,
        head_dim=head_dim,
        vocab_size=pick("vocab_size", "padded_vocab_size"),
        max_position_embeddings=pick(
            "max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"
        ),
        sliding_window=window or None,
        sliding_window_pattern=_int(text.get("sliding_window_pattern")),
        layer_types=tuple(str(t) for t in layer_types) if isinstance(layer_types, list) else (),
        torch_dtype=str(dtype) if isinstance(dtype, str) else None,
        expert_count=pick("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"),
        expert_used_count=pick("num_experts_per_tok", "moe_top_k", "num_experts_per_token"),
        tie_word_embeddings=tie if isinstance(tie, bool) else None,
    )


def _details(q: Mapping[str, Any], *skip: str) -> tuple[tuple[str, str], ...]:
    return tuple(
        (k, json.dumps(v) if not isinstance(v, str) else v)
        for k, v in sorted(q.items())
        if k not in skip and k != "quant_method" and not isinstance(v, Mapping)
    )


def _compressed_tensors(q: Mapping[str, Any]) -> QuantizationFacts:
    groups = q.get("config_groups")
    first: Mapping[str, Any] = {}
    if isinstance(groups, Mapping) and groups:
        g = next(iter(groups.values()))
        first = g if isinstance(g, Mapping) else {}
    w, a = first.get("weights"), first.get("input_activations")
    weights: Mapping[str, Any] = w if isinstance(w, Mapping) else {}
    acts: Mapping[str, Any] | None = a if isinstance(a, Mapping) else None
    bits = _int(weights.get("num_bits"))
    abits = _int(acts.get("num_bits")) if acts else None
    float_kind = weights.get("type") == "float"
    scheme = f"W{bits}A{abits or 16}{'-fp' + str(bits) if float_kind else ''}" if bits else None
    details = _details(q, "format", "config_groups")
    details += tuple(
        (f"weights.{k}", str(v)) for k, v in sorted(weights.items()) if k in ("strategy", "type")
    )
    return QuantizationFacts(
        method="compressed-tensors",
        bits=bits,
        group_size=_int(weights.get("group_size")),
        format=q.get("format") if isinstance(q.get("format"), str) else None,
        scheme=scheme,
        details=details,
    )


def _hf_quantization(q: Mapping[str, Any]) -> QuantizationFacts:
    method = str(q.get("quant_method", "unknown")).lower()
    if method == "compressed-tensors":
        return _compressed_tensors(q)
    bits = _first_int(q, "bits", "w_bit", "weight_bits")
    group = _first_int(q, "group_size", "q_group_size")
    fmt: Any = None
    scheme = None
    if method == "awq":
        fmt = q.get("version")
    elif method == "gptq":
        fmt = q.get("checkpoint_format")
    elif method == "fp8":
        bits = 8
        fmt = q.get("fmt") or "e4m3"
        scheme = "W8A8-fp8"
    elif method == "bitsandbytes":
        if q.get("load_in_4bit"):
            bits, fmt = 4, q.get("bnb_4bit_quant_type")
        elif q.get("load_in_8bit"):
            bits = 8
    elif method == "mxfp4":
        bits, group = 4, group or 32
        fmt = "mxfp4"
    if bits and scheme is None and method in ("awq", "gptq", "bitsandbytes", "mxfp4"):
        scheme = f"W{bits}A16"
    return QuantizationFacts(
        method=method,
        bits=bits,
        group_size=group,
        format=fmt if isinstance(fmt, str) else None,
        scheme=scheme,
        details=_details(
            q, "bits", "w_bit", "group_size", "q_group_size", "version", "checkpoint_format", "fmt"
        ),
    )


def _mlx_quantization(q: Mapping[str, Any]) -> QuantizationFacts:
    overrides: list[tuple[str, int | None]] = []
    for k, v in sorted(q.items()):
        if isinstance(v, Mapping):
            overrides.append((k, _int(v.get("bits"))))
        elif v is False:
            overrides.append((k, None))
    bits = _int(q.get("bits"))
    mode = q.get("mode")
    return QuantizationFacts(
        method="mlx",
        bits=bits,
        group_size=_int(q.get("group_size")),
        format=mode if isinstance(mode, str) else "affine",
        scheme=f"W{bits}A16" if bits else None,
        details=_details(q, "bits", "group_size", "mode"),
        layer_bits=tuple(overrides),
    )


def quantization_facts(config: Mapping[str, Any]) -> QuantizationFacts | None:
    """How the weights are quantized; None for plain (f32/f16/bf16) weights. MLX's key wins over HF's."""
    mlx = config.get("quantization")
    if isinstance(mlx, Mapping) and "bits" in mlx:
        return _mlx_quantization(mlx)
    text, _ = _text(config)
    for source in (config, text):
        q = source.get("quantization_config")
        if isinstance(q, Mapping) and q:
            return _hf_quantization(q)
    return None
