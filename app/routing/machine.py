"""Whether this machine can run a lane (for this model), and the sentence that says so either way.

A lane says what it needs (app/lanes/engines/facts.py `Needs`). CUDA (vLLM, SGLang): Linux with an NVIDIA
GPU of compute capability 7.0 or newer (higher for some quantized weights, see traits). A GPU whose compute
capability could not be read is given the benefit of the doubt, and the reason says so. Apple (MLX): Apple
Silicon macOS; on Linux its CPU build runs MLX folders, slowly. The other lanes run on any machine (on the
CPU when there is no GPU).
"""

from __future__ import annotations

from app.formats.detect import ModelKind
from app.hardware.model import GPUInfo, Hardware
from app.lanes.engines.facts import Needs, facts_of
from app.routing.engines import title
from app.routing.traits import ModelTraits

_OS_NAMES = {"linux": "Linux", "darwin": "macOS", "windows": "Windows"}


def parse_cc(text: str | None) -> tuple[int, int] | None:
    """ "8.9" -> (8, 9); None for a missing or odd value."""
    if not text:
        return None
    major, _, minor = text.partition(".")
    if not major.isdigit() or not (minor or "0").isdigit():
        return None
    return int(major), int(minor or "0")


def _cc_text(cc: tuple[int, int]) -> str:
    return f"{cc[0]}.{cc[1]}"


def apple_silicon(hw: Hardware) -> bool:
    return hw.os == "darwin" and hw.arch == "arm64"


def _nvidia(hw: Hardware) -> tuple[GPUInfo, ...]:
    return tuple(g for g in hw.gpus if g.vendor == "nvidia")


def _best_nvidia(hw: Hardware) -> GPUInfo | None:
    """The NVIDIA GPU with the highest compute capability; one with an unreadable value only if no other."""
    gpus = _nvidia(hw)
    known = [g for g in gpus if parse_cc(g.compute_capability)]
    if known:
        return max(known, key=lambda g: parse_cc(g.compute_capability) or (0, 0))
    return gpus[0] if gpus else None


def _gpus_text(hw: Hardware) -> str:
    if not hw.gpus:
        return "no GPU"
    names = ", ".join(g.name for g in hw.gpus)
    return (
        f"a GPU that is not NVIDIA ({names})" if len(hw.gpus) == 1 else f"GPUs that are not NVIDIA ({names})"
    )


def _elsewhere(traits: ModelTraits, hw: Hardware) -> str:
    """Where a model the CUDA lanes cannot run here can run instead."""
    if traits.kind is ModelKind.SAFETENSORS and not traits.quant_method:
        apple = "MLX runs these weights on Apple Silicon; " if apple_silicon(hw) else ""
        return f"{apple}mistral.rs runs these weights without CUDA, and a GGUF build runs on llama.cpp."
    return "A GGUF build of this model runs on llama.cpp on this machine."


def _cuda_refusal(lane: str, traits: ModelTraits, hw: Hardware) -> str | None:
    need, why = traits.min_compute_capability()
    gpu = _best_nvidia(hw)
    name = title(lane)
    if gpu is None:
        return (
            f"{name} needs an NVIDIA GPU with CUDA (compute capability {_cc_text(need)} or newer) on Linux; "
            f"this machine has {_gpus_text(hw)}. {_elsewhere(traits, hw)}"
        )
    if hw.os != "linux":
        os_name = _OS_NAMES.get(hw.os, hw.os)
        return (
            f"{name} runs on Linux only and this machine runs {os_name}; run Switchyard under WSL2 to use "
            f"{name}. {_elsewhere(traits, hw)}"
        )
    cc = parse_cc(gpu.compute_capability)
    if cc is not None and cc < need:
        return (
            f"{name} needs compute capability {_cc_text(need)} or newer{' ' + why if why else ''}; the "
            f"{gpu.name} here is {_cc_text(cc)}. {_elsewhere(traits, hw)}"
        )
    return None


def _mlx_refusal(traits: ModelTraits, hw: Hardware) -> str | None:
    if apple_silicon(hw):
        return None
    if hw.os == "linux" and traits.kind is ModelKind.MLX:
        return None  # the CPU build of mlx; the reason says it is slow
    if hw.os == "linux":
        return (
            "MLX runs plain safetensors only on Apple Silicon; on Linux, vLLM or SGLang (NVIDIA GPU) "
            "or mistral.rs run them."
        )
    alt = (
        "mistral.rs runs these weights."
        if traits.kind is ModelKind.SAFETENSORS
        else "Use a GGUF build of this model on llama.cpp."
    )
    if hw.os == "darwin":
        return f"MLX needs Apple Silicon (an M-series Mac); this Mac has an {hw.arch} CPU. {alt}"
    return (
        f"MLX runs on Apple Silicon macOS (and, slowly, on Linux CPUs), not on "
        f"{_OS_NAMES.get(hw.os, hw.os)}. {alt}"
    )


def _needs(lane: str) -> Needs:
    return f.needs if (f := facts_of(lane)) else Needs.ANY


def hardware_refusal(lane: str, traits: ModelTraits, hw: Hardware) -> str | None:
    """Why this machine cannot run `lane` for this model (what to do included), or None."""
    needs = _needs(lane)
    if needs is Needs.CUDA:
        return _cuda_refusal(lane, traits, hw)
    if needs is Needs.APPLE:
        return _mlx_refusal(traits, hw)
    return None


def hardware_reason(lane: str, traits: ModelTraits, hw: Hardware) -> str | None:
    """What about this machine makes `lane` work (for a lane hardware_refusal passed), or None."""
    machine = _needs(lane)
    if machine is Needs.CUDA:
        need, why = traits.min_compute_capability()
        gpu = _best_nvidia(hw)
        if gpu is None:  # hardware_refusal turns the lane down first; nothing to say here
            return None
        cc = parse_cc(gpu.compute_capability)
        needs = f"{title(lane)} needs {_cc_text(need)} or newer{' ' + why if why else ''}"
        if cc is None:
            return (
                f"The compute capability of the {gpu.name} could not be read; {needs}, so it may not start."
            )
        return f"The {gpu.name} here has compute capability {_cc_text(cc)}; {needs}."
    if machine is Needs.APPLE and apple_silicon(hw):
        return "Apple Silicon: MLX runs on the GPU through Metal, in unified memory."
    if machine is Needs.APPLE:
        return (
            "This is the Linux CPU build of MLX: it runs, but slowly (no GPU); a GGUF build of this model "
            "on llama.cpp will be much faster."
        )
    if not hw.gpus:
        return "No GPU was found, so it runs on the CPU."
    return None
