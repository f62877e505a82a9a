"""Speech models: whisper.cpp's legacy ggml `.bin` files and piper voices (`.onnx` + `.onnx.json`).

whisper ggml (whisper.cpp `whisper_model_load`): uint32 magic 0x67676d6c (bytes b"lmgg" on disk), eleven
int32 hparams — n_vocab, n_audio_ctx, n_audio_state, n_audio_head, n_audio_layer, n_text_ctx, n_text_state,
n_text_head, n_text_layer, n_mels, ftype — then the mel filters (int32 n_mel, int32 n_fft, float32 data),
the vocabulary and the tensors. Only the hparams and the mel filter header are read. A ggml file counts as
whisper when every hparam is positive and n_mels is 80 or 128 (every whisper release uses one of them).

piper voice: an ONNX model (a protobuf whose first byte is 0x08, the ir_version tag) next to
`<voice>.onnx.json` with `audio.sample_rate` and an `espeak` voice or a `phoneme_id_map`.
Nothing here raises for bad input: problems come back as `SpeechProblem` with what to do.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.formats.head import file_head
from app.formats.hf_config import ConfigProblem, read_config

GGML_MAGIC = 0x67676D6C
_HPARAMS = struct.Struct("<I11i")
# whisper.cpp's ggml_ftype values (after removing the quantization version, ftype % 1000).
_GGML_FTYPES = {
    0: "f32",
    1: "f16",
    2: "q4_0",
    3: "q4_1",
    4: "q4_1_some_f16",
    7: "q8_0",
    8: "q5_0",
    9: "q5_1",
    10: "q2_k",
    11: "q3_k",
    12: "q4_k",
    13: "q5_k",
    14: "q6_k",
}
_SIZES = {4: "tiny", 6: "base", 12: "small", 24: "medium", 32: "large"}  # by n_audio_layer


@dataclass(frozen=True)
class SpeechProblem:
    reason: str
    other_format: bool = False  # the file is readable but is some other kind of model


@dataclass(frozen=True)
class WhisperGGML:
    path: Path
    n_vocab: int
    n_audio_ctx: int
    n_audio_state: int
    n_audio_head: int
    n_audio_layer: int
    n_text_ctx: int
    n_text_state: int
    n_text_head: int
    n_text_layer: int
    n_mels: int
    ftype: str  # "f16", "q5_1", ... or "unknown(N)"
    file_bytes: int

    @property
    def size_name(self) -> str | None:
        """tiny/base/small/medium/large by encoder depth; None for an unusual depth (distilled models)."""
        return _SIZES.get(self.n_audio_layer)

    @property
    def multilingual(self) -> bool:
        return self.n_vocab >= 51865  # English-only models have 51864 tokens


def is_ggml_magic(head: bytes) -> bool:
    return len(head) >= 4 and struct.unpack("<I", head[:4])[0] == GGML_MAGIC


def read_whisper_ggml(path: Path) -> WhisperGGML | SpeechProblem:
    read = file_head(path, _HPARAMS.size + 8)
    if isinstance(read, str):
        return SpeechProblem(read)
    size, head = read
    if not is_ggml_magic(head):
        return SpeechProblem(
            f"{path.name} is not a ggml file (no 0x67676d6c magic); replace it with a ggml-*.bin",
            other_format=True,
        )
    if len(head) < _HPARAMS.size + 8:
        return SpeechProblem(f"{path.name} is truncated inside its header; download it again")
    _, *hp = _HPARAMS.unpack_from(head)
    n_mel, n_fft = struct.unpack_from("<2i", head, _HPARAMS.size)
    if any(v <= 0 or v > 1_000_000 for v in hp[:10]) or hp[9] not in (80, 128):
        return SpeechProblem(
            f"{path.name} is a ggml file but its header is not whisper's (n_mels {hp[9]}); "
            "it may be an old llama ggml model, convert it to GGUF or remove it",
            other_format=True,
        )
    if n_mel != hp[9] or n_fft <= 0 or _HPARAMS.size + 8 + 4 * n_mel * n_fft > size:
        return SpeechProblem(f"{path.name} is truncated or corrupt in its mel filters; download it again")
    ftype = hp[10] % 1000
    return WhisperGGML(
        path=path,
        n_vocab=hp[0],
        n_audio_ctx=hp[1],
        n_audio_state=hp[2],
        n_audio_head=hp[3],
        n_audio_layer=hp[4],
        n_text_ctx=hp[5],
        n_text_state=hp[6],
        n_text_head=hp[7],
        n_text_layer=hp[8],
        n_mels=hp[9],
        ftype=_GGML_FTYPES.get(ftype, f"unknown({ftype})"),
        file_bytes=size,
    )


@dataclass(frozen=True)
class PiperVoice:
    onnx_path: Path
    config_path: Path
    sample_rate: int
    quality: str | None  # x_low, low, medium, high
    espeak_voice: str | None
    language_code: str | None
    num_speakers: int
    phoneme_type: str | None
    dataset: str | None
    piper_version: str | None
    onnx_bytes: int


def is_piper_config(data: Mapping[str, Any]) -> bool:
    audio = data.get("audio")
    return (
        isinstance(audio, Mapping)
        and "sample_rate" in audio
        and ("espeak" in data or "phoneme_id_map" in data)
    )


def _str_at(data: Mapping[str, Any], *path: str) -> str | None:
    cur: Any = data
    for k in path:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(k)
    return cur if isinstance(cur, str) else None


def read_piper_voice(onnx_path: Path) -> PiperVoice | SpeechProblem:
    """The voice whose model is `onnx_path`; its config must sit beside it as `<name>.onnx.json`."""
    config_path = onnx_path.with_name(onnx_path.name + ".json")
    if not config_path.is_file():
        return SpeechProblem(
            f"{onnx_path.name} has no {config_path.name} beside it; download the voice's config"
        )
    data = read_config(config_path)
    if isinstance(data, ConfigProblem):
        return SpeechProblem(data.reason)
    if not is_piper_config(data):
        return SpeechProblem(
            f"{config_path.name} is not a piper voice config (no audio.sample_rate / espeak)"
        )
    rate = data["audio"].get("sample_rate")
    if isinstance(rate, bool) or not isinstance(rate, int) or rate <= 0:
        return SpeechProblem(f"{config_path.name} has no usable audio.sample_rate; download it again")
    read = file_head(onnx_path, 1)
    if isinstance(read, str):
        return SpeechProblem(read)
    size, first = read
    if first != b"\x08":
        return SpeechProblem(f"{onnx_path.name} is not an ONNX model; download the voice again")
    speakers = data.get("num_speakers", 1)
    return PiperVoice(
        onnx_path=onnx_path,
        config_path=config_path,
        sample_rate=rate,
        quality=_str_at(data, "audio", "quality"),
        espeak_voice=_str_at(data, "espeak", "voice"),
        language_code=_str_at(data, "language", "code"),
        num_speakers=speakers if isinstance(speakers, int) and not isinstance(speakers, bool) else 1,
        phoneme_type=_str_at(data, "phoneme_type"),
        dataset=_str_at(data, "dataset"),
        piper_version=_str_at(data, "piper_version"),
        onnx_bytes=size,
    )
