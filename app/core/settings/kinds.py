"""The keys only one engine kind reads, an area per kind (two for the CUDA kinds, which share one). Each
kind in app/lanes/engines/ declares the keys it reads at a start (`setting_keys`), all from its own area,
and reads them through it (`settings.mlx.mlx_extra_args`); a change to them restarts that kind's lanes only
(app/core/settings_live.py). The areas live here, not beside the kinds, because settings.json is read and
checked before (and without) any engine kind being imported: core never imports lanes.
tests/lanes/engines/test_kind_settings.py holds every kind to one of KIND_AREAS and every one to a kind.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.core.errors import SettingsError

RUNTIMES = ("auto", "xllamacpp", "llama-server", "docker", "podman", "bin", "path")
# what `runtime = "auto"` tries, in order (docs/engines.md#runtimes); runtime_order may reorder or drop
RUNTIME_ORDER = ("docker", "podman", "bin", "path", "xllamacpp")
# the Settings areas (root.py) that belong to engine kinds
KIND_AREAS = ("llamacpp", "cuda", "mlx", "sdcpp")


@dataclass(frozen=True)
class LlamaCppSettings:
    """llama.cpp: the runtime that runs llama-server (docs/engines.md#runtimes); a start reads runtime and
    llama_server_path, the install reads all four."""

    runtime: str = "auto"
    llama_server_path: str | None = None
    runtime_order: str = ",".join(RUNTIME_ORDER)  # comma-separated, for runtime = "auto"
    llama_cpp_version: str = ""  # the llama.cpp release tag runtime "bin" runs; "": the pin, or "latest"

    def __post_init__(self) -> None:
        if self.runtime not in RUNTIMES:
            raise SettingsError(f"runtime must be one of {', '.join(RUNTIMES)}")
        bad_order = [r for r in self.runtime_order.split(",") if r.strip() not in RUNTIME_ORDER]
        if bad_order or not self.runtime_order.strip():
            known = ", ".join(RUNTIME_ORDER)
            raise SettingsError(f"runtime_order must list some of {known}, comma-separated, e.g. {known!r}")


@dataclass(frozen=True)
class CudaSettings:
    """vLLM and SGLang (docs/engines.md): extra command-line words, split like a shell."""

    vllm_extra_args: str = ""
    sglang_extra_args: str = ""


@dataclass(frozen=True)
class MlxSettings:
    mlx_extra_args: str = ""
    # the MLX lane's warmth is mlx-lm's own prompt cache (it does not bank): how many conversations it
    # keeps and how many MiB they may take; 0 leaves mlx-lm's own default
    mlx_prompt_cache_size: int = 0
    mlx_prompt_cache_mib: int = 0

    def __post_init__(self) -> None:
        for name in ("mlx_prompt_cache_size", "mlx_prompt_cache_mib"):
            if getattr(self, name) < 0:
                raise SettingsError(f"{name} must be 0 (mlx-lm's default) or a positive number")


@dataclass(frozen=True)
class SdSettings:
    """stable-diffusion.cpp (docs/engines.md#the-sdcpp-lane): its sd-server binary, when not on PATH."""

    sd_server_path: str | None = None
    sd_extra_args: str = ""
