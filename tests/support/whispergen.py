"""A complete whisper.cpp ggml model with random weights, small enough to write in a test (≈ 4 MB).

tests/support/modelgen.py `write_whisper_ggml` writes only a header and one tensor (enough for format
detection);
whisper.cpp loads a model only when every tensor of every layer is present with its exact shape. The
layout follows whisper.cpp's converter: per tensor n_dims, name length, type (0: f32, 1: f16), the dims in
reverse numpy order, the name, then the data. Random weights transcribe to arbitrary tokens: tests
assert on the shape of answers, not their words.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

MAGIC = 0x67676D6C
N_VOCAB = 51864  # English-only: whisper.cpp's special token ids depend on it
N_MELS = 80
N_FFT = 201


_F32_ALWAYS = {
    "encoder.conv1.bias",
    "encoder.conv2.bias",
    "encoder.positional_embedding",
    "decoder.positional_embedding",
}


def _tensor(out: bytearray, name: str, data: np.ndarray) -> None:
    # as the converter with f16 on: matrices and convolutions f16 (the CPU convolution needs it), the rest f32
    half = data.ndim >= 2 and name not in _F32_ALWAYS
    data = np.ascontiguousarray(data, dtype=np.float16 if half else np.float32)
    raw = name.encode()
    out += struct.pack("<3i", data.ndim, len(raw), 1 if half else 0)
    for d in reversed(data.shape):
        out += struct.pack("<i", d)
    out += raw
    out += data.tobytes()


def _block(out: bytearray, rng: np.random.Generator, prefix: str, state: int, *, cross: bool) -> None:
    def w(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32) * 0.02

    def attn(name: str) -> None:
        _tensor(out, f"{prefix}.{name}_ln.weight", np.ones(state))
        _tensor(out, f"{prefix}.{name}_ln.bias", np.zeros(state))
        _tensor(out, f"{prefix}.{name}.query.weight", w(state, state))
        _tensor(out, f"{prefix}.{name}.query.bias", np.zeros(state))
        _tensor(out, f"{prefix}.{name}.key.weight", w(state, state))
        _tensor(out, f"{prefix}.{name}.value.weight", w(state, state))
        _tensor(out, f"{prefix}.{name}.value.bias", np.zeros(state))
        _tensor(out, f"{prefix}.{name}.out.weight", w(state, state))
        _tensor(out, f"{prefix}.{name}.out.bias", np.zeros(state))

    attn("attn")
    if cross:
        attn("cross_attn")
    _tensor(out, f"{prefix}.mlp_ln.weight", np.ones(state))
    _tensor(out, f"{prefix}.mlp_ln.bias", np.zeros(state))
    _tensor(out, f"{prefix}.mlp.0.weight", w(4 * state, state))
    _tensor(out, f"{prefix}.mlp.0.bias", np.zeros(4 * state))
    _tensor(out, f"{prefix}.mlp.2.weight", w(state, 4 * state))
    _tensor(out, f"{prefix}.mlp.2.bias", np.zeros(state))


def write_random_whisper(
    path: Path, *, state: int = 32, heads: int = 2, layers: int = 1, seed: int = 0
) -> int:
    """Write the model; returns its size in bytes."""
    rng = np.random.default_rng(seed)
    audio_ctx, text_ctx = 1500, 448
    out = bytearray(struct.pack("<I", MAGIC))
    out += struct.pack(
        "<11i", N_VOCAB, audio_ctx, state, heads, layers, text_ctx, state, heads, layers, N_MELS, 1
    )
    out += struct.pack("<2i", N_MELS, N_FFT)
    out += (np.abs(rng.standard_normal(N_MELS * N_FFT)) * 0.01).astype(np.float32).tobytes()
    # the text tokens whisper.cpp decodes to; it names the rest (specials) itself
    # every single byte first (so any prompt tokenizes), then made-up words
    words = [bytes([i]) for i in range(256)] + [f" w{i}".encode() for i in range(256, N_VOCAB)]
    out += struct.pack("<i", len(words))
    for word in words:
        out += struct.pack("<I", len(word)) + word
    _tensor(out, "encoder.positional_embedding", rng.standard_normal((audio_ctx, state)) * 0.02)
    _tensor(out, "encoder.conv1.weight", rng.standard_normal((state, N_MELS, 3)) * 0.02)
    _tensor(out, "encoder.conv1.bias", np.zeros((state, 1)))
    _tensor(out, "encoder.conv2.weight", rng.standard_normal((state, state, 3)) * 0.02)
    _tensor(out, "encoder.conv2.bias", np.zeros((state, 1)))
    _tensor(out, "encoder.ln_post.weight", np.ones(state))
    _tensor(out, "encoder.ln_post.bias", np.zeros(state))
    for i in range(layers):
        _block(out, rng, f"encoder.blocks.{i}", state, cross=False)
    _tensor(out, "decoder.positional_embedding", rng.standard_normal((text_ctx, state)) * 0.02)
    _tensor(out, "decoder.token_embedding.weight", rng.standard_normal((N_VOCAB, state)) * 0.02)
    _tensor(out, "decoder.ln.weight", np.ones(state))
    _tensor(out, "decoder.ln.bias", np.zeros(state))
    for i in range(layers):
        _block(out, rng, f"decoder.blocks.{i}", state, cross=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(out))
    return len(out)
