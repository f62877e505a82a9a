"""The per-layer shape of a GGUF model, read from its header only (memory-mapped; tensor data is never read).

`read_gguf_layout(path)` returns a `GGUFLayout` — the facts a memory model needs: per-layer KV heads, key and
value lengths, which layers slide (see `gguf_rules`), which are recurrent, bytes per layer, output and token
embedding bytes, experts, vocabulary, projector facts for an mmproj — or a `GGUFProblem` whose reason says
what to do. It never raises for bad input.

`GGUFLayout.facts` is the same `GGUFFacts` that `gguf_meta.read_gguf` gives (with `tensor_bytes` and
`file_bytes` summed over all parts); it is None only for a diffusion GGUF without `general.architecture`
(stable-diffusion.cpp conversions), which is recognised by its tensor names instead.

Multi-part models (`m-00001-of-00003.gguf`): pass any part (or the parts themselves); all parts must be
present. Header keys come from the first part, tensors from all of them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf

from app.formats.gguf_layout_parts import (
    LayoutProblem,
    OpenPart,
    bool_array,
    int_array,
    int_key,
    key_text,
    open_parts,
    part_paths,
)
from app.formats.gguf_meta import GGUFFacts, GGUFProblem, facts_from_reader
from app.formats.gguf_rules import (
    KV_FROM_START,
    PARALLEL_HYBRID,
    is_recurrent_arch,
    recurrent_layers,
    resolve_swa,
)

# Architectures the ComfyUI-GGUF loader treats as image/video diffusion models (its IMG_ARCH_LIST).
DIFFUSION_ARCHS = frozenset(
    {
        "flux",
        "sd1",
        "sdxl",
        "sd3",
        "aura",
        "hidream",
        "cosmos",
        "ltxv",
        "hyvid",
        "wan",
        "lumina2",
        "qwen_image",
    }
)
# Tensor-name prefixes of diffusion checkpoints converted without an architecture key.
DIFFUSION_TENSOR_PREFIXES = (
    "model.diffusion_model.",
    "first_stage_model.",
    "cond_stage_model.",
    "double_blocks.",
    "single_blocks.",
    "joint_blocks.",
    "input_blocks.",
)
_BLK_RE = re.compile(r"^blk\.(\d+)\.")

KIND_LLM = "llm"
KIND_PROJECTOR = "projector"
KIND_DIFFUSION = "diffusion"


@dataclass(frozen=True)
class ProjectorFacts:
    """An mmproj (`general.architecture == "clip"`): the vision/audio encoder that feeds a language model."""

    projector_type: str | None  # clip.projector_type, else clip.vision/audio.projector_type
    has_vision_encoder: bool
    has_audio_encoder: bool
    vision_block_count: int | None
    vision_embedding_length: int | None
    vision_head_count: int | None
    image_size: int | None
    patch_size: int | None
    projection_dim: int | None
    audio_block_count: int | None
    audio_embedding_length: int | None


@dataclass(frozen=True)
class RecurrentFacts:
    """SSM / RWKV / short-conv hyperparameters as written in the header (None where a key is absent)."""

    conv_kernel: int | None  # {arch}.ssm.conv_kernel
    inner_size: int | None  # {arch}.ssm.inner_size
    state_size: int | None  # {arch}.ssm.state_size
    time_step_rank: int | None  # {arch}.ssm.time_step_rank
    group_count: int | None  # {arch}.ssm.group_count
    wkv_head_size: int | None  # {arch}.wkv.head_size (RWKV)
    token_shift_count: int | None  # {arch}.token_shift_count (RWKV; llama.cpp defaults to 2)
    shortconv_l_cache: int | None  # {arch}.shortconv.l_cache (LFM2)
    full_attention_interval: int | None  # {arch}.full_attention_interval (qwen3next family)

    def conv_state_elements(self, embedding_length: int) -> int:
        """f32 elements of the rolling (conv / token-shift) state per layer per sequence: llama.cpp's
        `n_embd_r()` for mamba, rwkv and lfm2; other recurrent kinds (gated delta nets) may differ."""
        if self.wkv_head_size:
            return (self.token_shift_count or 2) * embedding_length
        if self.shortconv_l_cache:
            return embedding_length * (self.shortconv_l_cache - 1)
        d_conv = self.conv_kernel or 0
        inner = (self.inner_size or 0) + 2 * (self.group_count or 0) * (self.state_size or 0)
        return (d_conv - 1 if d_conv > 0 else 0) * inner

    def ssm_state_elements(self, embedding_length: int) -> int:
        """f32 elements of the recurrent state per layer per sequence: llama.cpp's `n_embd_s()`."""
        if self.wkv_head_size:
            return embedding_length * self.wkv_head_size
        return (self.state_size or 0) * (self.inner_size or 0)


