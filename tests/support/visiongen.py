"""A tiny vision projector (mmproj) GGUF that llama.cpp's multimodal library loads and runs.

A llava-style CLIP image encoder with an `mlp` projector, random f32 weights, named the way llama.cpp's
converters name them (`v.*` for the encoder, `mm.0` / `mm.2` for the projector, `clip.vision.*` keys). Its
projection width must equal the text model's embedding length; a mismatch fails at the engine's load.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np


@dataclass(frozen=True)
class VisionSpec:
    image_size: int = 32
    patch_size: int = 8
    n_embd: int = 32  # the encoder's width
    n_head: int = 4
    n_ff: int = 64
    n_layer: int = 2
    hidden: int = 64  # the projector's inner width
    projection_dim: int = 64  # must equal the text model's embedding length
    seed: int = 7
    write_dim_key: bool = True  # False: a header without clip.vision.projection_dim (only the load can tell)

    @property
    def n_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2


def write_tiny_mmproj(path: Path, spec: VisionSpec = VisionSpec()) -> Path:
    """Write the projector GGUF; returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(spec.seed)
    w = gguf.GGUFWriter(str(path), "clip")
    w.add_name("tiny-vision")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_string("clip.projector_type", "mlp")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.has_text_encoder", False)
    w.add_bool("clip.has_llava_projector", True)
    w.add_bool("clip.use_gelu", True)
    w.add_uint32("clip.vision.image_size", spec.image_size)
    w.add_uint32("clip.vision.patch_size", spec.patch_size)
    w.add_uint32("clip.vision.embedding_length", spec.n_embd)
    w.add_uint32("clip.vision.feed_forward_length", spec.n_ff)
    w.add_uint32("clip.vision.block_count", spec.n_layer)
    w.add_uint32("clip.vision.attention.head_count", spec.n_head)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-5)
    if spec.write_dim_key:
        w.add_uint32("clip.vision.projection_dim", spec.projection_dim)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])

    def t(name: str, *shape: int) -> None:
        ones = name.endswith(".weight") and ("ln" in name.split(".")[-2])
        data = np.ones(shape, np.float32) if ones else rng.standard_normal(shape).astype(np.float32) * 0.02
        w.add_tensor(name, data)

    d, n_pos = spec.n_embd, spec.n_patches + 1  # +1: the class embedding
    t("v.class_embd", d)
    t("v.patch_embd.weight", d, 3, spec.patch_size, spec.patch_size)  # numpy order of ggml's [p, p, 3, d]
    t("v.position_embd.weight", n_pos, d)
    t("v.pre_ln.weight", d)
    t("v.pre_ln.bias", d)
    for il in range(spec.n_layer):
        p = f"v.blk.{il}."
        for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
            t(p + part + ".weight", d, d)
            t(p + part + ".bias", d)
        t(p + "ln1.weight", d)
        t(p + "ln1.bias", d)
        t(p + "ffn_up.weight", spec.n_ff, d)
        t(p + "ffn_up.bias", spec.n_ff)
        t(p + "ffn_down.weight", d, spec.n_ff)
        t(p + "ffn_down.bias", d)
        t(p + "ln2.weight", d)
        t(p + "ln2.bias", d)
    t("mm.0.weight", spec.hidden, d)
    t("mm.0.bias", spec.hidden)
    t("mm.2.weight", spec.projection_dim, spec.hidden)
    t("mm.2.bias", spec.projection_dim)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def png_bytes(width: int = 32, height: int = 32, *, seed: int = 0) -> bytes:
    """A small RGB PNG of random pixels, written with zlib only (no imaging library needed)."""
    import struct
    import zlib

    rng = np.random.default_rng(seed)
    rows = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    raw = b"".join(b"\x00" + rows[y].tobytes() for y in range(height))

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    )


