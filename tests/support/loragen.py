"""A tiny LoRA adapter GGUF for the tiny llama models (tests/support/tinymodels.py), as llama.cpp loads them.

llama.cpp's loader wants `general.type = adapter`, `adapter.type = lora`, `adapter.lora.alpha`, the base's
architecture, and per adapted weight a pair `<weight>.lora_a` (ggml shape [in, rank]) and `.lora_b`
([rank, out]); gguf writes numpy shapes reversed, so they are (rank, in) and (out, rank) here.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from tests.support.tinymodels import CHAT, TinySpec


def write_tiny_lora(
    path: Path, spec: TinySpec = CHAT, *, rank: int = 4, alpha: float = 8.0, seed: int = 11, width: int = 0
) -> Path:
    """An adapter on every layer's attn_q of a model shaped like `spec`; `width` (when set) writes one for
    another width, which llama.cpp refuses for this base."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    n = width or spec.n_embd
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
    for i in range(spec.n_layer):
        a = (rng.standard_normal((rank, n)) * 0.5).astype(np.float32)
        b = (rng.standard_normal((n, rank)) * 0.5).astype(np.float32)
        w.add_tensor(f"blk.{i}.attn_q.weight.lora_a", a)
        w.add_tensor(f"blk.{i}.attn_q.weight.lora_b", b)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
