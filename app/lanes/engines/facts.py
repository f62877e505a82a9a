"""What each lane is, for routing and for people: its id, its title, what it runs, how to install it, which
kinds of model route to it (and in which order), and what machine it needs.

This is the one table of lane ids. It is plain data importing nothing of ours, so app/routing (which sits
below app/lanes) may read it without loading any engine code; tests/structure/test_import_direction.py lets
routing import this module alone and holds it to that. Adding an engine kind adds its row here.

Route keys (`routes`, `reasons`, `refusal_tips`) name what routing reads off a model (app/routing/traits.py
`route_key`): a ModelKind value (gguf, gguf-diffusion, mlx, ...), or `gguf-pooled` (an embedding model or a
reranker), `safetensors` (plain weights), `safetensors-quantized` (a quantization the CUDA kernels load).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeVar

_V = TypeVar("_V")


class Needs(enum.Enum):
    """What machine a lane needs; routing turns the lane down elsewhere (app/routing/machine.py)."""

    ANY = "any"  # runs anywhere, on the CPU when there is no GPU
    CUDA = "cuda"  # Linux with an NVIDIA GPU of a high enough compute capability
    APPLE = "apple"  # Apple Silicon macOS (and, slowly, a Linux CPU build for its own format)


@dataclass(frozen=True, kw_only=True)
class LaneFacts:
    id: str  # the key of `installed` and `pins`; never changes
    title: str
    runs: str  # "runs GGUF language models"
    install_hint: str
    # route key -> rank: the lanes that read a model are tried lowest rank first
    routes: Mapping[str, int] = field(default_factory=dict)
    needs: Needs = Needs.ANY
    # weighed only while a build is registered (a second llama.cpp): without one it is left out altogether
    registered_only: bool = False
    # route key -> why it is the right kind of engine ("{description}" and "{companions}" are filled in)
    reasons: Mapping[str, str] = field(default_factory=dict)
    # route key -> what to do, added where this lane does not read that kind of model
    refusal_tips: Mapping[str, str] = field(default_factory=dict)
    # what to do where the installed build said it does not load a model's architecture
    architecture_tip: str = ""


_COMPAT_INSTALL = (
    "`switchyard engine register llama.cpp-compat --python PY` (an interpreter with another xllamacpp) or "
    "`--llama-server PATH` (another revision or a fork), or `switchyard engine install llama.cpp-compat "
    "--version V`"
)
_ANOTHER_LLAMA = f"register a llama.cpp build that does: {_COMPAT_INSTALL}"
_GGUF_TIP = " To use llama.cpp, download a GGUF build of this model."


def _ggufs(value: _V) -> dict[str, _V]:
    """The same for every GGUF language model, generative or pooled (an embedding model, a reranker)."""
    return {"gguf": value, "gguf-pooled": value}


def _cuda_lane(lane: str, title: str, *, plain: int, quantized: int) -> LaneFacts:
    """A safetensors server for NVIDIA GPUs (vLLM, SGLang): the same row but for its ranks."""
    return LaneFacts(
        id=lane,
        title=title,
        runs="runs safetensors language models, plain or AWQ/GPTQ/FP8/compressed-tensors quantized, on "
        "NVIDIA GPUs",
        install_hint=f"`switchyard engine install {lane}` or `pip install {lane}` (Linux with an NVIDIA GPU)",
        routes={"safetensors": plain, "safetensors-quantized": quantized},
        needs=Needs.CUDA,
        reasons={
            "safetensors": "Plain safetensors on an NVIDIA GPU: vLLM, then SGLang, serve the weights as "
            "they are.",
            "safetensors-quantized": "This is {description}, which needs CUDA kernels: SGLang, then vLLM, "
            "run it.",
        },
    )


# The canonical order: rejections of lanes that do not read the model's format are listed in it, and the
# engine registry (registry.py KINDS) holds its kinds in it.
FACTS: tuple[LaneFacts, ...] = (
    LaneFacts(
        id="llama.cpp",
        title="llama.cpp",
        runs="runs GGUF language models",
        install_hint="`pip install xllamacpp`, put llama-server on PATH, or set runtime bin and run "
        "`switchyard serve --pull-only` (the prebuilt llama.cpp release for this machine's GPU)",
        routes=_ggufs(0),
        reasons=_ggufs("GGUF is llama.cpp's own format: it loads the file as it is.{companions}"),
        refusal_tips={key: _GGUF_TIP for key in ("safetensors", "safetensors-quantized", "mlx")},
        architecture_tip=_ANOTHER_LLAMA,
    ),
    LaneFacts(
        id="llama.cpp-compat",
        title="llama.cpp (capability build)",
        runs="runs GGUF models whose architecture the default llama.cpp build does not load",
        install_hint=_COMPAT_INSTALL,
        routes=_ggufs(1),
        registered_only=True,
        reasons=_ggufs(
            "GGUF is llama.cpp's own format; this second llama.cpp build loads architectures the default "
            "build does not."
        ),
        architecture_tip=_ANOTHER_LLAMA,
    ),
    LaneFacts(
        id="mistral.rs",
        title="mistral.rs",
        runs="runs GGUF and plain safetensors language models",
        install_hint="`switchyard engine install mistral.rs` (the build for this machine: mistralrs-cuda "
        "on an NVIDIA GPU, else mistralrs, which has Metal on Apple Silicon) or `pip install mistralrs`",
        # generative models only: an embedding GGUF (gguf-pooled) would fail every request
        routes={"gguf": 2, "safetensors": 3},
        reasons={
            "gguf": "mistral.rs reads GGUF too (llama.cpp comes first for GGUF).",
            "safetensors": "mistral.rs loads plain safetensors on any machine (CPU, CUDA or Metal).",
        },
    ),
    LaneFacts(
        id="mlx",
        title="MLX",
        runs="runs MLX models (and plain safetensors on Apple Silicon)",
        install_hint="`switchyard engine install mlx` (or `pip install mlx-lm`; on Linux `pip install "
        "mlx[cpu] mlx-lm`)",
        routes={"mlx": 0, "safetensors": 2},
        needs=Needs.APPLE,
        reasons={
            "safetensors": "Plain safetensors on Apple Silicon: MLX loads the weights as they are.",
            "mlx": "This is {description}: MLX is the engine it was converted for.",
        },
    ),
    _cuda_lane("vllm", "vLLM", plain=0, quantized=1),
    _cuda_lane("sglang", "SGLang", plain=1, quantized=0),
    LaneFacts(
        id="sd.cpp",
        title="stable-diffusion.cpp",
        runs="runs image diffusion models (diffusers pipelines and diffusion GGUFs)",
        install_hint="run `switchyard serve --pull-only` (runtime bin fetches the pinned sd-server release "
        "for this machine), or build stable-diffusion.cpp (github.com/leejet/stable-diffusion.cpp) and put "
        "sd-server on PATH (or set sd_server_path)",
        routes={"gguf-diffusion": 0, "diffusers": 0},
        reasons={
            "gguf-diffusion": "This is {description}: stable-diffusion.cpp runs it (llama.cpp runs language "
            "models)."
        },
    ),
    LaneFacts(
        id="whisper.cpp",
        title="whisper.cpp",
        runs="runs whisper ggml speech-recognition models",
        install_hint="`switchyard engine install whisper.cpp` (or `pip install pywhispercpp`)",
        routes={"whisper-ggml": 0},
    ),
    LaneFacts(
        id="piper",
        title="Piper",
        runs="runs Piper text-to-speech voices",
        install_hint="`switchyard engine install piper` (or `pip install piper-tts`)",
        routes={"piper": 0},
    ),
)

LANES: tuple[str, ...] = tuple(f.id for f in FACTS)
_BY_ID = {f.id: f for f in FACTS}


def facts_of(lane: str) -> LaneFacts | None:
    """The row of a lane id, or None for one this Switchyard does not know."""
    return _BY_ID.get(lane)