@dataclass(frozen=True)
class GGUFLayout:
    """Per-layer facts of a GGUF model. Tuples indexed by layer have `block_count` entries.

    Byte counts are exact tensor sizes from the tensor table: `sum(layer_bytes) + token_embd_bytes +
    output_bytes + other_bytes == tensor_bytes`.
    """

    path: Path  # the first part
    parts: tuple[Path, ...]  # every part, in order (one entry for a single file)
    kind: str  # "llm", "projector" (mmproj) or "diffusion"
    architecture: str | None
    facts: GGUFFacts | None
    file_type: str | None  # general.file_type as a llama_ftype name, e.g. "mostly_q4_k_m"
    block_count: int
    context_length: int | None  # trained context
    embedding_length: int | None
    vocab_size: int | None  # {arch}.vocab_size, else the token list's length, else token_embd's 2nd dim
    head_count: tuple[int, ...]
    head_count_kv: tuple[int, ...]  # per layer; defaults to head_count, 0 on recurrent-only layers
    feed_forward_length: tuple[int, ...]
    key_length: int | None  # per KV head; defaults to embedding_length / head_count[0] as llama.cpp does
    value_length: int | None
    key_length_swa: int | None  # sliding layers' key length where the header has one (gemma4); else None
    value_length_swa: int | None
    kv_lora_rank: int | None  # MLA (deepseek2 family); the cache sizes are already in key/value_length
    sliding_window: int | None  # tokens; None when no layer slides
    swa_kind: str | None  # "standard", "chunked" (llama4) or "symmetric"
    swa_layers: tuple[bool, ...]
    swa_rule: str  # how swa_layers was decided (see gguf_rules)
    recurrent: RecurrentFacts | None
    recurrent_layers: tuple[bool, ...]
    kv_layers: tuple[bool, ...]  # layers that own a KV cache (attention, not shared, not recurrent-only)
    expert_count: int | None
    expert_used_count: int | None
    expert_shared_count: int | None
    expert_feed_forward_length: int | None
    layer_bytes: tuple[int, ...]  # sum of `blk.N.*` tensors per N
    token_embd_bytes: int  # token_embd.*
    output_bytes: int  # output.* and output_norm.*
    output_tied: bool  # no output.weight: llama.cpp reuses token_embd as the output matrix
    other_bytes: int  # every other tensor (rope freqs, position or per-layer embeddings, ...)
    other_tensors: tuple[tuple[str, int], ...]  # those tensors, largest first
    tensor_count: int
    tensor_bytes: int
    file_bytes: int  # all parts together
    tensor_types: tuple[tuple[str, int], ...]  # bytes per ggml type, largest first
    projector: ProjectorFacts | None

    @property
    def largest_layer_bytes(self) -> int:
        return max(self.layer_bytes, default=0)

    @property
    def is_projector(self) -> bool:
        return self.kind == KIND_PROJECTOR

    @property
    def is_diffusion(self) -> bool:
        return self.kind == KIND_DIFFUSION

    @property
    def is_moe(self) -> bool:
        return bool(self.expert_count)

    @property
    def swa_layer_count(self) -> int:
        return sum(self.swa_layers)

    @property
    def key_lengths(self) -> tuple[int | None, ...]:
        """Per-layer key length: the SWA length on sliding layers where the header has one."""
        swa = self.key_length_swa if self.key_length_swa is not None else self.key_length
        return tuple(swa if s else self.key_length for s in self.swa_layers)

    @property
    def value_lengths(self) -> tuple[int | None, ...]:
        swa = self.value_length_swa if self.value_length_swa is not None else self.value_length
        return tuple(swa if s else self.value_length for s in self.swa_layers)

    def public(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "architecture": self.architecture,
            "parts": [str(p) for p in self.parts],
            "file_type": self.file_type,
            "block_count": self.block_count,
            "context_length": self.context_length,
            "vocab_size": self.vocab_size,
            "head_count_kv": list(self.head_count_kv),
            "key_length": self.key_length,
            "value_length": self.value_length,
            "sliding_window": self.sliding_window,
            "swa_layers": self.swa_layer_count,
            "swa_rule": self.swa_rule,
            "recurrent_layers": sum(self.recurrent_layers),
            "kv_layers": sum(self.kv_layers),
            "expert_count": self.expert_count,
            "expert_used_count": self.expert_used_count,
            "largest_layer_bytes": self.largest_layer_bytes,
            "token_embd_bytes": self.token_embd_bytes,
            "output_bytes": self.output_bytes,
            "tensor_bytes": self.tensor_bytes,
            "file_bytes": self.file_bytes,
        }


