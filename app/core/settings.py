"""Settings: defaults, then `settings.json` in SWITCHYARD_HOME, then command-line overrides.

A malformed file is reported with its path and the parser's position, and is never rewritten.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from app.core.errors import SettingsError
from app.core.policy import parse_policy  # pure: it imports only the error tree
from app.core.speculation import adapters_of, speculation_of
from app.core.tracing import check_endpoint

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8686
KV_TYPES = ("f16", "bf16", "f32", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl")
FLASH_ATTN = ("auto", "on", "off")
RUNTIMES = ("auto", "xllamacpp", "llama-server", "docker", "podman", "bin", "path")
# what `runtime = "auto"` tries, in order (docs/engines.md#runtimes); runtime_order may reorder or drop
RUNTIME_ORDER = ("docker", "podman", "bin", "path", "xllamacpp")
# the keys `POST /api/models/{id}/load` takes; a model_overrides entry takes them and a few more
LOAD_KEYS = ("ctx_size", "parallel", "kv_type", "flash_attn", "gpu_layers", "speculative", "lora")
OVERRIDE_KEYS = ("ttl_s", *LOAD_KEYS, "session_bank", "mmproj", "max_output")
# the apps whose model stores are read in place (app/library/app_stores/); `folder` is shared_model_dirs
APP_STORES = ("ollama", "lmstudio", "jan", "gpt4all")
# kept and shown, but no engine reads them yet: answers say so rather than pretend (none today: the
# llama.cpp lane reads speculative and lora, docs/engines.md#speculative-decoding)
NOT_WIRED_KEYS: tuple[str, ...] = ()


@dataclass(frozen=True)
class Settings:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    models_dirs: tuple[Path, ...] = ()
    # other apps' model stores read in place (docs/library.md#other-apps-stores): which apps, a folder per
    # app where it is not the app's default, and shared folders of the user's own (read-only too)
    app_stores: tuple[str, ...] = APP_STORES
    app_store_paths: dict[str, str] = field(default_factory=dict)
    shared_model_dirs: tuple[Path, ...] = ()
    # a request for a model whose engine is not installed installs it as a job (docs/engines.md#first-use)
    auto_install_engines: bool = True
    # None: 1 with residency "single"; no count cap with "memory" (memory decides); a number caps either
    max_loaded_lanes: int | None = None
    max_embedding_lanes: int = 1
    # residency (docs/configuration.md#residency): "single" keeps one text lane; "memory" keeps lanes
    # loaded together while their footprints fit RAM (minus the reserve, within ram_budget_mib) and GPUs
    residency: str = "single"
    ram_budget_mib: int | None = None
    memory_reserve_mib: int = 1024
    idle_ttl_s: float = 900.0
    ctx_size: int = 0
    parallel: int = 4
    threads: int = 0
    kv_type: str = "f16"
    flash_attn: str = "auto"
    gpu_layers: int = -1
    runtime: str = "auto"
    llama_server_path: str | None = None
    runtime_order: str = ",".join(RUNTIME_ORDER)  # comma-separated, for runtime = "auto"
    llama_cpp_version: str = ""  # the llama.cpp release tag runtime "bin" runs; "": the pin, or "latest"
    start_stall_s: float = 60.0
    start_max_s: float = 600.0
    stop_grace_s: float = 5.0
    drain_timeout_s: float = 30.0
    log_ring_lines: int = 2000
    prompt_cache_mib: int = 512
    # session banking (docs/engines.md#session-banking): llama.cpp slots saved at a stop, restored on return
    session_bank: bool = True
    session_bank_budget_mib: int = 2048
    plan_memory: bool = True
    monitor_interval_s: float = 1.0
    event_loop: str = "auto"
    enforce_fit: bool = True
    # list the starter model shipped as a Python package (app/library/starter.py) in the library
    starter_model: bool = True
    # request limits (docs/api.md#request-limits)
    max_body_mib: int = 64
    max_concurrent_per_client: int = 0
    idle_timeout_s: float = 60.0
    body_timeout_s: float = 60.0
    # live transcription (docs/api.md#live-transcription): one session's length and its uncommitted audio
    realtime_max_session_s: float = 1800.0
    realtime_max_buffer_s: float = 60.0
    check_prompt_length: bool = True
    # images in chat requests (docs/api.md#images): the decoded size cap, and http(s) image URLs fetched
    # by the server (off: only data: URLs); private and loopback addresses only when allowed
    max_image_mib: int = 20
    # pixels an image may declare (every GIF/WebP frame and GIF's logical screen too), and all of one
    # request's images together: checked before anything is decoded (a small file can declare a huge picture)
    max_image_megapixels: int = 40
    max_request_megapixels: int = 80
    fetch_image_urls: bool = False
    fetch_image_private: bool = False
    fetch_image_timeout_s: float = 10.0
    model_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    # standing update gates (docs/evals.md#update-gates): model id -> {"suite", "min_score"}
    gates: dict[str, dict[str, Any]] = field(default_factory=dict)
    # safety judges (docs/safety.md): which requests and answers guard models judge; {} is off
    policy: dict[str, Any] = field(default_factory=dict)
    # security (docs/security.md): keys are always required on a non-loopback bind
    require_api_key: bool = False
    allowed_hosts: tuple[str, ...] = ()
    cors_origins: tuple[str, ...] = ()
    allow_remote_admin: bool = False
    # Hugging Face hub and downloads (docs/hub.md); None means: the HF_* environment, then the default
    hf_endpoint: str | None = None
    hf_proxy: str | None = None
    hf_cache_dir: str | None = None
    offline: bool = False
    hf_token_file: bool = False  # opt-in: keep the HF token in a 0600 file where no keyring exists
    download_concurrency: int = 2
    download_parts: int = 4
    # desktop window (docs/desktop.md): start the local API when the window opens
    start_server_with_app: bool = True
    # lanes other than llama.cpp (docs/engines.md): extra command-line words, split like a shell
    vllm_extra_args: str = ""
    sglang_extra_args: str = ""
    mlx_extra_args: str = ""
    # the MLX lane's warmth is mlx-lm's own prompt cache (it does not bank): how many conversations it
    # keeps and how many MiB they may take; 0 leaves mlx-lm's own default
    mlx_prompt_cache_size: int = 0
    mlx_prompt_cache_mib: int = 0
    # the Python 3.11+ that creates engine environments (`switchyard engine install`); None: this
    # process's own interpreter, or in a frozen bundle the newest python3 on PATH (docs/engines.md)
    engine_python: str | None = None
    # stable-diffusion.cpp (docs/engines.md#the-sdcpp-lane): its sd-server binary, when not on PATH
    sd_server_path: str | None = None
    sd_extra_args: str = ""
    # remote lanes (docs/engines.md#remote-lanes): seconds between health checks of each remote
    remote_check_s: float = 30.0
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
    # TLS (docs/security.md#tls): certificate and key files; None: a self-signed pair under the data dir
    tls_cert: str | None = None
    tls_key: str | None = None
    # a non-loopback bind needs TLS unless this is set
    allow_plain_lan: bool = False
    # traces (docs/tracing.md): the OTLP/HTTP collector spans go to (its base URL); None: no tracing at all
    tracing_otlp_endpoint: str | None = None
    # jobs (docs/jobs.md): hours between update checks of pulled models (0: off), and the webhooks told of
    # job ends, failed gates, refusals and engine crashes ({"webhooks": [...], "refusals_per_hour": N})
    update_check_h: float = 6.0
    notify: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._check()

    @property
    def loaded_lane_cap(self) -> int | None:
        """How many lanes of one kind may be loaded (None: no count, memory decides): max_loaded_lanes
        where set, else 1 with residency "single" and no cap with "memory"."""
        if self.max_loaded_lanes is not None:
            return self.max_loaded_lanes
        return None if self.residency == "memory" else 1

    def _check(self) -> None:
        if not 0 <= self.port <= 65535:
            raise SettingsError(f"port {self.port} is out of range; use 1-65535 (or 0 for any free port)")
        if self.kv_type not in KV_TYPES:
            raise SettingsError(f"kv_type {self.kv_type!r} is unknown; use one of {', '.join(KV_TYPES)}")
        if self.flash_attn not in FLASH_ATTN:
            raise SettingsError(f"flash_attn must be one of {', '.join(FLASH_ATTN)}")
        if self.event_loop not in ("auto", "asyncio", "uvloop"):
            raise SettingsError("event_loop must be auto, asyncio or uvloop")
        if self.runtime not in RUNTIMES:
            raise SettingsError(f"runtime must be one of {', '.join(RUNTIMES)}")
        bad_order = [r for r in self.runtime_order.split(",") if r.strip() not in RUNTIME_ORDER]
        if bad_order or not self.runtime_order.strip():
            known = ", ".join(RUNTIME_ORDER)
            raise SettingsError(f"runtime_order must list some of {known}, comma-separated, e.g. {known!r}")
        if self.residency not in ("single", "memory"):
            raise SettingsError(f'residency must be "single" or "memory", got {self.residency!r}')
        if self.ram_budget_mib is not None and self.ram_budget_mib < 1:
            raise SettingsError("ram_budget_mib must be a size in MiB (at least 1), or null for no cap")
        if self.memory_reserve_mib < 0:
            raise SettingsError("memory_reserve_mib must be 0 or a size in MiB to leave free")
        for name in ("max_loaded_lanes", "max_embedding_lanes", "parallel"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise SettingsError(
                    f"{name} must be at least 1"
                    + (" (or null: automatic)" if name == "max_loaded_lanes" else "")
                )
        for name in ("ctx_size", "threads"):
            if getattr(self, name) < 0:
                raise SettingsError(f"{name} must be 0 (automatic) or a positive number")
        if self.gpu_layers < -1:
            raise SettingsError("gpu_layers must be -1 (automatic) or a number of layers")
        if self.prompt_cache_mib < 0:
            raise SettingsError("prompt_cache_mib must be 0 (off) or a size in MiB")
        for name in ("mlx_prompt_cache_size", "mlx_prompt_cache_mib"):
            if getattr(self, name) < 0:
                raise SettingsError(f"{name} must be 0 (mlx-lm's default) or a positive number")
        if self.session_bank_budget_mib < 0:
            raise SettingsError("session_bank_budget_mib must be 0 (nothing kept) or a size in MiB")
        if self.max_image_mib < 1:
            raise SettingsError("max_image_mib must be at least 1")
        if not 1 <= self.max_image_megapixels <= self.max_request_megapixels:
            raise SettingsError(
                "max_image_megapixels must be at least 1 and at most max_request_megapixels (the budget of "
                "all of a request's images together)"
            )
        if self.max_body_mib < 1:
            raise SettingsError("max_body_mib must be at least 1")
        for name in ("realtime_max_session_s", "realtime_max_buffer_s"):
            if getattr(self, name) <= 0:
                raise SettingsError(f"{name} must be a number of seconds above 0")
        if self.max_concurrent_per_client < 0:
            raise SettingsError("max_concurrent_per_client must be 0 (unlimited) or a number of requests")
        for name in ("idle_timeout_s", "body_timeout_s"):
            if getattr(self, name) <= 0:
                raise SettingsError(f"{name} must be a positive number of seconds")
        for name in ("download_concurrency", "download_parts"):
            if not 1 <= getattr(self, name) <= 32:
                raise SettingsError(f"{name} must be between 1 and 32")
        for name in ("hf_endpoint", "hf_proxy"):
            value = getattr(self, name)
            if value is not None and urlsplit(value).scheme not in ("http", "https"):
                raise SettingsError(f"{name} must be an http:// or https:// URL, got {value!r}")
        if self.tracing_otlp_endpoint is not None and (why := check_endpoint(self.tracing_otlp_endpoint)):
            raise SettingsError(f"tracing_otlp_endpoint {why}; or remove it to turn tracing off")
        if self.log_ring_lines < 1:
            raise SettingsError("log_ring_lines must be at least 1")
        for name in (
            "remote_check_s",
            "fetch_image_timeout_s",
            "engine_read_timeout_s",
            "engine_liveness_s",
            "engine_liveness_timeout_s",
        ):
            if getattr(self, name) <= 0:
                raise SettingsError(f"{name} must be a positive number of seconds")
        for kind, extra in self.engine_env.items():
            if not all(isinstance(k, str) and isinstance(v, str) for k, v in extra.items()):
                raise SettingsError(f"engine_env[{kind!r}] must map variable names to string values")
        _check_app_stores(self.app_stores, self.app_store_paths)
        _check_security(self.allowed_hosts, self.cors_origins)
        for model, over in self.model_overrides.items():
            check_overrides(model, over)
        parse_policy(self.policy)  # SettingsError naming the policy key at fault

    def ttl_for(self, model_id: str) -> float:
        return float(self.model_overrides.get(model_id, {}).get("ttl_s", self.idle_ttl_s))

    def override(self, model_id: str, key: str, default: Any) -> Any:
        return self.model_overrides.get(model_id, {}).get(key, default)

    def with_changes(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    def public(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["models_dirs"] = [str(p) for p in self.models_dirs]
        out["shared_model_dirs"] = [str(p) for p in self.shared_model_dirs]
        return out


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
    if key in ("speculative", "lora"):
        _check_adapters(where, key, value)
        return
    if key == "mmproj":  # the vision projector file to load with the model; "none" turns vision off
        if not isinstance(value, str):
            raise SettingsError(f'{where} must be a path to an mmproj .gguf file (or "none"), got {value!r}')
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


def _check_adapters(where: str, key: str, value: Any) -> None:
    # the shapes live in app/core/speculation.py, beside their parsed form
    if key == "speculative":
        speculation_of(value, where=where)
    else:
        adapters_of(value, where=where)


def _check_app_stores(apps: tuple[str, ...], paths: dict[str, str]) -> None:
    for name in (*apps, *paths):
        if name not in APP_STORES:
            raise SettingsError(
                f"app_stores/app_store_paths name {name!r}, not an app whose store Switchyard reads; "
                f"use some of {', '.join(APP_STORES)} (shared_model_dirs takes folders of your own)"
            )
    for name, folder in paths.items():
        if not isinstance(folder, str) or not folder.strip():
            raise SettingsError(f"app_store_paths[{name!r}] must be a folder path, got {folder!r}")


def _check_security(hosts: tuple[str, ...], origins: tuple[str, ...]) -> None:
    for h in hosts:
        bare = h[1:-1] if h.startswith("[") and h.endswith("]") else h
        try:
            ipaddress.ip_address(bare)
        except ValueError:
            if not re.fullmatch(r"[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?", h):
                raise SettingsError(
                    f"allowed_hosts entry {h!r} must be a plain host name or address (no scheme, port or "
                    "'*'), e.g. 'switchyard.lan' or '192.168.1.20'"
                ) from None
    for o in origins:
        parts = urlsplit(o)
        try:
            parts.port  # noqa: B018 - raises on a malformed port
        except ValueError:
            parts = urlsplit("")
        if (
            o.strip() in ("*", "null")
            or parts.scheme not in ("http", "https")
            or not parts.hostname
            or "*" in o
            or parts.path not in ("", "/")
            or parts.query
            or parts.fragment
            or parts.username
        ):
            raise SettingsError(
                f"cors_origins entry {o!r} must be an exact origin, scheme://host[:port], e.g. "
                "'http://localhost:5173'; '*', 'null' and paths are not allowed"
            )


_FIELDS = {f.name: f for f in dataclasses.fields(Settings)}


def load_settings(path: Path) -> Settings:
    """Read `path` if it exists; unknown keys and wrong types are errors that name the key."""
    if not path.exists():
        return Settings()
    return settings_from_mapping(settings_document(path, path.read_text(encoding="utf-8")), origin=str(path))


def settings_document(path: Path, text: str) -> dict[str, Any]:
    """The JSON object in settings file `path` (its `text`); anything else is an error that leaves it be."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SettingsError(
            f"{path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); "
            "fix or remove the file — it was left untouched"
        ) from exc
    if not isinstance(raw, dict):
        raise SettingsError(f"{path} must hold a JSON object of settings; fix it — it was left untouched")
    return raw


