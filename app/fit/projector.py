"""The memory a vision projector (mmproj) adds to a llama.cpp lane: its weights and its compute buffer.

The weights are the projector file's tensors. The compute buffer is an estimate of what llama.cpp's clip
encoder reserves for one image at the projector's image size: the attention scores of every head over
every patch position (no flash attention), plus the widest activations of a layer and the input image.
On the tiny test projector (17 positions) llama.cpp reserved 0.02 MiB where this says 0.03 MiB.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.formats.gguf_layout import GGUFLayout

F32 = 4
DEFAULT_IMAGE_SIZE = 336  # llava's default, for a header without clip.vision.image_size
DEFAULT_PATCH_SIZE = 14


@dataclass(frozen=True)
class ProjectorMemory:
    weights: int
    compute: int
    image_tokens: int | None  # tokens one image becomes, where the projector type fixes it; else None


def image_tokens(layout: GGUFLayout) -> int | None:
    """Tokens one image takes in the prompt for projectors whose count is fixed by the header (llava's
    `mlp` family: one per patch, `ldp`: a quarter of them); None for the others (dynamic resolution)."""
    p = layout.projector
    if p is None or not p.image_size or not p.patch_size:
        return None
    patches = (p.image_size // p.patch_size) ** 2
    if p.projector_type in ("mlp", "mlp_norm"):
        return patches
    if p.projector_type in ("ldp", "ldpv2"):
        return patches // 4
    return None


def projector_memory(layout: GGUFLayout) -> ProjectorMemory:
    """The projector's weights and an estimate of its compute buffer, in bytes."""
    p = layout.projector
    size = (p.image_size if p else None) or DEFAULT_IMAGE_SIZE
    patch = (p.patch_size if p else None) or DEFAULT_PATCH_SIZE
    d = (p.vision_embedding_length if p else None) or 1024
    heads = (p.vision_head_count if p else None) or 16
    n_pos = (size // patch) ** 2 + 1
    per_layer = n_pos * F32 * (n_pos * heads + 6 * d + 2 * 4 * d)
    compute = per_layer + 3 * size * size * F32
    return ProjectorMemory(weights=layout.tensor_bytes, compute=compute, image_tokens=image_tokens(layout))