# Layouts already read, by the identity of their files: a lane start re-plans from the header each time, and
# parsing it (the vocabulary above all) costs tens of milliseconds before the engine can be spawned. A file
# that is replaced, rewritten or touched has another identity and is read afresh.
_READ: dict[tuple[tuple[str, int, int, int, int], ...], GGUFLayout] = {}
_READ_MAX = 64


def _identity(path: Path | Sequence[Path]) -> tuple[tuple[str, int, int, int, int], ...] | None:
    paths = part_paths(path) if isinstance(path, Path) else tuple(path)
    if isinstance(paths, GGUFProblem) or not paths:
        return None
    try:
        stats = [(str(p), os.stat(p)) for p in paths]
    except OSError:
        return None
    return tuple(sorted((n, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino) for n, st in stats))


def read_gguf_layout(path: Path | Sequence[Path]) -> GGUFLayout | GGUFProblem:
    """The layout of the GGUF at `path` (any part of a multi-part model, or all its parts); a file read
    before and unchanged since is not parsed again."""
    key = _identity(path)
    known = _READ.get(key) if key is not None else None
    if known is not None:
        return known
    got = _read_layout(path)
    if key is not None and isinstance(got, GGUFLayout):
        if len(_READ) >= _READ_MAX:
            _READ.pop(next(iter(_READ)))
        _READ[key] = got
    return got


def _read_layout(path: Path | Sequence[Path]) -> GGUFLayout | GGUFProblem:
    parts = open_parts(path)
    if isinstance(parts, GGUFProblem):
        return parts
    try:
        return _layout(parts)
    except LayoutProblem as exc:
        return GGUFProblem(exc.reason)


def _tensor_sums(parts: list[OpenPart]) -> dict[str, Any]:
    layer: dict[int, int] = {}
    token_embd = output = other = count = total = 0
    others: list[tuple[str, int]] = []
    types: dict[str, int] = {}
    names: set[str] = set()
    for part in parts:
        for t in part.reader.tensors:
            size = int(t.n_bytes)
            count += 1
            total += size
            names.add(t.name)
            types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + size
            m = _BLK_RE.match(t.name)
            if m:
                layer[int(m[1])] = layer.get(int(m[1]), 0) + size
            elif t.name.startswith("token_embd."):
                token_embd += size
            elif t.name.startswith(("output.", "output_norm.")):
                output += size
            else:
                other += size
                others.append((t.name, size))
    return {
        "layer": layer,
        "token_embd": token_embd,
        "output": output,
        "other": other,
        "others": tuple(sorted(others, key=lambda x: (-x[1], x[0]))),
        "count": count,
        "total": total,
        "types": tuple(sorted(types.items(), key=lambda x: (-x[1], x[0]))),
        "names": names,
    }