def _gates(value: Any, origin: str) -> dict[str, dict[str, Any]]:
    """Each standing gate names a suite (a built-in name or a file) and a pass mark from 0 to 1."""
    if not isinstance(value, dict):
        raise SettingsError(f"{origin}: gates must map model ids to {{suite, min_score}}")
    for model, gate in value.items():
        suite = gate.get("suite") if isinstance(gate, dict) else None
        score = gate.get("min_score") if isinstance(gate, dict) else None
        ok_score = isinstance(score, int | float) and not isinstance(score, bool) and 0 <= score <= 1
        if not isinstance(suite, str) or not suite or not ok_score or set(gate) - {"suite", "min_score"}:
            raise SettingsError(
                f'{origin}: gates[{model!r}] must be {{"suite": NAME or FILE, "min_score": 0..1}}; '
                "`switchyard gate MODEL SUITE N` writes one"
            )
    return value


def settings_from_mapping(raw: dict[str, Any], *, origin: str = "settings") -> Settings:
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in _FIELDS:
            raise SettingsError(f"{origin}: unknown setting {key!r}; known: {', '.join(sorted(_FIELDS))}")
        default = _FIELDS[key].default
        if key in ("models_dirs", "shared_model_dirs"):
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise SettingsError(f"{origin}: {key} must be a list of paths")
            values[key] = tuple(Path(v).expanduser() for v in value)
        elif key == "app_store_paths":
            if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
                raise SettingsError(f"{origin}: app_store_paths must map app names to folders")
            values[key] = value
        elif key == "model_overrides":
            if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
                raise SettingsError(f"{origin}: model_overrides must map model ids to objects")
            values[key] = value
        elif key == "gates":
            values[key] = _gates(value, origin)
        elif key == "policy":
            if not isinstance(value, dict):
                raise SettingsError(f"{origin}: policy must be an object (docs/safety.md)")
            values[key] = value
        elif key == "notify":
            from app.core.notify import check_config  # the webhook rules live beside their sender

            values[key] = check_config(value, origin)
        elif key == "update_check_h" and (
            isinstance(value, bool) or not isinstance(value, int | float) or value < 0
        ):
            raise SettingsError(f"{origin}: update_check_h must be a number of hours, 0 or more (0: off)")
        elif key == "engine_env":
            if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
                raise SettingsError(f"{origin}: engine_env must map engine kinds to objects of variables")
            values[key] = value
        elif key in ("allowed_hosts", "cors_origins", "engine_env_pass", "app_stores"):
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise SettingsError(f"{origin}: {key} must be a list of strings")
            values[key] = tuple(value)
        elif key in ("ram_budget_mib", "max_loaded_lanes"):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                what = "an integer (MiB)" if key == "ram_budget_mib" else "a number of lanes"
                raise SettingsError(f"{origin}: {key} must be {what} or null (automatic)")
            values[key] = value
        elif key in (
            "llama_server_path",
            "sd_server_path",
            "engine_python",
            "hf_endpoint",
            "hf_proxy",
            "hf_cache_dir",
            "tls_cert",
            "tls_key",
            "tracing_otlp_endpoint",
        ):
            if value is not None and not isinstance(value, str):
                raise SettingsError(f"{origin}: {key} must be a string or null")
            values[key] = value
        else:
            expected = type(default)
            ok = isinstance(value, expected) and not (expected is int and isinstance(value, bool))
            if expected is float and isinstance(value, int) and not isinstance(value, bool):
                value, ok = float(value), True
            if not ok:
                raise SettingsError(
                    f"{origin}: {key} must be {expected.__name__}, got {type(value).__name__}"
                )
            values[key] = value
    return Settings(**values)
