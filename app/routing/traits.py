"""What routing needs to know about a model, taken from its ModelFormat: which lanes read it, in which order
of preference, its architecture names, and how its weights are quantized.

Which lanes read a model, and in which order, is each lane's `routes` (app/lanes/engines/facts.py), by the
model's route key: its format, split where the lanes split it (a GGUF that pools its output; safetensors
plain or quantized for CUDA kernels). An mmproj alone, an unknown file, an encoder or an unrecognised
quantization -> no lane.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.formats.detect import ModelFormat, ModelKind
from app.formats.diffusers_meta import DiffusersPipeline
from app.formats.gguf_layout import GGUFLayout
from app.formats.safetensors_meta import SafetensorsModel
from app.formats.speech_meta import WhisperGGML
from app.lanes.engines.facts import FACTS, facts_of
from app.routing.engines import runs, title, titles

# Quantization methods the CUDA lanes load, with the compute capability their kernels need (vLLM's
# quantization hardware table: AWQ kernels start at Turing, FP8 at Ada; the lanes themselves need Volta).
CUDA_MIN_CC = (7, 0)
_QUANT_MIN_CC = {
    "awq": (7, 5),
    "gptq": (7, 0),
    "fp8": (8, 9),
    "compressed-tensors": (7, 0),
    "bitsandbytes": (7, 0),
    "mxfp4": (8, 0),
}
_QUANT_TITLES = {"awq": "AWQ", "gptq": "GPTQ", "fp8": "FP8", "mxfp4": "MXFP4"}
PROJECTOR_ALONE = "a vision projector is loaded with its model, not on its own"


@dataclass(frozen=True)
class ModelTraits:
    kind: ModelKind
    problem: str | None  # the format reader's reason the files are unusable
    candidates: tuple[str, ...]  # lanes that read this model, most preferred first
    architectures: tuple[str, ...]  # every name an engine may list it under
    quant_method: str | None
    quant_scheme: str | None
    description: str  # "AWQ-quantized safetensors (Qwen2ForCausalLM)"
    companions: tuple[str, ...] = ()  # mmproj file names that load with a GGUF
    route: str = ""  # the key of the lanes' `routes` (route_key)

    @property
    def architecture(self) -> str | None:
        return self.architectures[0] if self.architectures else None

    @property
    def quantized_for_cuda(self) -> bool:
        return self.kind is ModelKind.SAFETENSORS and self.quant_method in _QUANT_MIN_CC

    @property
    def quant_title(self) -> str:
        return quant_title(self.quant_method, self.quant_scheme)

    def min_compute_capability(self) -> tuple[tuple[int, int], str]:
        """(major, minor) the CUDA lanes need for this model, and why, for messages."""
        if self.is_fp8:
            return (8, 9), "for FP8 weights (Ada Lovelace or Hopper)"
        need = _QUANT_MIN_CC.get(self.quant_method or "", CUDA_MIN_CC) if self.quantized_for_cuda else None
        if need and need > CUDA_MIN_CC:
            return need, f"for {self.quant_title} kernels"
        return CUDA_MIN_CC, ""

    @property
    def is_fp8(self) -> bool:
        return self.quant_method == "fp8" or (
            self.quant_method == "compressed-tensors" and "fp8" in (self.quant_scheme or "").lower()
        )


def _pooled(fmt: ModelFormat) -> str | None:
    """The description of a GGUF that pools its output (an embedding model or a reranker), else None."""
    facts = fmt.facts.facts if isinstance(fmt.facts, GGUFLayout) else None
    if fmt.kind is not ModelKind.GGUF or facts is None or not facts.is_embedding:
        return None
    about = f" ({facts.architecture})" if facts.architecture else ""
    return f"a GGUF reranker{about}" if facts.is_reranker else f"a GGUF embedding model{about}"


def _architectures(fmt: ModelFormat) -> tuple[str, ...]:
    facts = fmt.facts
    names: list[str | None] = []
    if isinstance(facts, GGUFLayout):
        names = [facts.architecture, facts.facts.architecture if facts.facts else None]
    elif isinstance(facts, SafetensorsModel):
        names = [*facts.config.architectures, facts.config.model_type, facts.config.text_model_type]
    elif isinstance(facts, DiffusersPipeline):
        names = [facts.class_name]
    return tuple(dict.fromkeys(n for n in names if n))


def route_key(kind: ModelKind, *, quant_method: str | None, pooled: bool) -> str:
    """What the lanes' `routes` are keyed by (app/lanes/engines/facts.py): the format, or a part of it."""
    if kind is ModelKind.SAFETENSORS and quant_method is not None:
        return "safetensors-quantized" if quant_method in _QUANT_MIN_CC else "safetensors-unloadable"
    return "gguf-pooled" if pooled else kind.value


def _candidates(route: str) -> tuple[str, ...]:
    """The lanes that read a model of this route key, most preferred first (ties in the canonical order)."""
    found = [f for f in FACTS if route in f.routes]
    return tuple(f.id for f in sorted(found, key=lambda f: f.routes[route]))


