"""Model files of many shapes, written by the tests (zero weights; only headers and sizes matter here).

GGUF files go through the `gguf` package's writer (its split support for multi-part files); safetensors
files are written by hand (8-byte little-endian header length, JSON header, zero data); whisper ggml and
piper voices follow whisper.cpp's and piper's layouts. Each writer reports what it wrote so tests compare the
readers against an independent count.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import numpy as np

# ---------------------------------------------------------------------------------------------- GGUF


@dataclass(frozen=True)
class GGUFSpec:
    arch: str = "llama"
    n_layer: int = 2
    n_embd: int = 64
    n_head: int | tuple[int, ...] = 4
    n_head_kv: int | tuple[int, ...] = 2
    n_ff: int = 128
    n_vocab: int = 40
    n_ctx: int = 4096
    head_dim: int | None = None  # written as key_length / value_length when set
    value_dim: int | None = None
    sliding_window: int | None = None
    swa_pattern: int | tuple[bool, ...] | None = None
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 32
    ssm: Mapping[str, int] = field(default_factory=dict)  # e.g. {"conv_kernel": 4, "state_size": 16}
    vocab_size_key: bool = False  # write {arch}.vocab_size as well
    token_list: bool = True
    tied_output: bool = False
    dtype: str = "f32"  # matrices as "f32", "f16" or "q8_0" (norms stay f32)
    split_max_tensors: int = 0
    extra_kv: Mapping[str, int] = field(default_factory=dict)  # uint32 keys, "{arch}" expanded
    extra_tensors: tuple[tuple[str, tuple[int, ...]], ...] = ()  # f32, numpy order (rows, cols)


@dataclass(frozen=True)
class Written:
    paths: tuple[Path, ...]
    tensor_bytes: dict[str, int]  # bytes of each tensor as handed to the writer

    @property
    def path(self) -> Path:
        return self.paths[0]

    def layer_bytes(self, il: int) -> int:
        return sum(v for k, v in self.tensor_bytes.items() if k.startswith(f"blk.{il}."))


def _per_layer(value: int | tuple[int, ...], n: int) -> tuple[int, ...]:
    return value if isinstance(value, tuple) else (value,) * n


class _Tensors:
    def __init__(self, writer: gguf.GGUFWriter, dtype: str) -> None:
        self.w = writer
        self.dtype = dtype
        self.bytes: dict[str, int] = {}

    def vec(self, name: str, *shape: int) -> None:
        data = np.zeros(shape, dtype=np.float32)
        self.w.add_tensor(name, data)
        self.bytes[name] = int(data.nbytes)

    def mat(self, name: str, *shape: int) -> None:
        if self.dtype == "q8_0":
            rows, cols = math.prod(shape[:-1]), shape[-1]
            data = np.zeros((rows, cols // 32 * 34), dtype=np.uint8)
            self.w.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            data = np.zeros(shape, dtype=np.float16 if self.dtype == "f16" else np.float32)
            self.w.add_tensor(name, data)
        self.bytes[name] = int(data.nbytes)


_FILE_TYPES = {
    "f32": gguf.LlamaFileType.ALL_F32,
    "f16": gguf.LlamaFileType.MOSTLY_F16,
    "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
}


def write_gguf(path: Path, spec: GGUFSpec) -> Written:
    """Write a GGUF of `spec`'s shape; with `split_max_tensors` it is split into `path`-0000N-of-0000M."""
    path.parent.mkdir(parents=True, exist_ok=True)
    n = spec.n_layer
    heads, kv = _per_layer(spec.n_head, n), _per_layer(spec.n_head_kv, n)
    hd = spec.head_dim or (spec.n_embd // heads[0] if heads[0] else 0)
    vd = spec.value_dim or hd
    w = gguf.GGUFWriter(str(path), spec.arch, split_max_tensors=spec.split_max_tensors)
    w.add_name(f"gen-{spec.arch}")
    w.add_context_length(spec.n_ctx)
    w.add_embedding_length(spec.n_embd)
    w.add_block_count(n)
    w.add_feed_forward_length(spec.n_ff)
    w.add_head_count(spec.n_head if isinstance(spec.n_head, int) else list(spec.n_head))
    w.add_head_count_kv(spec.n_head_kv if isinstance(spec.n_head_kv, int) else list(spec.n_head_kv))
    w.add_file_type(_FILE_TYPES[spec.dtype])
    if spec.head_dim:
        w.add_key_length(hd)
        w.add_value_length(vd)
    if spec.sliding_window is not None:
        w.add_sliding_window(spec.sliding_window)
    if spec.swa_pattern is not None:
        w.add_sliding_window_pattern(spec.swa_pattern)
    if spec.n_expert:
        w.add_expert_count(spec.n_expert)
        w.add_expert_used_count(spec.n_expert_used)
        w.add_expert_feed_forward_length(spec.n_ff_exp)
    for key, value in spec.ssm.items():
        w.add_uint32(f"{spec.arch}.ssm.{key}", value)
    for key, value in spec.extra_kv.items():
        w.add_uint32(key.format(arch=spec.arch), value)
    if spec.vocab_size_key:
        w.add_vocab_size(spec.n_vocab)
    if spec.token_list:
        w.add_tokenizer_model("gpt2")
        w.add_token_list([f"t{i}".encode() for i in range(spec.n_vocab)])
    t = _Tensors(w, spec.dtype)
    t.mat("token_embd.weight", spec.n_vocab, spec.n_embd)
    for il in range(n):
        p = f"blk.{il}."
        if kv[il] > 0:
            t.vec(p + "attn_norm.weight", spec.n_embd)
            t.mat(p + "attn_q.weight", heads[il] * hd, spec.n_embd)
            t.mat(p + "attn_k.weight", kv[il] * hd, spec.n_embd)
            t.mat(p + "attn_v.weight", kv[il] * vd, spec.n_embd)
            t.mat(p + "attn_output.weight", spec.n_embd, heads[il] * vd)
        else:  # a recurrent (SSM) layer
            inner = spec.ssm.get("inner_size", 2 * spec.n_embd)
            t.vec(p + "ssm_norm.weight", spec.n_embd)
            t.mat(p + "ssm_in.weight", 2 * inner, spec.n_embd)
            t.mat(p + "ssm_out.weight", spec.n_embd, inner)
        t.vec(p + "ffn_norm.weight", spec.n_embd)
        if spec.n_expert:
            t.mat(p + "ffn_gate_inp.weight", spec.n_expert, spec.n_embd)
            t.mat(p + "ffn_gate_exps.weight", spec.n_expert, spec.n_ff_exp, spec.n_embd)
            t.mat(p + "ffn_up_exps.weight", spec.n_expert, spec.n_ff_exp, spec.n_embd)
            t.mat(p + "ffn_down_exps.weight", spec.n_expert, spec.n_embd, spec.n_ff_exp)
        else:
            t.mat(p + "ffn_gate.weight", spec.n_ff, spec.n_embd)
            t.mat(p + "ffn_up.weight", spec.n_ff, spec.n_embd)
            t.mat(p + "ffn_down.weight", spec.n_embd, spec.n_ff)
    for name, shape in spec.extra_tensors:
        t.vec(name, *shape)
    t.vec("output_norm.weight", spec.n_embd)
    if not spec.tied_output:
        t.mat("output.weight", spec.n_vocab, spec.n_embd)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if spec.split_max_tensors:
        paths = tuple(sorted(path.parent.glob(f"{path.stem}-*-of-*.gguf")))
    else:
        paths = (path,)
    return Written(paths=paths, tensor_bytes=t.bytes)


def write_mmproj(path: Path) -> Written:
    """A llava-style vision projector GGUF (`general.architecture = clip`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), "clip")
    w.add_string("clip.projector_type", "mlp")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.has_llava_projector", True)
    w.add_uint32("clip.vision.block_count", 2)
    w.add_uint32("clip.vision.embedding_length", 32)
    w.add_uint32("clip.vision.attention.head_count", 4)
    w.add_uint32("clip.vision.image_size", 224)
    w.add_uint32("clip.vision.patch_size", 14)
    w.add_uint32("clip.vision.projection_dim", 64)
    t = _Tensors(w, "f32")
    t.mat("v.patch_embd.weight", 32, 3 * 14 * 14)
    for il in range(2):
        t.mat(f"v.blk.{il}.attn_q.weight", 32, 32)
        t.mat(f"v.blk.{il}.ffn_up.weight", 64, 32)
    t.mat("mm.0.weight", 64, 32)
    t.mat("mm.2.weight", 64, 64)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Written(paths=(path,), tensor_bytes=t.bytes)


def write_diffusion_gguf(path: Path, *, arch: str | None) -> Written:
    """A diffusion-model GGUF: with `arch` like ComfyUI-GGUF's conversions, without it like
    stable-diffusion.cpp's (no general.architecture, tensors named model.diffusion_model.*)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), arch or "unused")
    if arch is None:
        del w.kv_data[0][gguf.Keys.General.ARCHITECTURE]
    t = _Tensors(w, "f16")
    prefix = "double_blocks.0." if arch == "flux" else "model.diffusion_model.input_blocks.0.0."
    t.mat(prefix + "img_attn.qkv.weight", 96, 32)
    t.mat(prefix + "img_mlp.0.weight", 128, 32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Written(paths=(path,), tensor_bytes=t.bytes)


# ---------------------------------------------------------------------------------------- safetensors

DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "I64": 8, "U8": 1, "F8_E4M3": 1}
TensorSpec = tuple[str, tuple[int, ...]]  # (dtype, shape)


def safetensors_header(tensors: Mapping[str, TensorSpec], metadata: Mapping[str, str] | None = None) -> dict:
    """The header dict of a file holding `tensors` back to back in the given order."""
    header: dict[str, Any] = {}
    if metadata is not None:
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name, (dtype, shape) in tensors.items():
        size = math.prod(shape) * DTYPE_BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    return header


def write_safetensors(
    path: Path, tensors: Mapping[str, TensorSpec], metadata: Mapping[str, str] | None = None
) -> dict:
    """Write a safetensors file by hand (zero data); returns its header dict."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = safetensors_header(tensors, metadata)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the reference writer pads the header to 8 bytes with spaces
    data_end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    with path.open("wb") as fh:
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        fh.write(b"\0" * data_end)
    return header


def write_hf_dir(
    folder: Path,
    config: Mapping[str, Any],
    tensors: Mapping[str, TensorSpec],
    *,
    shards: int = 1,
    metadata: Mapping[str, str] | None = None,
) -> list[dict]:
    """A Hugging Face model folder: config.json plus one file or `shards` files with an index."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    names = list(tensors)
    if shards == 1:
        return [write_safetensors(folder / "model.safetensors", tensors, metadata)]
    per = math.ceil(len(names) / shards)
    headers, weight_map, total = [], {}, 0
    for i in range(shards):
        part = {n: tensors[n] for n in names[i * per : (i + 1) * per]}
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        headers.append(write_safetensors(folder / fname, part, metadata))
        for n, (dtype, shape) in part.items():
            weight_map[n] = fname
            total += math.prod(shape) * DTYPE_BYTES[dtype]
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return headers


@dataclass(frozen=True)
class LlamaDims:
    n_layer: int = 2
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    ff: int = 128
    vocab: int = 100

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def linears(self) -> list[tuple[str, int, int]]:
        """(name, out, in) of every linear layer in the decoder."""
        kv = self.kv_heads * self.head_dim
        out: list[tuple[str, int, int]] = []
        for il in range(self.n_layer):
            p = f"model.layers.{il}."
            out += [
                (p + "self_attn.q_proj", self.hidden, self.hidden),
                (p + "self_attn.k_proj", kv, self.hidden),
                (p + "self_attn.v_proj", kv, self.hidden),
                (p + "self_attn.o_proj", self.hidden, self.hidden),
                (p + "mlp.gate_proj", self.ff, self.hidden),
                (p + "mlp.up_proj", self.ff, self.hidden),
                (p + "mlp.down_proj", self.hidden, self.ff),
            ]
        return out

    def logical_params(self) -> int:
        """Weights of the unquantized model: embeddings, lm_head, norms and every linear."""
        norms = (2 * self.n_layer + 1) * self.hidden
        return 2 * self.vocab * self.hidden + norms + sum(o * i for _, o, i in self.linears())

    def config(self, **extra: Any) -> dict[str, Any]:
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": self.hidden,
            "num_hidden_layers": self.n_layer,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "intermediate_size": self.ff,
            "vocab_size": self.vocab,
            "max_position_embeddings": 8192,
            "torch_dtype": "bfloat16",
            **extra,
        }


