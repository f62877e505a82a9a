"""Per-component memory of a llama.cpp lane, in bytes, from the GGUF layout alone.

Weights are the bytes of the tensors placed on a device (layers are offloaded from the last; the
output layer goes to the GPU only on full offload; the token embedding stays on the host). The
KV cache follows llama.cpp's own sizing (see ANCHORS.md): per attention layer, cells x KV heads x
(key length x B(type_k) + value length x B(type_v)); sliding-window layers hold
min(cells per sequence, window + ubatch) per sequence. Compute buffers are an empirical fit of
what llama.cpp reserves (calibration table in docs/fit.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.formats.gguf_layout import GGUFLayout

MIB = 1 << 20
# bytes per element of each KV cache type (block types: block bytes / 32 elements)
KV_TYPE_BYTES: dict[str, float] = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q5_1": 24 / 32,
    "q5_0": 22 / 32,
    "q4_1": 20 / 32,
    "q4_0": 18 / 32,
    "iq4_nl": 18 / 32,
}
CTX_PAD = 256  # llama.cpp rounds cache sizes up to this many cells
# Engine process baseline (worker interpreter, llama.cpp runtime, HTTP server), measured on the CPU build.
HOST_BASELINE = 40 * MIB
# A CUDA/ROCm context and the backend's own allocations before any buffer; a conservative figure.
GPU_CONTEXT = 384 * MIB


def pad(n: int, to: int = CTX_PAD) -> int:
    return -(-n // to) * to


@dataclass(frozen=True)
class FitParams:
    """The lane settings that decide memory. `ctx_size` is the total across slots, as llama.cpp's -c."""

    ctx_size: int
    parallel: int = 1
    kv_type: str = "f16"
    flash_attn: bool = True
    n_ubatch: int = 512
    gpu_layers: int = 0  # layers on the GPU; block_count + 1 also puts the output layer there
    prompt_cache_bytes: int = 0  # the server's host-RAM prompt cache limit (an upper bound)
    # a vision projector loaded beside the weights (app/fit/projector.py): its tensors, its encoder's buffer
    projector_bytes: int = 0
    projector_compute_bytes: int = 0
    # speculative decoding's draft model (its weights and its own KV cache) and the LoRA adapters' tensors;
    # both go where the model's layers go (app/lanes/engines/llamacpp/spec.py)
    draft_bytes: int = 0
    lora_bytes: int = 0

    @property
    def ctx_per_seq(self) -> int:
        return max(1, pad(self.ctx_size) // self.parallel)


@dataclass(frozen=True)
class DeviceUse:
    device: str  # "CPU" for host memory, "GPU0", "GPU1", ...
    weights: int = 0
    kv_cache: int = 0
    compute: int = 0
    projector: int = 0
    projector_compute: int = 0
    draft: int = 0
    lora: int = 0
    overhead: int = 0
    prompt_cache: int = 0  # the server's host-RAM prompt cache: a cap it grows to, not an upfront allocation

    @property
    def total(self) -> int:
        return (
            self.weights
            + self.kv_cache
            + self.compute
            + self.projector
            + self.projector_compute
            + self.draft
            + self.lora
            + self.overhead
            + self.prompt_cache
        )

    def public(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "weights": self.weights,
            "kv_cache": self.kv_cache,
            "compute": self.compute,
            "projector": self.projector,
            "projector_compute": self.projector_compute,
            "draft": self.draft,
            "lora": self.lora,
            "overhead": self.overhead,
            "prompt_cache": self.prompt_cache,
            "total": self.total,
        }


def kv_layer_bytes(layout: GGUFLayout, *, params: FitParams) -> tuple[int, ...]:
    """KV cache bytes of each layer (0 for layers without an attention cache)."""
    b = KV_TYPE_BYTES[params.kv_type]
    n_seq = params.parallel
    cells_full = params.ctx_per_seq * n_seq
    out = []
    for i in range(layout.block_count):
        if i >= len(layout.kv_layers) or not layout.kv_layers[i]:
            out.append(0)
            continue
        swa = i < len(layout.swa_layers) and layout.swa_layers[i] and layout.sliding_window
        if swa:
            assert layout.sliding_window is not None
            per_seq = min(params.ctx_per_seq, pad(layout.sliding_window + params.n_ubatch))
            cells = per_seq * n_seq
            k_len = layout.key_length_swa or layout.key_length or 0
            v_len = layout.value_length_swa or layout.value_length or 0
        else:
            cells = cells_full
            k_len, v_len = layout.key_length or 0, layout.value_length or 0
        heads = layout.head_count_kv[i] if i < len(layout.head_count_kv) else 0
        out.append(round(cells * heads * (k_len + v_len) * b))
    return tuple(out)


def kv_bytes_per_cell(layout: GGUFLayout, *, kv_type: str) -> float:
    """Bytes one more token of context costs across the full-attention layers (for speed estimates)."""
    b = KV_TYPE_BYTES[kv_type]
    total = 0.0
    for i, has in enumerate(layout.kv_layers):
        if has and i < len(layout.head_count_kv):
            total += layout.head_count_kv[i] * ((layout.key_length or 0) + (layout.value_length or 0)) * b
    return total


def _widest(values: tuple[int, ...]) -> int:
    return max(values) if values else 0


def compute_bytes(layout: GGUFLayout, *, params: FitParams) -> int:
    """The compute buffer llama.cpp reserves for one ubatch: the larger of the attention and FFN phases.

    Fitted on the CPU backend (docs/fit.md): the KQ mask is live throughout (f16 with flash attention,
    f32 without); without flash attention the KQ matrix of every head is materialised.
    """
    ub = params.n_ubatch
    n_kv = params.ctx_per_seq
    e = layout.embedding_length or 0
    ff = _widest(layout.feed_forward_length)
    if layout.expert_used_count and layout.expert_feed_forward_length:
        ff = max(ff, layout.expert_feed_forward_length * layout.expert_used_count)
    heads = _widest(layout.head_count)
    kv_dim = _widest(layout.head_count_kv) * max(layout.key_length or 0, layout.value_length or 0)
    f32 = 4
    mask = n_kv * ub * (2 if params.flash_attn else 4)
    attn = ub * f32 * (6 * e + 2 * kv_dim)
    if not params.flash_attn:
        attn += n_kv * ub * heads * f32
    ffn = ub * f32 * (2 * e + 3 * ff)
    per_layer = round(0.75 * ub * f32 * kv_dim) * max(0, layout.block_count - 2)
    # through the FFN the graph allocator also keeps the residual stream and its norms live: three
    # embedding widths with more than two layers, one with two (fitted on generated models, docs/fit.md)
    carried = ub * f32 * ((3 * e + 10) if layout.block_count > 2 else (e + 8))
    outputs = (layout.vocab_size or 0) * f32 * params.parallel * 3
    return mask + max(attn + per_layer, ffn + carried) + outputs


def split_weights(layout: GGUFLayout, *, gpu_layers: int) -> tuple[int, int]:
    """(host bytes, GPU bytes) of the weights when `gpu_layers` layers are offloaded."""
    n = layout.block_count
    on_gpu = max(0, min(gpu_layers, n))
    gpu = sum(layout.layer_bytes[n - on_gpu :]) if on_gpu else 0
    host = sum(layout.layer_bytes[: n - on_gpu]) + layout.token_embd_bytes + layout.other_bytes
    if gpu_layers > n:
        gpu += layout.output_bytes
    else:
        host += layout.output_bytes
    return host, gpu


def projector_on_gpu(gpu_layers: int, *, gpu_devices: int) -> bool:
    """Whether the vision projector runs on the GPU: the launch's rule (`mmproj_use_gpu = gpu_layers !=
    0`, the projector goes where the layers go), on a machine with a GPU at all."""
    return gpu_devices > 0 and gpu_layers != 0


def breakdown(
    layout: GGUFLayout, *, params: FitParams, gpu_devices: int = 0, projector_bytes: int = 0
) -> tuple[DeviceUse, ...]:
    """Memory per device for this placement. GPU layers are split evenly across `gpu_devices`. The vision
    projector goes where the launch puts it (engines/llamacpp/kind.py: `mmproj_use_gpu = gpu_layers != 0`):
    on GPU0 when this placement offloads any layer, else in host memory."""
    host_w, gpu_w = split_weights(layout, gpu_layers=params.gpu_layers if gpu_devices else 0)
    kv = kv_layer_bytes(layout, params=params)
    n = layout.block_count
    on_gpu = max(0, min(params.gpu_layers, n)) if gpu_devices else 0
    kv_gpu = sum(kv[n - on_gpu :]) if on_gpu else 0
    kv_host = sum(kv) - kv_gpu
    compute = compute_bytes(layout, params=params)
    projector_bytes = projector_bytes or params.projector_bytes
    proj_compute = params.projector_compute_bytes
    proj_gpu = projector_on_gpu(params.gpu_layers, gpu_devices=gpu_devices)
    host = DeviceUse(
        "CPU",
        weights=host_w,
        kv_cache=kv_host,
        compute=compute if not on_gpu else compute // 8,  # the host keeps a small buffer on offload
        projector=projector_bytes if not proj_gpu else 0,
        projector_compute=proj_compute if not proj_gpu else 0,
        draft=params.draft_bytes if not on_gpu else 0,
        lora=params.lora_bytes if not on_gpu else 0,
        overhead=HOST_BASELINE,
        prompt_cache=params.prompt_cache_bytes,
    )
    if not gpu_devices:
        return (host,)
    devices = [host]
    for g in range(gpu_devices):
        share = 1 / gpu_devices
        devices.append(
            DeviceUse(
                f"GPU{g}",
                weights=round(gpu_w * share),
                kv_cache=round(kv_gpu * share),
                compute=compute if on_gpu else 0,
                projector=projector_bytes if proj_gpu and g == 0 else 0,
                projector_compute=proj_compute if proj_gpu and g == 0 else 0,
                draft=params.draft_bytes if on_gpu and g == 0 else 0,
                lora=params.lora_bytes if on_gpu and g == 0 else 0,
                overhead=GPU_CONTEXT,
            )
        )
    return tuple(devices)