# 8x8 random-pixel images this project generated once with Pillow (not needed at test time)
JPEG_B64 = (
    "/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDAAgGBgcGBQgHBwcJCQgKDBQNDAsLDBkSEw8UHRofHh0aHBwgJC4nICIsIxwcKDcpLDAxNDQ0Hyc5"
    "PTgyPC4zNDL/2wBDAQkJCQwLDBgNDRgyIRwhMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjL/wAAR"
    "CAAIAAgDASIAAhEBAxEB/8QAHwAAAQUBAQEBAQEAAAAAAAAAAAECAwQFBgcICQoL/8QAtRAAAgEDAwIEAwUFBAQAAAF9AQIDAAQRBRIhMUEG"
    "E1FhByJxFDKBkaEII0KxwRVS0fAkM2JyggkKFhcYGRolJicoKSo0NTY3ODk6Q0RFRkdISUpTVFVWV1hZWmNkZWZnaGlqc3R1dnd4eXqDhIWG"
    "h4iJipKTlJWWl5iZmqKjpKWmp6ipqrKztLW2t7i5usLDxMXGx8jJytLT1NXW19jZ2uHi4+Tl5ufo6erx8vP09fb3+Pn6/8QAHwEAAwEBAQEB"
    "AQEBAQAAAAAAAAECAwQFBgcICQoL/8QAtREAAgECBAQDBAcFBAQAAQJ3AAECAxEEBSExBhJBUQdhcRMiMoEIFEKRobHBCSMzUvAVYnLRChYk"
    "NOEl8RcYGRomJygpKjU2Nzg5OkNERUZHSElKU1RVVldYWVpjZGVmZ2hpanN0dXZ3eHl6goOEhYaHiImKkpOUlZaXmJmaoqOkpaanqKmqsrO0"
    "tba3uLm6wsPExcbHyMnK0tPU1dbX2Nna4uPk5ebn6Onq8vP09fb3+Pn6/9oADAMBAAIRAxEAPwCnPb+Zb7r2aSRzNJKhMpBTblcFJT+8Yc5H"
    "G7CBjwcFFFOvjJ4RRjTS1vur9SqFKNZylPV3f5n/2Q=="
)
GIF_B64 = (
    "R0lGODdhCAAIAIUAAM30oO/ivNPvLbnSsPjCvuLJCGTtf2jhbpDQGJK+c1LwczT5bUjjqA7NuSnJQzu/70rBmjuyDeWUqtuHJ8+TGqN6IadhAJmH"
    "3l6i8WFuOGJhUEam5BCZjAWdnwCxiQiVDj1uL09owepRlP9AXt45ksFJ7qYoNu0V9cUFZKYj+p8aG5ZKwW5EyWtQo0wy95Uofm0ux1IgzUhYxRNM"
    "sTw27BVJhAtVOz4s7igysxkdnT8NvDAHpiQHhggInA8WChgHKSwAAAAACAAIAAAISwAJUDghoAMNGDF4kPjgA8EPGwcKqKjgYAMODzpG9MiRYIIB"
    "BjU4tAAhIcOKGwEalADAIoQMETtemIhw4QEEBRYGzFiAAYWLFBoCAgA7"
)
WEBP_B64 = (
    "UklGRpYAAABXRUJQVlA4IIoAAADwAgCdASoIAAgAAUAmJaACdDBAB9GH+X4AD9ADUUDX4AD+o3xFSjOV8Mk2f79AZxleae5cvTDaRc/06o1fAY1O"
    "S18ot/VUCvdu7MJivDsSR3+admO+NYlIluXhCjra/4p63t/iHp39nJio1+6+/wO3N3z+P+PhmfmtlGyfKpmf4IZV2fid+hkgAAA="
)
BMP_B64 = (
    "Qk32AAAAAAAAADYAAAAoAAAACAAAAAgAAAABABgAAAAAAMAAAADEDgAAxA4AAAAAAAAAAAAAsNK5sUwTbfk08aJeZAXF9zJM+iOmUGFifiiVNiim"
    "DbI73oeZ7787msFKc/BSAGGnuc0O7knBoPTNyURuwWhPxVhIlFHqpgcwjJkQo1BrL249qpTlOG5hwUqW7iw+vOLvXkD/nAgInR0Zc76SJ4fbf+1k"
    "qONIhEkVCMniGxqfIXqjQ8kp5KZGszIoibEAvA0/hgckkjneDpUIChYPGNCQKQcYO1ULbuFovsL4GpPP9RXtLe/Tn50F7DY8xy5tzSBS"
)