def _vocab_size(fields: Any, arch: str, parts: list[OpenPart]) -> int | None:
    explicit = int_key(fields, f"{arch}.vocab_size")
    if explicit:
        return explicit
    tokens = fields.get("tokenizer.ggml.tokens")
    if tokens is not None and tokens.types and tokens.types[0] == gguf.GGUFValueType.ARRAY:
        return len(tokens.data)  # counted without decoding 100k+ strings
    for part in parts:
        for t in part.reader.tensors:
            if t.name == "token_embd.weight" and len(t.shape) >= 2:
                return int(t.shape[1])
    return None


def _projector(fields: Any) -> ProjectorFacts:
    ptype = key_text(fields, "clip.projector_type") or key_text(fields, "clip.vision.projector_type")
    ptype = ptype or key_text(fields, "clip.audio.projector_type")

    def flag(key: str, fallback_prefix: str) -> bool:
        f = fields.get(key)
        if f is not None:
            return bool(f.contents())
        return any(k.startswith(fallback_prefix) for k in fields)

    return ProjectorFacts(
        projector_type=ptype,
        has_vision_encoder=flag("clip.has_vision_encoder", "clip.vision."),
        has_audio_encoder=flag("clip.has_audio_encoder", "clip.audio."),
        vision_block_count=int_key(fields, "clip.vision.block_count"),
        vision_embedding_length=int_key(fields, "clip.vision.embedding_length"),
        vision_head_count=int_key(fields, "clip.vision.attention.head_count"),
        image_size=int_key(fields, "clip.vision.image_size"),
        patch_size=int_key(fields, "clip.vision.patch_size"),
        projection_dim=int_key(fields, "clip.vision.projection_dim"),
        audio_block_count=int_key(fields, "clip.audio.block_count"),
        audio_embedding_length=int_key(fields, "clip.audio.embedding_length"),
    )


def _recurrent(fields: Any, arch: str) -> RecurrentFacts | None:
    keys = {
        "conv_kernel": f"{arch}.ssm.conv_kernel",
        "inner_size": f"{arch}.ssm.inner_size",
        "state_size": f"{arch}.ssm.state_size",
        "time_step_rank": f"{arch}.ssm.time_step_rank",
        "group_count": f"{arch}.ssm.group_count",
        "wkv_head_size": f"{arch}.wkv.head_size",
        "token_shift_count": f"{arch}.token_shift_count",
        "shortconv_l_cache": f"{arch}.shortconv.l_cache",
        "full_attention_interval": f"{arch}.full_attention_interval",
    }
    values = {name: int_key(fields, key) for name, key in keys.items()}
    if not is_recurrent_arch(arch) and all(v is None for v in values.values()):
        return None
    return RecurrentFacts(**values)


def _classify(fields: Any, arch: str | None, names: set[str]) -> str:
    if arch == "clip" or any(k.startswith("clip.") for k in fields):
        return KIND_PROJECTOR
    if arch in DIFFUSION_ARCHS or (
        arch is None and any(n.startswith(DIFFUSION_TENSOR_PREFIXES) for n in names)
    ):
        return KIND_DIFFUSION
    return KIND_LLM


