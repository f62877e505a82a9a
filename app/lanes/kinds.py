"""Every engine kind Switchyard can start, by lane id, and the choice of kind for a catalog entry."""

from __future__ import annotations

from app.core.errors import EngineUnavailableError, NoLaneForFormatError
from app.core.settings import Settings
from app.hardware.model import Hardware
from app.lanes.compat import LlamaCompatKind
from app.lanes.cuda import SGLANG, VLLM
from app.lanes.kind import EngineKind
from app.lanes.llamaserver import LlamaRuntimesKind
from app.lanes.mistralrs import MISTRALRS
from app.lanes.mlx import MLX
from app.lanes.piper import PIPER
from app.lanes.sdcpp import SDCppKind
from app.lanes.whisper import WHISPER
from app.library.model import ModelEntry
from app.routing.engines import LANES, install_hint, title
from app.routing.traits import traits_of, unroutable_reason


def engine_kinds() -> dict[str, EngineKind]:
    """Stateless kind objects in the canonical lane order (the Python-packaged ones are frozen instances)."""
    kinds: list[EngineKind] = [
        LlamaRuntimesKind(),  # llama.cpp on the runtime chosen for this machine
        LlamaCompatKind(),  # a second llama.cpp build, for architectures the first does not load
        MISTRALRS,
        MLX,
        VLLM,
        SGLANG,
        SDCppKind(),
        WHISPER,
        PIPER,
    ]
    by_lane = {k.lane: k for k in kinds}
    return {lane: by_lane[lane] for lane in LANES if lane in by_lane}


def kinds_for_format(fmt: str, kinds: dict[str, EngineKind]) -> list[EngineKind]:
    return [k for k in kinds.values() if fmt in k.formats]


def _routed(entry: ModelEntry, found: list[EngineKind]) -> list[EngineKind]:
    """The kinds routing lets run this safetensors folder, in routing's order: its quantization decides
    (plain weights: vLLM, SGLang, MLX, mistral.rs; AWQ, GPTQ, FP8: SGLang, vLLM)."""
    traits = traits_of(entry.model_format())
    if (why := unroutable_reason(traits)) is not None:
        raise NoLaneForFormatError(f"model {entry.id!r} cannot run here: {why}", param="model")
    order = {lane: i for i, lane in enumerate(traits.candidates)}
    return sorted((k for k in found if k.lane in order), key=lambda k: order[k.lane])


def choose_kind(
    entry: ModelEntry,
    settings: Settings,
    *,
    kinds: dict[str, EngineKind],
    hardware: Hardware | None,
    pinned: str | None,
) -> EngineKind:
    """The kind that starts `entry`: its pin, else the first kind for its format that can start here.

    Raises EngineUnavailableError naming what each candidate lacks."""
    if pinned:
        kind = kinds.get(pinned)
        if kind is None or entry.format not in kind.formats:
            raise EngineUnavailableError(
                f"model {entry.id!r} is pinned to {pinned}, which this Switchyard cannot start; "
                f"`switchyard pin {entry.id} --clear` or pin it to a lane that runs {entry.format} models"
            )
        candidates = [kind]
    else:
        candidates = kinds_for_format(entry.format, kinds)
        if entry.format == "safetensors":  # one format, several lanes: which depends on the weights
            candidates = _routed(entry, candidates)
    if not candidates:
        raise EngineUnavailableError(f"no lane runs {entry.format} models yet")
    why: list[str] = []
    for kind in candidates:
        refusal = kind.start_refusal(settings, hardware)
        if refusal is None:
            refusal = _architecture_refusal(kind, entry, settings, hardware)
        if refusal is None:
            return kind
        why.append(f"{title(kind.lane)}: {refusal}")
    hints = "; ".join(install_hint(k.lane) for k in candidates if not k.install(settings).installed)
    todo = f" To fix: {hints}." if hints else ""
    raise EngineUnavailableError(f"no lane can start {entry.id!r} here ({'; '.join(why)}).{todo}")


def _architecture_refusal(
    kind: EngineKind, entry: ModelEntry, settings: Settings, hardware: Hardware | None
) -> str | None:
    """A llama.cpp build's answer on the model's architecture (app/lanes/compat.py; None elsewhere)."""
    ask = getattr(kind, "architecture_refusal", None)
    return ask(entry, settings, hardware) if ask is not None else None


def default_kind(entry: ModelEntry, kinds: dict[str, EngineKind]) -> EngineKind | None:
    """The kind a model would run on (for capability answers; no install checks)."""
    found = kinds_for_format(entry.format, kinds)
    return found[0] if found else None
