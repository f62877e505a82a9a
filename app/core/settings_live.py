"""What a settings change means for a running Switchyard: taken at once, a restart of the lanes it touches,
or a wait for the server's next start (with why).

Pure: the Runtime (app/runtime.py `apply_settings`) acts on the answer; the admin API and the window show it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.core.settings import LOAD_KEYS, NOT_WIRED_KEYS, Settings

_BIND = "the server binds its address and sets up TLS when it starts"
_GUARDS = "the request guards (keys, Host and Origin checks) are built when the server starts"
_LIMITS = "the request limits are built when the server starts"

# keys a running server cannot take: they wait for its next start (the desktop: Stop and Start)
SERVER_KEYS: dict[str, str] = {
    "host": _BIND,
    "port": _BIND,
    "tls_cert": _BIND,
    "tls_key": _BIND,
    "allow_plain_lan": _BIND,
    "require_api_key": _GUARDS,
    "allowed_hosts": _GUARDS,
    "cors_origins": _GUARDS,
    "allow_remote_admin": _GUARDS,
    "max_body_mib": _LIMITS,
    "max_concurrent_per_client": _LIMITS,
    "body_timeout_s": _LIMITS,
    "idle_timeout_s": _LIMITS,
    "event_loop": "the event loop is chosen when the process starts",
    "plan_memory": "the hardware is probed once, when the server starts",
    "monitor_interval_s": "the hardware monitor starts with the server",
    "log_ring_lines": "each lane's log ring is made when the lane first appears",
    "tracing_otlp_endpoint": "the span exporter is set up when the server starts",
    "peers_announce": "the mDNS announcement starts and stops with the server's TLS site",
    "starter_model": "the library's sources are set when the server starts",
}

# what every lane reads at its start, per model (model_overrides win over the top-level value)
_MODEL_KEYS = ("ctx_size", "parallel", "kv_type", "flash_attn", "gpu_layers")
# set per model only: the vision projector, speculative decoding and LoRA adapters the engine loads
_MODEL_ONLY_KEYS = ("mmproj", "speculative", "lora")
_COMMON_KEYS = ("threads", "prompt_cache_mib", "engine_env_pass", "engine_python")


def lane_inputs(
    settings: Settings, *, model_id: str, engine: str, engine_keys: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The settings a lane of `engine` running `model_id` starts from: a lane whose inputs differ between
    two settings needs a restart to take the new ones. `engine_keys`: the flat keys only that engine's kind
    reads (its `setting_keys`: its area's keys, app/lanes/engines/)."""
    over = settings.models.model_overrides.get(model_id, {})
    values: dict[str, Any] = {k: over.get(k, settings.value(k)) for k in _MODEL_KEYS}
    values.update({k: over.get(k) for k in _MODEL_ONLY_KEYS})
    values.update({k: settings.value(k) for k in (*_COMMON_KEYS, *engine_keys)})
    values["engine_env"] = settings.engines.engine_env.get(engine)
    return values


def changed_keys(old: Settings, new: Settings) -> list[str]:
    """Flat keys (as settings.json spells them) whose values differ, area by area."""
    return [k for k in Settings.keys() if old.value(k) != new.value(k)]


@dataclass(frozen=True)
class SettingsChange:
    """The answer to applying settings: what was taken at once, which lanes restarted (and why), and the
    keys that wait for the server's next start."""

    applied: tuple[str, ...] = ()
    restarted: dict[str, str] = field(default_factory=dict)  # lane id -> the keys that restarted it
    failed: dict[str, str] = field(default_factory=dict)  # lane id -> why its restart failed
    needs_server_restart: dict[str, str] = field(default_factory=dict)  # key -> why
    not_applied: tuple[str, ...] = ()  # keys kept but read by no engine yet (speculative, lora)

    def public(self) -> dict[str, Any]:
        return {
            "applied": list(self.applied),
            "restarted": dict(self.restarted),
            "failed": dict(self.failed),
            "needs_server_restart": dict(self.needs_server_restart),
            "not_applied": list(self.not_applied),
            "note": self.note(),
        }

    def note(self) -> str:
        """One line for people: what happened, and what still waits."""
        parts = []
        if self.applied:
            parts.append("applied now: " + ", ".join(self.applied))
        if self.restarted:
            parts.append("restarted: " + ", ".join(self.restarted))
        if self.failed:
            parts.append("restart failed: " + "; ".join(f"{k} ({v})" for k, v in self.failed.items()))
        if self.needs_server_restart:
            parts.append("after the server restarts: " + ", ".join(self.needs_server_restart))
        if self.not_applied:
            parts.append("kept, but no engine uses them yet: " + ", ".join(self.not_applied))
        return "; ".join(parts) or "nothing changed"


def not_wired(settings: Settings, *, model_id: str | None = None) -> tuple[str, ...]:
    """The keys set (for one model, or any) that are stored and shown but read by no engine yet."""
    overrides = settings.models.model_overrides
    entries = [overrides.get(model_id, {})] if model_id else overrides.values()
    return tuple(k for k in NOT_WIRED_KEYS if any(k in e for e in entries))


# kept per model under the load body's names, not as a plan parameter of the same name
_SET_KEYS = ("speculative", "lora", "split", "nodes")


def effective(params: dict[str, Any] | None, settings: Settings, *, model_id: str) -> dict[str, Any]:
    """A lane's values under the load body's names: what its engine runs with (its plan's parameters),
    and the speculative and lora settings it was started from."""
    out = {k: (params or {}).get(k) for k in LOAD_KEYS if k not in _SET_KEYS}
    over = settings.models.model_overrides.get(model_id, {})
    out.update({k: over.get(k) for k in _SET_KEYS})
    return out
