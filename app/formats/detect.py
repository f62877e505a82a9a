"""What kind of model a file or folder holds, from headers and small JSON files only.

`detect_format(path)` never raises for bad input: a broken or unrecognised model comes back with `problem`
set to a reason that says what to do. Rules, in order:

File:
- starts with b"GGUF" (or is named *.gguf): a GGUF — `mmproj` when `general.architecture == "clip"` or
  any `clip.*` key is present, `gguf-diffusion` when the architecture is an image/video diffusion one
  (ComfyUI-GGUF's list: flux, sd1, sdxl, sd3, ...) or, without an architecture, its tensors are named like a
  diffusion checkpoint (`model.diffusion_model.*`, `double_blocks.*`, ...), else `gguf`; multi-part: all
  parts.
- starts with the ggml magic 0x67676d6c and has whisper hparams: `whisper-ggml`.
- `*.onnx` with `*.onnx.json` beside it (or the `.onnx.json` itself) holding `audio.sample_rate`: `piper`.
- `config.json`, `model_index.json` or a `*.safetensors` next to a `config.json`: the folder's kind.
Folder:
- `model_index.json`: `diffusers`.
- `config.json` with safetensors (or an index, or `weights.npz`): `mlx` when config.json has MLX's
  `quantization` object with `bits`, a safetensors header says `__metadata__.format == "mlx"`, or
  `weights.npz` is there; else `safetensors`.
- otherwise the one GGUF model (mmproj files ride along as `companions`), piper voice or whisper file in it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from app.formats.diffusers_meta import INDEX as DIFFUSERS_INDEX
from app.formats.diffusers_meta import DiffusersPipeline, DiffusersProblem, read_diffusers
from app.formats.gguf_adapter import ADAPTER_NOTE, read_adapter
from app.formats.gguf_layout import KIND_DIFFUSION, KIND_PROJECTOR, GGUFLayout, read_gguf_layout
from app.formats.gguf_meta import MAGIC, GGUFProblem, split_part
from app.formats.hf_config import ConfigProblem, read_config
from app.formats.safetensors_meta import (
    INDEX_NAME,
    SafetensorsModel,
    SafetensorsProblem,
    mlx_evidence,
    read_safetensors_dir,
)
from app.formats.speech_meta import (
    PiperVoice,
    SpeechProblem,
    WhisperGGML,
    is_ggml_magic,
    read_piper_voice,
    read_whisper_ggml,
)


class ModelKind(StrEnum):
    GGUF = "gguf"
    GGUF_DIFFUSION = "gguf-diffusion"
    MMPROJ = "mmproj"
    SAFETENSORS = "safetensors"
    MLX = "mlx"
    DIFFUSERS = "diffusers"
    WHISPER_GGML = "whisper-ggml"
    PIPER = "piper"
    UNKNOWN = "unknown"


Facts = GGUFLayout | SafetensorsModel | DiffusersPipeline | WhisperGGML | PiperVoice


@dataclass(frozen=True)
class ModelFormat:
    """`kind` is the best guess even when `problem` is set (a truncated GGUF is still kind `gguf`)."""

    kind: ModelKind
    path: Path  # the model's main file (first GGUF part, .onnx) or folder
    problem: str | None = None  # set: unusable as it is; the text says what to do
    files: tuple[Path, ...] = ()  # every file that makes up the model (GGUF parts, shards, voice config)
    companions: tuple[Path, ...] = ()  # mmproj files beside a GGUF model
    facts: Facts | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None and self.kind is not ModelKind.UNKNOWN


def detect_format(path: Path) -> ModelFormat:
    try:
        if not path.exists():
            return ModelFormat(ModelKind.UNKNOWN, path, f"nothing at {path}; check the path")
        return _detect_dir(path) if path.is_dir() else _detect_file(path)
    except OSError as exc:
        return ModelFormat(ModelKind.UNKNOWN, path, f"cannot read {path}: {exc.strerror or exc}")


_EMPTY_KIND = {".gguf": ModelKind.GGUF, ".bin": ModelKind.WHISPER_GGML, ".onnx": ModelKind.PIPER}


def _detect_file(path: Path) -> ModelFormat:
    name = path.name.lower()
    if name.endswith(".onnx.json"):
        return _piper(path.with_name(path.name[: -len(".json")]))
    if name in ("config.json", DIFFUSERS_INDEX, INDEX_NAME):
        return _detect_dir(path.parent)
    size = path.stat().st_size
    with path.open("rb") as fh:
        head = fh.read(8)
    if size == 0:
        kind = _EMPTY_KIND.get(path.suffix.lower(), ModelKind.UNKNOWN)
        return ModelFormat(kind, path, f"{path.name} is empty; download it again")
    if head[:4] == MAGIC or name.endswith(".gguf"):
        return _gguf(path)
    if is_ggml_magic(head):
        return _whisper(path)
    if name.endswith(".onnx"):
        return _piper(path)
    if name.endswith(".safetensors"):
        if (path.parent / "config.json").is_file():
            return _detect_dir(path.parent)
        return ModelFormat(
            ModelKind.UNKNOWN,
            path,
            f"{path.name} is a lone safetensors file; a model needs its folder with config.json "
            "(or model_index.json for a diffusers pipeline)",
        )
    return ModelFormat(
        ModelKind.UNKNOWN,
        path,
        f"{path.name} is not a model this app knows (it starts with {head[:4]!r}); "
        "use a .gguf, a model folder, a whisper ggml .bin or a piper .onnx voice",
    )


def _gguf(path: Path, companions: tuple[Path, ...] = ()) -> ModelFormat:
    layout = read_gguf_layout(path)
    if isinstance(layout, GGUFProblem):
        kind = ModelKind.MMPROJ if "mmproj" in path.name.lower() else ModelKind.GGUF
        # a LoRA adapter has no layers of its own: say what it is, not that the file is damaged
        reason = ADAPTER_NOTE if read_adapter(path) is not None else layout.reason
        return ModelFormat(kind, path, reason, files=(path,))
    if layout.kind == KIND_PROJECTOR:
        kind = ModelKind.MMPROJ
    elif layout.kind == KIND_DIFFUSION:
        kind = ModelKind.GGUF_DIFFUSION
    else:
        kind = ModelKind.GGUF
    return ModelFormat(kind, layout.path, files=layout.parts, companions=companions, facts=layout)


def _whisper(path: Path) -> ModelFormat:
    facts = read_whisper_ggml(path)
    if isinstance(facts, SpeechProblem):
        kind = ModelKind.UNKNOWN if facts.other_format else ModelKind.WHISPER_GGML
        return ModelFormat(kind, path, facts.reason, files=(path,))
    return ModelFormat(ModelKind.WHISPER_GGML, path, files=(path,), facts=facts)


def _piper(onnx: Path) -> ModelFormat:
    voice = read_piper_voice(onnx)
    if isinstance(voice, SpeechProblem):
        return ModelFormat(ModelKind.PIPER, onnx, voice.reason, files=(onnx,))
    return ModelFormat(ModelKind.PIPER, onnx, files=(onnx, voice.config_path), facts=voice)


def _weights_kind(folder: Path) -> ModelKind:
    config = read_config(folder / "config.json")
    has_npz = (folder / "weights.npz").is_file()
    if not isinstance(config, ConfigProblem) and mlx_evidence(config, None, has_npz=has_npz):
        return ModelKind.MLX
    return ModelKind.SAFETENSORS


def _hf_folder(folder: Path) -> ModelFormat:
    model = read_safetensors_dir(folder)
    if isinstance(model, SafetensorsProblem):
        return ModelFormat(_weights_kind(folder), folder, model.reason)
    kind = ModelKind.MLX if model.mlx_evidence else ModelKind.SAFETENSORS
    files = tuple(folder / f for f in model.files) or ((folder / "weights.npz"),)
    return ModelFormat(kind, folder, files=files, facts=model)


def _detect_dir(folder: Path) -> ModelFormat:
    names = {p.name for p in folder.iterdir() if p.is_file()}
    if DIFFUSERS_INDEX in names:
        pipeline = read_diffusers(folder)
        if isinstance(pipeline, DiffusersProblem):
            return ModelFormat(ModelKind.DIFFUSERS, folder, pipeline.reason)
        return ModelFormat(ModelKind.DIFFUSERS, folder, facts=pipeline)
    weights = any(n.endswith(".safetensors") for n in names) or INDEX_NAME in names or "weights.npz" in names
    if "config.json" in names and weights:
        return _hf_folder(folder)
    ggufs = sorted(n for n in names if n.lower().endswith(".gguf"))
    if ggufs:
        return _gguf_folder(folder, ggufs)
    onnx = sorted(n for n in names if n.lower().endswith(".onnx"))
    voices = [n for n in onnx if f"{n}.json" in names]
    if len(voices) == 1 or (not voices and len(onnx) == 1):
        return _piper(folder / (voices or onnx)[0])  # a lone .onnx says its config is missing
    bins = sorted(n for n in names if n.lower().endswith(".bin"))
    if "config.json" in names:
        why = "PyTorch .bin weights, which this app does not read" if bins else "no weights"
        return ModelFormat(
            ModelKind.SAFETENSORS,
            folder,
            f"{folder.name} has config.json but {why}; download its *.safetensors",
        )
    if len(voices) > 1:
        return ModelFormat(
            ModelKind.UNKNOWN, folder, f"{folder.name} holds {len(voices)} piper voices; pick one"
        )
    whisper = [n for n in bins if _starts_with_ggml(folder / n)]
    if len(whisper) == 1:
        return _whisper(folder / whisper[0])
    if whisper:
        return ModelFormat(
            ModelKind.UNKNOWN, folder, f"{folder.name} holds {len(whisper)} ggml files; pick one"
        )
    return ModelFormat(
        ModelKind.UNKNOWN,
        folder,
        f"no model found in {folder.name}: looked for *.gguf, config.json with *.safetensors, "
        "model_index.json, a piper *.onnx + *.onnx.json and a whisper ggml *.bin",
    )


def _starts_with_ggml(path: Path) -> bool:
    with path.open("rb") as fh:
        return is_ggml_magic(fh.read(4))


def _gguf_folder(folder: Path, ggufs: list[str]) -> ModelFormat:
    projectors = tuple(folder / n for n in ggufs if "mmproj" in n.lower())
    models = [n for n in ggufs if "mmproj" not in n.lower() and (split_part(Path(n)) or ("", 1, 1))[1] == 1]
    if len(models) == 1:
        return _gguf(folder / models[0], companions=projectors)
    if not models and len(projectors) == 1:
        return _gguf(projectors[0])
    if not models:
        return ModelFormat(
            ModelKind.UNKNOWN,
            folder,
            f"{folder.name} holds only parts of a split GGUF without its first part",
        )
    listed = ", ".join(models[:3]) + (", ..." if len(models) > 3 else "")
    return ModelFormat(
        ModelKind.UNKNOWN,
        folder,
        f"{folder.name} holds {len(models)} GGUF models ({listed}); point at one file",
    )
