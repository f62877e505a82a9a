"""Reading settings.json: flat keys, each checked for its type here and for its value by its area.

A malformed file is reported with its path and the parser's position, and is never rewritten.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from app.core.errors import SettingsError
from app.core.settings.root import Settings

_PATH_LISTS = ("models_dirs", "shared_model_dirs")
_STRING_LISTS = ("allowed_hosts", "cors_origins", "engine_env_pass", "app_stores")
_OPTIONAL_STRINGS = (
    "llama_server_path",
    "sd_server_path",
    "engine_python",
    "hf_endpoint",
    "hf_proxy",
    "hf_cache_dir",
    "tls_cert",
    "tls_key",
    "tracing_otlp_endpoint",
)


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


def settings_from_mapping(raw: dict[str, Any], *, origin: str = "settings") -> Settings:
    known = {f.name: f for f in Settings.fields()}
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in known:
            raise SettingsError(f"{origin}: unknown setting {key!r}; known: {', '.join(sorted(known))}")
        values[key] = _typed(key, value, known[key], origin)
    return Settings.flat(**values)


def _typed(key: str, value: Any, spec: dataclasses.Field[Any], origin: str) -> Any:
    """`value` as key `key` holds it, or SettingsError naming the key and the type it takes."""
    if key in _PATH_LISTS:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise SettingsError(f"{origin}: {key} must be a list of paths")
        return tuple(Path(v).expanduser() for v in value)
    if key in _STRING_LISTS:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise SettingsError(f"{origin}: {key} must be a list of strings")
        return tuple(value)
    if key in _OPTIONAL_STRINGS:
        if value is not None and not isinstance(value, str):
            raise SettingsError(f"{origin}: {key} must be a string or null")
        return value
    if key in _MAPPINGS:
        return _MAPPINGS[key](value, origin)
    if key in ("ram_budget_mib", "max_loaded_lanes"):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            what = "an integer (MiB)" if key == "ram_budget_mib" else "a number of lanes"
            raise SettingsError(f"{origin}: {key} must be {what} or null (automatic)")
        return value
    if key == "update_check_h" and (
        isinstance(value, bool) or not isinstance(value, int | float) or value < 0
    ):
        raise SettingsError(f"{origin}: update_check_h must be a number of hours, 0 or more (0: off)")
    expected = type(spec.default)
    ok = isinstance(value, expected) and not (expected is int and isinstance(value, bool))
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        raise SettingsError(f"{origin}: {key} must be {expected.__name__}, got {type(value).__name__}")
    return value


def _objects(key: str, what: str) -> Any:
    def check(value: Any, origin: str) -> dict[str, Any]:
        if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
            raise SettingsError(f"{origin}: {key} must map {what}")
        return value

    return check


def _app_store_paths(value: Any, origin: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise SettingsError(f"{origin}: app_store_paths must map app names to folders")
    return value


def _policy(value: Any, origin: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SettingsError(f"{origin}: policy must be an object (docs/safety.md)")
    return value


def _notify(value: Any, origin: str) -> dict[str, Any]:
    from app.core.notify import check_config  # the webhook rules live beside their sender

    return check_config(value, origin)


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


_MAPPINGS = {
    "app_store_paths": _app_store_paths,
    "model_overrides": _objects("model_overrides", "model ids to objects"),
    "engine_env": _objects("engine_env", "engine kinds to objects of variables"),
    "gates": _gates,
    "policy": _policy,
    "notify": _notify,
}