def _layout(parts: list[OpenPart]) -> GGUFLayout | GGUFProblem:
    first = parts[0]
    fields = first.reader.fields
    arch = key_text(fields, "general.architecture")
    sums = _tensor_sums(parts)
    kind = _classify(fields, arch, sums["names"])
    file_bytes = sum(p.size for p in parts)
    facts: GGUFFacts | None = None
    if arch is not None:
        got = facts_from_reader(first.reader, tensor_bytes=sums["total"], file_bytes=file_bytes)
        if isinstance(got, GGUFProblem):
            return got
        facts = got
    elif kind != KIND_DIFFUSION:
        return GGUFProblem("the GGUF has no general.architecture key; it is not a model llama.cpp can load")
    a = arch or ""
    n_layer = int_key(fields, f"{a}.block_count") or 0
    layer_map: dict[int, int] = sums["layer"]
    if kind == KIND_LLM and layer_map and max(layer_map) >= n_layer:
        return GGUFProblem(
            f"the tensor table has blk.{max(layer_map)} but the header says {n_layer} layers; "
            "the file is inconsistent, download it again"
        )
    n_slots = max([n_layer, *(i + 1 for i in layer_map)])
    layer_bytes = tuple(layer_map.get(i, 0) for i in range(n_slots))
    heads = int_array(fields, f"{a}.attention.head_count", n_layer) or (0,) * n_layer
    kv = int_array(fields, f"{a}.attention.head_count_kv", n_layer) or heads
    ff = int_array(fields, f"{a}.feed_forward_length", n_layer) or (0,) * n_layer
    embd = int_key(fields, f"{a}.embedding_length")
    k_len = int_key(fields, f"{a}.attention.key_length")
    v_len = int_key(fields, f"{a}.attention.value_length")
    if embd is not None and heads and heads[0] > 0:
        k_len = embd // heads[0] if k_len is None else k_len
        v_len = embd // heads[0] if v_len is None else v_len
    elif embd is not None:
        k_len = 0 if k_len is None else k_len  # no attention heads (pure SSM): llama.cpp uses 0
        v_len = 0 if v_len is None else v_len
    pattern_field = f"{a}.attention.sliding_window_pattern"
    pattern: int | tuple[bool, ...] | None = bool_array(fields, pattern_field, n_layer)
    if pattern is None:
        pattern = int_key(fields, pattern_field)
    swa = resolve_swa(
        a, n_layer=n_layer, window=int_key(fields, f"{a}.attention.sliding_window"), pattern=pattern
    )
    recurrent = _recurrent(fields, a) if arch else None
    rec_layers = recurrent_layers(
        a,
        head_count_kv=kv,
        feed_forward_length=ff,
        full_attention_interval=recurrent.full_attention_interval if recurrent else None,
        has_recurrent_keys=recurrent is not None,
    )
    shared = int_key(fields, f"{a}.attention.shared_kv_layers")
    kv_from_start = n_layer - shared if shared else KV_FROM_START.get(a, n_layer)
    kv_layers = tuple(
        kv[il] > 0 and il < kv_from_start and (not rec_layers[il] or a in PARALLEL_HYBRID)
        for il in range(n_layer)
    )
    return GGUFLayout(
        path=first.path,
        parts=tuple(p.path for p in parts),
        kind=kind,
        architecture=arch,
        facts=facts,
        file_type=facts.file_type if facts else None,
        block_count=n_layer,
        context_length=int_key(fields, f"{a}.context_length"),
        embedding_length=embd,
        vocab_size=_vocab_size(fields, a, parts) if kind == KIND_LLM else None,
        head_count=heads,
        head_count_kv=kv,
        feed_forward_length=ff,
        key_length=k_len,
        value_length=v_len,
        key_length_swa=int_key(fields, f"{a}.attention.key_length_swa"),
        value_length_swa=int_key(fields, f"{a}.attention.value_length_swa"),
        kv_lora_rank=int_key(fields, f"{a}.attention.kv_lora_rank"),
        sliding_window=swa.window,
        swa_kind=swa.kind,
        swa_layers=swa.layers,
        swa_rule=swa.rule,
        recurrent=recurrent,
        recurrent_layers=rec_layers,
        kv_layers=kv_layers,
        expert_count=int_key(fields, f"{a}.expert_count"),
        expert_used_count=int_key(fields, f"{a}.expert_used_count"),
        expert_shared_count=int_key(fields, f"{a}.expert_shared_count"),
        expert_feed_forward_length=int_key(fields, f"{a}.expert_feed_forward_length"),
        layer_bytes=layer_bytes,
        token_embd_bytes=sums["token_embd"],
        output_bytes=sums["output"],
        output_tied="output.weight" not in sums["names"] and "token_embd.weight" in sums["names"],
        other_bytes=sums["other"],
        other_tensors=sums["others"],
        tensor_count=sums["count"],
        tensor_bytes=sums["total"],
        file_bytes=file_bytes,
        tensor_types=sums["types"],
        projector=_projector(fields) if kind == KIND_PROJECTOR else None,
    )
