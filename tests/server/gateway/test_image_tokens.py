"""Tokens an image becomes, per projector type, as llama.cpp's multimodal library counts them: fixed-size
projectors (llava's mlp/ldp, Gemma 3's pooled 896-px image) and dynamic-resolution ones (Qwen2-VL,
Qwen2.5-VL, Pixtral / Mistral Small), read from each projector file's own clip metadata, and the
too-many-images check that adds them up image by image."""

from __future__ import annotations

import base64
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gguf
import numpy as np
import pytest

from app.core.errors import TooManyImagesError
from app.fit.projector import VisionGeometry, image_tokens, resized, vision_geometry
from app.server.gateway.images import check_image_tokens, image_token_counts, tokens_per_image
from tests.support.visiongen import VisionSpec, png_bytes, write_tiny_mmproj


def write_projector(
    path: Path,
    kind: str,
    *,
    image_size: int,
    patch_size: int,
    merge_key: tuple[str, int] | None = None,
    img_break: bool = False,
) -> Path:
    """A projector header as llama.cpp's converters write one for `kind` (a few tensors stand in for the
    encoder: only the clip keys and the tensor names decide the count)."""
    w = gguf.GGUFWriter(str(path), "clip")
    w.add_string("clip.projector_type", kind)
    w.add_bool("clip.has_vision_encoder", True)
    w.add_uint32("clip.vision.image_size", image_size)
    w.add_uint32("clip.vision.patch_size", patch_size)
    w.add_uint32("clip.vision.embedding_length", 16)
    w.add_uint32("clip.vision.projection_dim", 64)
    if merge_key is not None:
        w.add_uint32(*merge_key)
    w.add_tensor("v.patch_embd.weight", np.zeros((16, 3, patch_size, patch_size), dtype=np.float32))
    if img_break:
        w.add_tensor("v.token_embd.img_break", np.zeros((64,), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_fixed_size_projectors(tmp_path: Path) -> None:
    mlp = vision_geometry(write_tiny_mmproj(tmp_path / "mmproj-mlp.gguf"))
    assert mlp is not None and image_tokens(mlp) == VisionSpec().n_patches == 16
    ldp = vision_geometry(write_projector(tmp_path / "ldp.gguf", "ldp", image_size=336, patch_size=14))
    assert ldp is not None and image_tokens(ldp) == 576 // 4
    # Gemma 3: 896 px in 14-px patches (64 x 64), pooled 4 x 4 per side by default: 256 tokens, whatever
    # the image's own size
    gemma = vision_geometry(write_projector(tmp_path / "g3.gguf", "gemma3", image_size=896, patch_size=14))
    assert gemma == VisionGeometry("gemma3", 896, 14, None, False)
    assert image_tokens(gemma) == 256 and image_tokens(gemma, (1920, 1080)) == 256
    # a header that writes its own pooling (llama.cpp's tiny test gemma3 does) is followed
    small = write_projector(
        tmp_path / "g3-small.gguf",
        "gemma3",
        image_size=64,
        patch_size=8,
        merge_key=("clip.vision.projector.scale_factor", 2),
    )
    geometry = vision_geometry(small)
    assert geometry is not None and geometry.merge == 2 and image_tokens(geometry) == 16


def test_qwen_vl_counts_follow_the_image_size(tmp_path: Path) -> None:
    for kind in ("qwen2vl_merger", "qwen2.5vl_merger"):
        g = vision_geometry(write_projector(tmp_path / f"{kind}.gguf", kind, image_size=560, patch_size=14))
        assert g is not None and image_tokens(g) is None  # no image, no count: it depends on the size
        # 1024 x 768 becomes 1036 x 756 (multiples of 28): 74 x 54 patches, merged 2 x 2 -> 37 x 27 tokens
        # (what transformers' Qwen2-VL processor gives: grid 54 x 74, 999 tokens)
        assert resized(1024, 768, align=28, min_pixels=8 * 784, max_pixels=4096 * 784) == (1036, 756)
        assert image_tokens(g, (1024, 768)) == 999
        # a huge image is scaled down to at most 4096 tokens, a tiny one up to at least 8
        assert 3900 <= (image_tokens(g, (8000, 6000)) or 0) <= 4096
        assert image_tokens(g, (10, 10)) == 9  # 10 x 10 is scaled up to 84 x 84: 3 x 3 tokens
        assert image_tokens(g, (28, 28)) == 9


def test_pixtral_counts_rows_and_breaks(tmp_path: Path) -> None:
    # Pixtral 12B: 16-px patches, no merge, an [IMG_BREAK] after every row but the last, at most 1024
    # tokens (llama.cpp's cap): 1024 x 768 is scaled to 576 x 432 -> 36 x 27 patches + 26 breaks
    pixtral = write_projector(
        tmp_path / "pixtral.gguf", "pixtral", image_size=1024, patch_size=16, img_break=True
    )
    g = vision_geometry(pixtral)
    assert g is not None and g.img_break and g.merge is None
    assert image_tokens(g, (1024, 768)) == 36 * 27 + 26
    assert image_tokens(g, (320, 160)) == 20 * 10 + 9
    # Mistral Small 3.1: 14-px patches merged 2 x 2 (spatial_merge_size): 1024 x 768 -> 37 x 27 + 26
    small = write_projector(
        tmp_path / "mistral-small.gguf",
        "pixtral",
        image_size=1540,
        patch_size=14,
        merge_key=("clip.vision.spatial_merge_size", 2),
        img_break=True,
    )
    g2 = vision_geometry(small)
    assert g2 is not None and g2.merge == 2
    assert image_tokens(g2, (1024, 768)) == 37 * 27 + 26
    # without the break embedding, no break tokens
    plain = write_projector(tmp_path / "plain.gguf", "pixtral", image_size=1024, patch_size=16)
    g3 = vision_geometry(plain)
    assert g3 is not None and image_tokens(g3, (320, 160)) == 200


def _target(projector: Path) -> Any:
    return SimpleNamespace(plan=SimpleNamespace(params=SimpleNamespace(mmproj_path=str(projector))))


def _body(*sizes: tuple[int, int]) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": "what is this?"}]
    for w, h in sizes:
        url = "data:image/png;base64," + base64.b64encode(png_bytes(w, h)).decode()
        parts.append({"type": "image_url", "image_url": {"url": url}})
    return {"messages": [{"role": "user", "content": parts}]}


def test_the_request_check_counts_each_image(tmp_path: Path) -> None:
    qwen = write_projector(tmp_path / "q.gguf", "qwen2.5vl_merger", image_size=560, patch_size=14)
    body = _body((112, 112), (224, 112))
    assert tokens_per_image(_target(qwen)) is None  # dynamic: no one count per image
    counts = image_token_counts(body, _target(qwen))
    assert counts == [16, 32]  # 4 x 4 and 8 x 4 tokens of 28 px
    assert check_image_tokens(2, counts, slot=64, model="q", where="messages") == 48
    with pytest.raises(TooManyImagesError) as exc:
        check_image_tokens(2, counts, slot=40, model="q", where="messages")
    assert "2 image(s) take 48 tokens (by size: 16, 32)" in exc.value.message
    assert "send at most 1 image(s)" in exc.value.message
    # a fixed-size projector: one count per image, from the file as the lane loaded it
    gemma = write_projector(tmp_path / "g.gguf", "gemma3", image_size=896, patch_size=14)
    assert tokens_per_image(_target(gemma)) == 256
    assert image_token_counts(body, _target(gemma)) == [256, 256]
    with pytest.raises(TooManyImagesError) as exc:
        check_image_tokens(2, 256, slot=300, model="g", where="messages")
    assert "2 image(s) take 512 tokens (256 each)" in exc.value.message
    # no projector on the lane: nothing is counted here (the engine decides)
    assert image_token_counts(body, SimpleNamespace(plan=None)) is None
