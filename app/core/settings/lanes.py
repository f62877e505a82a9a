"""How lanes run: what stays loaded together and how memory is known (memory), what each model starts
with unless its model_overrides say otherwise (models), and how any engine process is started, watched and
stopped (engines). The keys only one engine kind reads are that kind's area (kinds.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.core.errors import SettingsError
from app.core.speculation import adapters_of, speculation_of

KV_TYPES = ("f16", "bf16", "f32", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl")
FLASH_ATTN = ("auto", "on", "off")
# the keys `POST /api/models/{id}/load` takes; a model_overrides entry takes them and a few more
LOAD_KEYS = (
    "ctx_size",
    "parallel",
    "kv_type",
    "flash_attn",
    "gpu_layers",
    "speculative",
    "lora",
    "split",
    "nodes",
)
OVERRIDE_KEYS = ("ttl_s", *LOAD_KEYS, "session_bank", "mmproj", "max_output")
# kept and shown, but no engine reads them yet: answers say so rather than pretend (none today: the
# llama.cpp lane reads speculative and lora, docs/engines.md#speculative-decoding)
NOT_WIRED_KEYS: tuple[str, ...] = ()


@dataclass(frozen=True)
class MemorySettings:
    """docs/configuration.md#residency: "single" keeps one text lane; "memory" keeps lanes loaded together
    while their footprints fit RAM (minus the reserve, within ram_budget_mib) and GPUs."""

    residency: str = "single"
    # None: 1 with residency "single"; no count cap with "memory" (memory decides); a number caps either
    max_loaded_lanes: int | None = None
    max_embedding_lanes: int = 1
    ram_budget_mib: int | None = None
    memory_reserve_mib: int = 1024
    idle_ttl_s: float = 900.0
    enforce_fit: bool = True
    plan_memory: bool = True
    monitor_interval_s: float = 1.0

    def __post_init__(self) -> None:
        if self.residency not in ("single", "memory"):
            raise SettingsError(f'residency must be "single" or "memory", got {self.residency!r}')
        if self.ram_budget_mib is not None and self.ram_budget_mib < 1:
            raise SettingsError("ram_budget_mib must be a size in MiB (at least 1), or null for no cap")
        if self.memory_reserve_mib < 0:
            raise SettingsError("memory_reserve_mib must be 0 or a size in MiB to leave free")
        if self.max_loaded_lanes is not None and self.max_loaded_lanes < 1:
            raise SettingsError("max_loaded_lanes must be at least 1 (or null: automatic)")
        if self.max_embedding_lanes < 1:
            raise SettingsError("max_embedding_lanes must be at least 1")

    @property
    def loaded_lane_cap(self) -> int | None:
        """How many lanes of one kind may be loaded (None: no count, memory decides): max_loaded_lanes
        where set, else 1 with residency "single" and no cap with "memory"."""
        if self.max_loaded_lanes is not None:
            return self.max_loaded_lanes
        return None if self.residency == "memory" else 1


@dataclass(frozen=True)
class ModelSettings:
    ctx_size: int = 0
    parallel: int = 4
    threads: int = 0
    kv_type: str = "f16"
    flash_attn: str = "auto"
    gpu_layers: int = -1
    prompt_cache_mib: int = 512
    # session banking (docs/engines.md#session-banking): llama.cpp slots saved at a stop, restored on return
    session_bank: bool = True
    session_bank_budget_mib: int = 2048
    model_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kv_type not in KV_TYPES:
            raise SettingsError(f"kv_type {self.kv_type!r} is unknown; use one of {', '.join(KV_TYPES)}")
        if self.flash_attn not in FLASH_ATTN:
            raise SettingsError(f"flash_attn must be one of {', '.join(FLASH_ATTN)}")
        if self.parallel < 1:
            raise SettingsError("parallel must be at least 1")
        for name in ("ctx_size", "threads"):
            if getattr(self, name) < 0:
                raise SettingsError(f"{name} must be 0 (automatic) or a positive number")
        if self.gpu_layers < -1:
            raise SettingsError("gpu_layers must be -1 (automatic) or a number of layers")
        if self.prompt_cache_mib < 0:
            raise SettingsError("prompt_cache_mib must be 0 (off) or a size in MiB")
        if self.session_bank_budget_mib < 0:
            raise SettingsError("session_bank_budget_mib must be 0 (nothing kept) or a size in MiB")
        for model, over in self.model_overrides.items():
            check_overrides(model, over)


def check_overrides(
    model: str, over: dict[str, Any], *, allowed: tuple[str, ...] = OVERRIDE_KEYS, where: str | None = None
) -> None:
    """SettingsError naming the first unknown key (with the allowed ones) or bad value of one model's
    overrides; `where` names their source in the message (default: model_overrides[model])."""
    place = where or f"model_overrides[{model!r}]"
    bad = sorted(set(over) - set(allowed))
    if bad:
        raise SettingsError(f"{place} has unknown keys {bad}; allowed: {', '.join(allowed)}")
    for key, value in over.items():
        _check_override(place, key, value)


def _check_override(place: str, key: str, value: Any) -> None:
    where = f"{place}[{key!r}]"
    if key == "speculative":  # the shapes live in app/core/speculation.py, beside their parsed form
        speculation_of(value, where=where)
        return
    if key == "lora":
        adapters_of(value, where=where)
        return
    if key == "mmproj":  # the vision projector file to load with the model; "none" turns vision off
        if not isinstance(value, str):
            raise SettingsError(f'{where} must be a path to an mmproj .gguf file (or "none"), got {value!r}')
        return
    # split: the paired peers a GGUF is split across (app/lanes/peers/split.py); nodes: those a safetensors
    # model runs across on vLLM or SGLang, one engine process each (app/lanes/peers/multihead.py)
    if key in ("split", "nodes"):
        names = value.split(",") if isinstance(value, str) else value
        if not isinstance(names, list) or not all(isinstance(n, str) and n.strip() for n in names):
            raise SettingsError(
                f'{where} must be a list of paired peers\' names, e.g. ["desk", "laptop"], got {value!r}'
            )
        return
    if key == "session_bank":
        if not isinstance(value, bool):
            raise SettingsError(f"{where} must be true or false, got {value!r}")
        return
    if key in ("kv_type", "flash_attn"):
        allowed = KV_TYPES if key == "kv_type" else FLASH_ATTN
        if value not in allowed:
            raise SettingsError(f"{where} must be one of {', '.join(allowed)}, got {value!r}")
        return
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or (key != "ttl_s" and not isinstance(value, int)):
        kind = "a number of seconds" if key == "ttl_s" else "an integer"
        raise SettingsError(f"{where} must be {kind}, got {value!r}")
    # max_output: the tokens a request that names no limit may generate (engines/llamacpp/request_defaults.py)
    minimum = {"ttl_s": 0, "ctx_size": 0, "parallel": 1, "gpu_layers": -1, "max_output": 1}[key]
    if value < minimum:
        raise SettingsError(f"{where} must be at least {minimum}, got {value!r}")


@dataclass(frozen=True)
class EngineSettings:
    # a request for a model whose engine is not installed installs it as a job (docs/engines.md#first-use)
    auto_install_engines: bool = True
    # the Python 3.11+ that creates engine environments (`switchyard engine install`); None: this
    # process's own interpreter, or in a frozen bundle the newest python3 on PATH (docs/engines.md)
    engine_python: str | None = None
    start_stall_s: float = 60.0
    start_max_s: float = 600.0
    stop_grace_s: float = 5.0
    drain_timeout_s: float = 30.0
    log_ring_lines: int = 2000
    # hung engines (docs/security.md#engines): a lane whose engine sends no byte for this long on a
    # request is marked failed and restarted; long enough for a slow prompt to be read
    engine_read_timeout_s: float = 300.0
    # seconds between liveness checks of a ready engine's health route, and how long one may take
    engine_liveness_s: float = 10.0
    engine_liveness_timeout_s: float = 30.0
    # engines start from an allow-list of environment variables; extra names to pass through, and
    # extra variables per engine kind ({"llama.cpp": {"NAME": "value"}})
    engine_env_pass: tuple[str, ...] = ()
    engine_env: dict[str, dict[str, str]] = field(default_factory=dict)
    # remote lanes (docs/engines.md#remote-lanes): seconds between health checks of each remote
    remote_check_s: float = 30.0

    def __post_init__(self) -> None:
        if self.log_ring_lines < 1:
            raise SettingsError("log_ring_lines must be at least 1")
        for name in (
            "remote_check_s",
            "engine_read_timeout_s",
            "engine_liveness_s",
            "engine_liveness_timeout_s",
        ):
            if getattr(self, name) <= 0:
                raise SettingsError(f"{name} must be a positive number of seconds")
        for kind, extra in self.engine_env.items():
            if not all(isinstance(k, str) and isinstance(v, str) for k, v in extra.items()):
                raise SettingsError(f"engine_env[{kind!r}] must map variable names to string values")
