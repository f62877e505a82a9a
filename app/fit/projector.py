"""What a vision projector (mmproj) adds to a llama.cpp lane: its weights, its compute buffer, and the
tokens an image becomes in the prompt.

The weights are the projector file's tensors. The compute buffer is an estimate of what llama.cpp's clip
encoder reserves for one image at the projector's image size: the attention scores of every head over
every patch position (no flash attention), plus the widest activations of a layer and the input image.
On the tiny test projector (17 positions) llama.cpp reserved 0.02 MiB where this says 0.03 MiB.

The tokens per image follow llama.cpp's multimodal library (tools/mtmd: the image preprocessing, then
`clip_n_output_tokens`), from the projector's clip metadata:

- fixed size (the image is resized to `image_size` square): llava's `mlp` one token per patch, `ldp` a
  quarter of them; Gemma 3 (`gemma3`) pools each side by `clip.vision.projector.scale_factor` (4 unless
  the header says otherwise), 256 tokens at 896 px / 14 px patches.
- dynamic size (the image keeps its aspect ratio, resized so each side is a multiple of patch x merge and
  its area lies between a minimum and a maximum number of tokens): Qwen2-VL / Qwen2.5-VL / Qwen3-VL
  (`*_merger`, 2x2 patches merged into one token, 8 to 4096 tokens) and Pixtral / Mistral Small
  (`pixtral`, `clip.vision.spatial_merge_size` patches merged per side, 8 to 1024 tokens, one [IMG_BREAK]
  token after every row but the last when the projector has the `v.token_embd.img_break` embedding).
  Their count needs the image's own width and height; without them it is None.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from app.formats.gguf_layout import GGUFLayout
from app.formats.gguf_layout_parts import int_key, key_text, open_gguf
from app.formats.gguf_meta import GGUFProblem

F32 = 4
DEFAULT_IMAGE_SIZE = 336  # llava's default, for a header without clip.vision.image_size
DEFAULT_PATCH_SIZE = 14
GEMMA3_POOL = 4  # llama.cpp's default for gemma3 when the header has no scale factor
QWEN_TYPES = frozenset({"qwen2vl_merger", "qwen2.5vl_merger", "qwen3vl_merger"})
QWEN_MERGE = 2  # Qwen-VL merges 2x2 patches into one token
QWEN_TOKENS = (8, 4096)  # the least and most tokens llama.cpp resizes a Qwen-VL image to
PIXTRAL_TOKENS = (8, 1024)
IMG_BREAK_TENSOR = "v.token_embd.img_break"


@dataclass(frozen=True)
class ProjectorMemory:
    weights: int
    compute: int
    image_tokens: int | None  # tokens one image becomes, where the projector type fixes it; else None


@dataclass(frozen=True)
class VisionGeometry:
    """What fixes how many tokens an image becomes: the projector's clip metadata."""

    projector_type: str | None
    image_size: int | None
    patch_size: int | None
    merge: int | None = None  # clip.vision.projector.scale_factor or .spatial_merge_size, as written
    img_break: bool = False  # a [IMG_BREAK] embedding (Pixtral): one token after each row of patches

    @classmethod
    def of(cls, layout: GGUFLayout) -> VisionGeometry:
        """From a layout alone (no merge key nor tensor names: the projector type's defaults apply)."""
        p = layout.projector
        if p is None:
            return cls(None, None, None)
        return cls(p.projector_type, p.image_size, p.patch_size, img_break=p.projector_type == "pixtral")


@lru_cache(maxsize=64)
def _geometry(path: str, size: int, mtime_ns: int) -> VisionGeometry | None:
    part = open_gguf(Path(path))
    if isinstance(part, GGUFProblem):
        return None
    fields = part.reader.fields
    ptype = key_text(fields, "clip.projector_type") or key_text(fields, "clip.vision.projector_type")
    merge = int_key(fields, "clip.vision.projector.scale_factor") or int_key(
        fields, "clip.vision.spatial_merge_size"
    )
    return VisionGeometry(
        projector_type=ptype,
        image_size=int_key(fields, "clip.vision.image_size"),
        patch_size=int_key(fields, "clip.vision.patch_size"),
        merge=merge,
        img_break=any(t.name == IMG_BREAK_TENSOR for t in part.reader.tensors),
    )


def vision_geometry(path: Path) -> VisionGeometry | None:
    """The projector file's geometry, read once per (path, size, mtime); None for an unreadable file."""
    try:
        st = path.stat()
    except OSError:
        return None
    return _geometry(str(path), st.st_size, st.st_mtime_ns)


def _round_to(x: float, step: int) -> int:
    return math.floor(x / step + 0.5) * step  # half away from zero, as C's round() for x > 0


def resized(width: int, height: int, *, align: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """The size llama.cpp resizes an image to before encoding it ("smart resize"): the aspect ratio kept,
    each side a multiple of `align`, the area brought within [min_pixels, max_pixels]."""
    w = max(align, _round_to(width, align))
    h = max(align, _round_to(height, align))
    if w * h > max_pixels:
        beta = math.sqrt(width * height / max_pixels)
        w = max(align, math.floor(width / beta / align) * align)
        h = max(align, math.floor(height / beta / align) * align)
    elif w * h < min_pixels:
        beta = math.sqrt(min_pixels / (width * height))
        w = math.ceil(width * beta / align) * align
        h = math.ceil(height * beta / align) * align
    return w, h


def image_tokens(source: GGUFLayout | VisionGeometry, size: tuple[int, int] | None = None) -> int | None:
    """Tokens one image takes in the prompt (the projector's embeddings, as llama.cpp counts them).
    `size` is the image's (width, height): needed by the dynamic-resolution projectors (Qwen-VL, Pixtral),
    ignored by the fixed-size ones. None for a projector type whose count is not known here."""
    g = source if isinstance(source, VisionGeometry) else VisionGeometry.of(source)
    if not g.patch_size:
        return None
    patch, kind = g.patch_size, g.projector_type
    if kind in ("mlp", "mlp_norm", "ldp", "ldpv2", "gemma3"):
        if not g.image_size:
            return None
        patches = (g.image_size // patch) ** 2
        if kind in ("ldp", "ldpv2"):
            return patches // 4
        if kind == "gemma3":
            pool = g.merge or GEMMA3_POOL
            return patches // (pool * pool)
        return patches
    if size is None or size[0] <= 0 or size[1] <= 0:
        return None
    if kind in QWEN_TYPES:
        merge = g.merge or QWEN_MERGE
        align = patch * merge
        low, high = QWEN_TOKENS
        w, h = resized(*size, align=align, min_pixels=low * align * align, max_pixels=high * align * align)
        return (w // (patch * 2)) * (h // (patch * 2))
    if kind == "pixtral":
        merge = g.merge or 1
        align = patch * merge
        low, high = PIXTRAL_TOKENS
        w, h = resized(*size, align=align, min_pixels=low * align * align, max_pixels=high * align * align)
        cols, rows = w // align, h // align
        return cols * rows + (rows - 1 if g.img_break else 0)
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