def quant_title(method: str | None, scheme: str | None) -> str:
    """ "AWQ", "FP8", "compressed-tensors W8A8-fp8"; "" for plain weights."""
    if method == "compressed-tensors" and scheme:
        return f"{method} {scheme}"
    return _QUANT_TITLES.get(method or "", method or "")


def _describe(fmt: ModelFormat, arch: str | None, quant: str) -> str:
    about = f" ({arch})" if arch else ""
    if fmt.kind is ModelKind.SAFETENSORS:
        if not quant:
            return f"plain safetensors{about}"
        return f"{quant} safetensors{about}" if " " in quant else f"{quant}-quantized safetensors{about}"
    if isinstance(fmt.facts, WhisperGGML) and fmt.facts.size_name:
        about = f" ({fmt.facts.size_name})"
    return {
        ModelKind.GGUF: f"a GGUF language model{about}",
        ModelKind.GGUF_DIFFUSION: f"a diffusion GGUF{about}",
        ModelKind.MMPROJ: "a GGUF vision projector (mmproj)",
        ModelKind.MLX: f"an MLX model{about}",
        ModelKind.DIFFUSERS: f"a diffusers pipeline{about}",
        ModelKind.WHISPER_GGML: f"a whisper ggml model{about}",
        ModelKind.PIPER: "a Piper voice",
    }.get(fmt.kind, "a file Switchyard does not recognise as a model")


def traits_of(fmt: ModelFormat) -> ModelTraits:
    # Only a safetensors folder's quantization steers routing; an MLX folder's is MLX's own.
    is_st = fmt.kind is ModelKind.SAFETENSORS
    quant = fmt.facts.quantization if is_st and isinstance(fmt.facts, SafetensorsModel) else None
    method, scheme = (quant.method, quant.scheme) if quant else (None, None)
    encoder = (
        is_st and isinstance(fmt.facts, SafetensorsModel) and _not_generative(fmt.facts.config.architectures)
    )
    pooled = _pooled(fmt)
    route = route_key(fmt.kind, quant_method=method, pooled=pooled is not None)
    candidates = () if encoder else _candidates(route)
    archs = _architectures(fmt)
    return ModelTraits(
        kind=fmt.kind,
        problem=fmt.problem or (_UNKNOWN if fmt.kind is ModelKind.UNKNOWN else None),
        candidates=candidates,
        architectures=archs,
        quant_method=method,
        quant_scheme=scheme,
        description=pooled or _describe(fmt, archs[0] if archs else None, quant_title(method, scheme)),
        companions=tuple(p.name for p in fmt.companions) if fmt.kind is ModelKind.GGUF else (),
        route=route,
    )


_UNKNOWN = "this is not a model format Switchyard knows; use a .gguf, a model folder or a speech model file"


# the heads of models that generate text; a folder whose config names only other heads (BertModel,
# XLMRobertaForSequenceClassification, ...) is an encoder or classifier that no chat lane serves
_GENERATIVE_HEADS = ("ForCausalLM", "ForConditionalGeneration", "LMHeadModel")


def _not_generative(architectures: tuple[str, ...]) -> bool:
    """True only when config.json names its classes and none of them generates text (unknown: False)."""
    return bool(architectures) and not any(a.endswith(_GENERATIVE_HEADS) for a in architectures)


def unroutable_reason(traits: ModelTraits) -> str | None:
    """Why no lane reads a readable model at all (an encoder, a quantization method none loads), or None."""
    if traits.kind is ModelKind.SAFETENSORS and not traits.candidates and not traits.quant_method:
        return (
            f"it is a {traits.architecture or 'model'} (an encoder or classifier), not a text-generation "
            "model; the safetensors lanes serve text-generation models (for embeddings, use a GGUF "
            "embedding model)"
        )
    if traits.kind is ModelKind.SAFETENSORS and traits.quant_method and not traits.candidates:
        return (
            f"its weights are quantized with {traits.quant_method!r}, which no lane here loads; "
            "download a GGUF, AWQ, GPTQ or FP8 build of this model"
        )
    return None


def format_refusal(lane: str, traits: ModelTraits) -> str:
    """Why `lane` does not read this model, and who does."""
    if traits.kind is ModelKind.MMPROJ:
        return (
            f"{PROJECTOR_ALONE}; choose the language model GGUF it belongs to (the projector loads with it)"
        )
    unroutable = unroutable_reason(traits)
    if unroutable:
        return unroutable
    text = f"{title(lane)} {runs(lane)}; this is {traits.description}."
    if traits.candidates:
        text += f" {titles(traits.candidates)} {'runs' if len(traits.candidates) == 1 else 'run'} it."
    facts = facts_of(lane)
    return text + (facts.refusal_tips.get(traits.route, "") if facts else "")


def format_reason(lane: str, traits: ModelTraits) -> str:
    """Why `lane` is the right kind of engine for this model (the first reason of a decision)."""
    facts = facts_of(lane)
    reason = facts.reasons.get(traits.route) if facts else None
    if reason is None:
        return f"This is {traits.description}: {title(lane)} {runs(lane)}."
    companions = (
        f" The vision projector beside it ({', '.join(traits.companions)}) loads with it."
        if traits.companions
        else ""
    )
    return reason.format(description=traits.description, companions=companions)