DIMS_DEFAULT = LlamaDims()


def linear_tensors(
    name: str, out: int, inp: int, scheme: str, bits: int, group: int
) -> dict[str, TensorSpec]:
    pack = 32 // bits
    if scheme == "plain":
        return {name + ".weight": ("BF16", (out, inp))}
    if scheme == "awq":
        return {
            name + ".qweight": ("I32", (inp, out // pack)),
            name + ".qzeros": ("I32", (inp // group, out // pack)),
            name + ".scales": ("F16", (inp // group, out)),
        }
    if scheme == "gptq":
        return {
            name + ".qweight": ("I32", (inp // pack, out)),
            name + ".qzeros": ("I32", (inp // group, out // pack)),
            name + ".scales": ("F16", (inp // group, out)),
            name + ".g_idx": ("I32", (inp,)),
        }
    if scheme == "fp8":
        return {
            name + ".weight": ("F8_E4M3", (out, inp)),
            name + ".weight_scale_inv": ("F32", (math.ceil(out / 128), math.ceil(inp / 128))),
        }
    if scheme == "mlx":
        return {
            name + ".weight": ("U32", (out, inp // pack)),
            name + ".scales": ("BF16", (out, inp // group)),
            name + ".biases": ("BF16", (out, inp // group)),
        }
    if scheme == "compressed":
        return {
            name + ".weight_packed": ("I32", (out, inp // pack)),
            name + ".weight_scale": ("BF16", (out, inp // group)),
            name + ".weight_shape": ("I64", (2,)),
        }
    raise ValueError(scheme)


def llama_tensors(
    dims: LlamaDims, scheme: str = "plain", *, bits: int = 4, group: int = 32, prefix: str = ""
) -> dict[str, TensorSpec]:
    """A llama decoder's safetensors, with its linears stored the way `scheme` stores them."""
    tensors: dict[str, TensorSpec] = {
        prefix + "model.embed_tokens.weight": ("BF16", (dims.vocab, dims.hidden))
    }
    for il in range(dims.n_layer):
        p = f"{prefix}model.layers.{il}."
        tensors[p + "input_layernorm.weight"] = ("BF16", (dims.hidden,))
        tensors[p + "post_attention_layernorm.weight"] = ("BF16", (dims.hidden,))
    for name, out, inp in dims.linears():
        tensors.update(linear_tensors(prefix + name, out, inp, scheme, bits, group))
    tensors[prefix + "model.norm.weight"] = ("BF16", (dims.hidden,))
    tensors[prefix + "lm_head.weight"] = ("BF16", (dims.vocab, dims.hidden))
    return tensors


def write_diffusers(folder: Path) -> dict[str, int]:
    """A small StableDiffusionPipeline folder; returns the tensor bytes written per component (default
    variant only: the unet also ships an fp16 variant that must not be counted)."""
    index = {
        "_class_name": "StableDiffusionPipeline",
        "_diffusers_version": "0.30.0",
        "unet": ["diffusers", "UNet2DConditionModel"],
        "vae": ["diffusers", "AutoencoderKL"],
        "text_encoder": ["transformers", "CLIPTextModel"],
        "tokenizer": ["transformers", "CLIPTokenizer"],
        "scheduler": ["diffusers", "PNDMScheduler"],
        "safety_checker": [None, None],
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model_index.json").write_text(json.dumps(index))
    unet = {"conv_in.weight": ("F32", (32, 4, 3, 3)), "conv_out.weight": ("F32", (4, 32, 3, 3))}
    write_safetensors(folder / "unet" / "diffusion_pytorch_model.safetensors", unet)
    unet16 = {k: ("F16", s) for k, (_, s) in unet.items()}
    write_safetensors(folder / "unet" / "diffusion_pytorch_model.fp16.safetensors", unet16)
    (folder / "unet" / "config.json").write_text(json.dumps({"_class_name": "UNet2DConditionModel"}))
    vae = {"encoder.conv_in.weight": ("F32", (16, 3, 3, 3))}
    write_safetensors(folder / "vae" / "diffusion_pytorch_model.safetensors", vae)
    text = {"text_model.embeddings.token_embedding.weight": ("F16", (100, 32))}
    write_safetensors(folder / "text_encoder" / "model.safetensors", text)
    (folder / "tokenizer").mkdir()
    (folder / "tokenizer" / "vocab.json").write_text("{}")
    (folder / "scheduler").mkdir()
    (folder / "scheduler" / "scheduler_config.json").write_text("{}")
    return {
        "unet": (32 * 4 * 9 * 2) * 4,
        "vae": 16 * 3 * 9 * 4,
        "text_encoder": 100 * 32 * 2,
    }


# ------------------------------------------------------------------------------------------- speech

WHISPER_MAGIC = 0x67676D6C


@dataclass(frozen=True)
class WhisperSpec:
    n_vocab: int = 51864  # English-only
    n_audio_ctx: int = 1500
    n_audio_state: int = 384
    n_audio_head: int = 6
    n_audio_layer: int = 4  # tiny
    n_text_ctx: int = 448
    n_text_state: int = 384
    n_text_head: int = 6
    n_text_layer: int = 4
    n_mels: int = 80
    ftype: int = 1  # f16
    n_fft: int = 201


def write_whisper_ggml(path: Path, spec: WhisperSpec = WhisperSpec(), *, tokens: int = 8) -> int:
    """A whisper.cpp ggml file: magic, hparams, mel filters, vocabulary, one tensor. Returns its size."""
    path.parent.mkdir(parents=True, exist_ok=True)
    hp = (
        spec.n_vocab,
        spec.n_audio_ctx,
        spec.n_audio_state,
        spec.n_audio_head,
        spec.n_audio_layer,
        spec.n_text_ctx,
        spec.n_text_state,
        spec.n_text_head,
        spec.n_text_layer,
        spec.n_mels,
        spec.ftype,
    )
    out = bytearray(struct.pack("<I11i", WHISPER_MAGIC, *hp))
    out += struct.pack("<2i", spec.n_mels, spec.n_fft)
    out += np.zeros(spec.n_mels * spec.n_fft, dtype=np.float32).tobytes()
    out += struct.pack("<i", tokens)  # whisper.cpp reads this count, then that many tokens
    for i in range(tokens):
        word = f"tok{i}".encode()
        out += struct.pack("<I", len(word)) + word
    name = b"encoder.positional_embedding"
    out += struct.pack("<3i", 2, len(name), 0) + struct.pack("<2i", spec.n_audio_state, 4) + name
    out += np.zeros(spec.n_audio_state * 4, dtype=np.float32).tobytes()
    path.write_bytes(bytes(out))
    return len(out)


def write_piper_voice(folder: Path, name: str = "en_US-test-medium", **overrides: Any) -> Path:
    """A piper voice: `<name>.onnx` (a protobuf-looking stub) and `<name>.onnx.json`; returns the .onnx."""
    folder.mkdir(parents=True, exist_ok=True)
    onnx = folder / f"{name}.onnx"
    onnx.write_bytes(b"\x08\x07\x12\x07pytorch\x1a\x052.1.0" + b"\0" * 64)
    config: dict[str, Any] = {
        "audio": {"sample_rate": 22050, "quality": "medium"},
        "espeak": {"voice": "en-us"},
        "language": {"code": "en_US", "family": "en", "region": "US"},
        "inference": {"noise_scale": 0.667, "length_scale": 1, "noise_w": 0.8},
        "phoneme_type": "espeak",
        "phoneme_map": {},
        "phoneme_id_map": {"_": [0], "^": [1], "$": [2]},
        "num_symbols": 256,
        "num_speakers": 1,
        "speaker_id_map": {},
        "piper_version": "1.0.0",
        "dataset": "test",
    }
    config.update(overrides)
    onnx.with_name(onnx.name + ".json").write_text(json.dumps(config))
    return onnx
