"""What routing needs to know about a model, taken from its ModelFormat: which lanes read it, in which order
of preference, its architecture names, and how its weights are quantized.

The format rules (preference order): GGUF -> llama.cpp, mistral.rs; quantized safetensors -> SGLang, vLLM;
plain safetensors -> vLLM, SGLang, MLX, mistral.rs (hardware narrows it: CUDA, Apple Silicon, elsewhere);
MLX -> MLX; diffusers and diffusion GGUFs -> sd.cpp; whisper ggml -> whisper.cpp; piper voices -> piper;
an mmproj alone, an unknown file or an unrecognised quantization -> no lane.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.formats.detect import ModelFormat, ModelKind
from app.formats.diffusers_meta import DiffusersPipeline
from app.formats.gguf_layout import GGUFLayout
from app.formats.safetensors_meta import SafetensorsModel
from app.formats.speech_meta import WhisperGGML
from app.routing.engines import (
    LLAMA_CPP,
    LLAMA_CPP_COMPAT,
    MISTRAL_RS,
    MLX,
    PIPER,
    SD_CPP,
    SGLANG,
    VLLM,
    WHISPER_CPP,
    runs,
    title,
    titles,
)

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


def _safetensors_candidates(method: str | None) -> tuple[str, ...]:
    if method is None:
        return (VLLM, SGLANG, MLX, MISTRAL_RS)
    if method in _QUANT_MIN_CC:
        return (SGLANG, VLLM)
    return ()  # a method no lane here loads; every lane says so


_CANDIDATES = {
    ModelKind.GGUF: (
        LLAMA_CPP,
        MISTRAL_RS,
    ),  # llama.cpp-compat joins after llama.cpp when registered (decide)
    ModelKind.GGUF_DIFFUSION: (SD_CPP,),
    ModelKind.MLX: (MLX,),
    ModelKind.DIFFUSERS: (SD_CPP,),
    ModelKind.WHISPER_GGML: (WHISPER_CPP,),
    ModelKind.PIPER: (PIPER,),
}


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
    if fmt.kind is ModelKind.SAFETENSORS:
        candidates = () if encoder else _safetensors_candidates(method)
    elif pooled is not None:  # mistral.rs runs generative models only: every request would fail 503
        candidates = (LLAMA_CPP,)
    else:
        candidates = _CANDIDATES.get(fmt.kind, ())
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
    if lane == LLAMA_CPP and traits.kind in (ModelKind.SAFETENSORS, ModelKind.MLX):
        text += " To use llama.cpp, download a GGUF build of this model."
    return text


def format_reason(lane: str, traits: ModelTraits) -> str:
    """Why `lane` is the right kind of engine for this model (the first reason of a decision)."""
    if traits.kind is ModelKind.GGUF and lane == LLAMA_CPP:
        text = "GGUF is llama.cpp's own format: it loads the file as it is."
        if traits.companions:
            text += f" The vision projector beside it ({', '.join(traits.companions)}) loads with it."
        return text
    if traits.kind is ModelKind.GGUF and lane == LLAMA_CPP_COMPAT:
        return (
            "GGUF is llama.cpp's own format; this second llama.cpp build loads architectures the default "
            "build does not."
        )
    if traits.kind is ModelKind.GGUF:
        return f"{title(lane)} reads GGUF too (llama.cpp comes first for GGUF)."
    if traits.quantized_for_cuda:
        return f"This is {traits.description}, which needs CUDA kernels: SGLang, then vLLM, run it."
    if traits.kind is ModelKind.SAFETENSORS and lane in (VLLM, SGLANG):
        return "Plain safetensors on an NVIDIA GPU: vLLM, then SGLang, serve the weights as they are."
    if traits.kind is ModelKind.SAFETENSORS and lane == MLX:
        return "Plain safetensors on Apple Silicon: MLX loads the weights as they are."
    if traits.kind is ModelKind.SAFETENSORS:
        return "mistral.rs loads plain safetensors on any machine (CPU, CUDA or Metal)."
    if traits.kind is ModelKind.MLX:
        return f"This is {traits.description}: MLX is the engine it was converted for."
    if traits.kind is ModelKind.GGUF_DIFFUSION:
        return f"This is {traits.description}: stable-diffusion.cpp runs it (llama.cpp runs language models)."
    return f"This is {traits.description}: {title(lane)} {runs(lane)}."
