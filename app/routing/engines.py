"""The lanes routing knows about: their ids, display names, what each runs, and how to install it.

Lane ids are the keys of `installed` and `pins`; they never change. Everything here is text for people.
"""

from __future__ import annotations

LLAMA_CPP = "llama.cpp"
LLAMA_CPP_COMPAT = "llama.cpp-compat"  # a second llama.cpp build (app/lanes/engines/llamacpp/compat.py)
MISTRAL_RS = "mistral.rs"
MLX = "mlx"
VLLM = "vllm"
SGLANG = "sglang"
SD_CPP = "sd.cpp"
WHISPER_CPP = "whisper.cpp"
PIPER = "piper"

# The canonical order: rejections of lanes that do not read the model's format are listed in it.
LANES: tuple[str, ...] = (
    LLAMA_CPP,
    LLAMA_CPP_COMPAT,
    MISTRAL_RS,
    MLX,
    VLLM,
    SGLANG,
    SD_CPP,
    WHISPER_CPP,
    PIPER,
)

CUDA_LANES = frozenset({VLLM, SGLANG})

_TITLES = {
    LLAMA_CPP: "llama.cpp",
    LLAMA_CPP_COMPAT: "llama.cpp (capability build)",
    MISTRAL_RS: "mistral.rs",
    MLX: "MLX",
    VLLM: "vLLM",
    SGLANG: "SGLang",
    SD_CPP: "stable-diffusion.cpp",
    WHISPER_CPP: "whisper.cpp",
    PIPER: "Piper",
}

_CUDA_RUNS = (
    "runs safetensors language models, plain or AWQ/GPTQ/FP8/compressed-tensors quantized, on NVIDIA GPUs"
)
_RUNS = {
    LLAMA_CPP: "runs GGUF language models",
    LLAMA_CPP_COMPAT: "runs GGUF models whose architecture the default llama.cpp build does not load",
    MISTRAL_RS: "runs GGUF and plain safetensors language models",
    MLX: "runs MLX models (and plain safetensors on Apple Silicon)",
    VLLM: _CUDA_RUNS,
    SGLANG: _CUDA_RUNS,
    SD_CPP: "runs image diffusion models (diffusers pipelines and diffusion GGUFs)",
    WHISPER_CPP: "runs whisper ggml speech-recognition models",
    PIPER: "runs Piper text-to-speech voices",
}

_INSTALL = {
    LLAMA_CPP: "`pip install xllamacpp`, put llama-server on PATH, or set runtime bin and run `switchyard "
    "serve --pull-only` (the prebuilt llama.cpp release for this machine's GPU)",
    LLAMA_CPP_COMPAT: "`switchyard engine register llama.cpp-compat --python PY` (an interpreter with "
    "another xllamacpp) or `--llama-server PATH` (another revision or a fork), or `switchyard engine install "
    "llama.cpp-compat --version V`",
    MISTRAL_RS: "`switchyard engine install mistral.rs` (the build for this machine: mistralrs-cuda on an "
    "NVIDIA GPU, else mistralrs, which has Metal on Apple Silicon) or `pip install mistralrs`",
    MLX: "`switchyard engine install mlx` (or `pip install mlx-lm`; on Linux `pip install mlx[cpu] mlx-lm`)",
    VLLM: "`switchyard engine install vllm` or `pip install vllm` (Linux with an NVIDIA GPU)",
    SGLANG: "`switchyard engine install sglang` or `pip install sglang` (Linux with an NVIDIA GPU)",
    SD_CPP: "run `switchyard serve --pull-only` (runtime bin fetches the pinned sd-server release for this "
    "machine), or build stable-diffusion.cpp (github.com/leejet/stable-diffusion.cpp) and put sd-server on "
    "PATH (or set sd_server_path)",
    WHISPER_CPP: "`switchyard engine install whisper.cpp` (or `pip install pywhispercpp`)",
    PIPER: "`switchyard engine install piper` (or `pip install piper-tts`)",
}


# the engine builds (app/hardware/build_choice.py) as people read them
_BUILDS = {
    "cpu": "CPU",
    "cuda12": "CUDA 12",
    "cuda13": "CUDA 13",
    "rocm": "ROCm",
    "vulkan": "Vulkan",
    "metal": "Metal",
}


def build_title(build: str | None) -> str:
    """ "CUDA 13 build"; "build unknown" for a binary whose build Switchyard cannot tell."""
    return f"{_BUILDS.get(build, build)} build" if build else "build unknown"


def title(lane: str) -> str:
    return _TITLES.get(lane, lane)


def runs(lane: str) -> str:
    return _RUNS.get(lane, "is not a lane Switchyard knows")


def install_hint(lane: str) -> str:
    return _INSTALL.get(lane, f"install {lane}")


def titles(lanes: tuple[str, ...] | list[str], *, joiner: str = "or") -> str:
    """ "vLLM", "SGLang or vLLM", "A, B or C"."""
    names = [title(x) for x in lanes]
    if len(names) <= 1:
        return "".join(names)
    return f"{', '.join(names[:-1])} {joiner} {names[-1]}"
