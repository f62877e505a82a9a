"""The `policy` setting (docs/safety.md): whether and what the safety judges judge, read into a Policy.

Pure (it imports only the error tree) and in core, so app/core/settings.py checks the setting when settings
load: a bad policy is refused with the key at fault, before the server starts. The judges that apply it
are app/safety (formats.py writes each guard's prompt for the FORMATS named here).

    "policy": {
      "enabled": true,
      "judge": "request" | "answer" | "both",
      "judges": [{"model": "ID", "format": "qwen3guard" | "llamaguard", "timeout_s": 10}],
      "fail": "open" | "closed",          # when no judge answers
      "controversial": "safe" | "unsafe", # how Qwen3Guard's middle verdict counts
      "audit_text": false,                # keep the judged text in audit.db
      "scope": {"groups": [...], "keys": [...], "models": [...]},  # empty or absent: all
      "stream_window": 400                # streamed answers are judged every this many characters
    }
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.core.errors import SettingsError

FORMATS = ("qwen3guard", "llamaguard")  # the guard models' prompt formats (app/safety/formats.py)
# the route groups a scope may name: the API surfaces' names (app/server/surfaces/registry.py; core may not
# import the server, so tests/server/surfaces/test_registry.py checks the two agree)
GROUPS = ("openai", "anthropic", "ollama", "responses")
_KEYS = {"enabled", "judge", "judges", "fail", "controversial", "audit_text", "scope", "stream_window"}
_JUDGE_KEYS = {"model", "format", "timeout_s", "max_tokens", "grammar"}


@dataclass(frozen=True)
class JudgeSpec:
    model: str
    format: str
    timeout_s: float = 10.0
    max_tokens: int = 48
    # for tests only: a GBNF grammar that pins a random-weight model's output to a verdict
    grammar: str | None = None


@dataclass(frozen=True)
class Scope:
    groups: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()
    models: tuple[str, ...] = ()

    def covers(self, *, group: str, key: str | None, model: str) -> bool:
        """Whether a request of route `group`, by key name `key`, for `model` is judged (an empty list
        leaves that dimension open)."""
        return (
            (not self.groups or group in self.groups)
            and (not self.keys or (key is not None and key in self.keys))
            and (not self.models or model in self.models)
        )


@dataclass(frozen=True)
class Policy:
    enabled: bool = False
    judge: str = "request"
    judges: tuple[JudgeSpec, ...] = ()
    fail: str = "open"
    controversial: str = "safe"
    audit_text: bool = False
    scope: Scope = Scope()
    stream_window: int = 400

    @property
    def requests(self) -> bool:
        return self.judge in ("request", "both")

    @property
    def answers(self) -> bool:
        return self.judge in ("answer", "both")

    def applies(self, *, group: str, key: str | None, model: str) -> bool:
        judged = {j.model for j in self.judges}
        # a judge's own request is never judged again (and a request for a judge model is not either)
        return self.enabled and model not in judged and self.scope.covers(group=group, key=key, model=model)


def parse_policy(raw: Any) -> Policy:
    """The Policy `raw` (the setting's JSON) describes; SettingsError naming the first bad key."""
    if raw is None or raw == {}:
        return Policy()
    if not isinstance(raw, dict):
        raise SettingsError('policy must be an object, e.g. {"enabled": true, "judges": [...]}')
    if bad := sorted(set(raw) - _KEYS):
        raise SettingsError(f"policy has unknown keys {bad}; allowed: {', '.join(sorted(_KEYS))}")
    enabled = _bool(raw, "enabled", False)
    judges = tuple(_judge(j, i) for i, j in enumerate(_list(raw, "judges")))
    if enabled and not judges:
        raise SettingsError(
            "policy.enabled is true but policy.judges is empty; add a judge, e.g. with "
            "`switchyard guard enable qwen3guard-0.6b`"
        )
    return Policy(
        enabled=enabled,
        judge=_choice(raw, "judge", ("request", "answer", "both"), "request"),
        judges=judges,
        fail=_choice(raw, "fail", ("open", "closed"), "open"),
        controversial=_choice(raw, "controversial", ("safe", "unsafe"), "safe"),
        audit_text=_bool(raw, "audit_text", False),
        scope=_scope(raw.get("scope", {})),
        stream_window=_int(raw, "stream_window", 400, minimum=16),
    )


def _judge(raw: Any, i: int) -> JudgeSpec:
    where = f"policy.judges[{i}]"
    if not isinstance(raw, dict):
        raise SettingsError(f'{where} must be an object {{"model": ID, "format": "qwen3guard"}}')
    if bad := sorted(set(raw) - _JUDGE_KEYS):
        raise SettingsError(f"{where} has unknown keys {bad}; allowed: {', '.join(sorted(_JUDGE_KEYS))}")
    model = raw.get("model")
    if not isinstance(model, str) or not model:
        raise SettingsError(f"{where}.model must be a model id from `switchyard ls`")
    fmt = raw.get("format")
    if fmt not in FORMATS:
        raise SettingsError(f"{where}.format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    timeout = raw.get("timeout_s", 10.0)
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0:
        raise SettingsError(f"{where}.timeout_s must be a positive number of seconds, got {timeout!r}")
    grammar = raw.get("grammar")
    if grammar is not None and not isinstance(grammar, str):
        raise SettingsError(f"{where}.grammar must be a GBNF grammar string (for tests) or absent")
    return JudgeSpec(
        model=model,
        format=fmt,
        timeout_s=float(timeout),
        max_tokens=_int(raw, "max_tokens", 48, minimum=4, where=where),
        grammar=grammar,
    )


def _scope(raw: Any) -> Scope:
    if not isinstance(raw, dict) or set(raw) - {"groups", "keys", "models"}:
        raise SettingsError('policy.scope must be an object of lists: {"groups", "keys", "models"}')
    groups = tuple(_strings(raw, "groups", where="policy.scope"))
    if unknown := [g for g in groups if g not in GROUPS]:
        raise SettingsError(f"policy.scope.groups has unknown groups {unknown}; known: {', '.join(GROUPS)}")
    return Scope(
        groups=groups,
        keys=tuple(_strings(raw, "keys", where="policy.scope")),
        models=tuple(_strings(raw, "models", where="policy.scope")),
    )


def _bool(raw: dict[str, Any], key: str, default: bool) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise SettingsError(f"policy.{key} must be true or false, got {value!r}")
    return value


def _choice(raw: dict[str, Any], key: str, allowed: tuple[str, ...], default: str) -> str:
    value = raw.get(key, default)
    if value not in allowed:
        raise SettingsError(f"policy.{key} must be one of {', '.join(allowed)}, got {value!r}")
    return str(value)


def _int(raw: dict[str, Any], key: str, default: int, *, minimum: int, where: str = "policy") -> int:
    value = raw.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise SettingsError(f"{where}.{key} must be an integer of at least {minimum}, got {value!r}")
    return value


def _list(raw: dict[str, Any], key: str) -> list[Any]:
    value = raw.get(key, [])
    if not isinstance(value, list):
        raise SettingsError(f"policy.{key} must be a list")
    return value


def _strings(raw: dict[str, Any], key: str, *, where: str) -> list[str]:
    value = raw.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SettingsError(f"{where}.{key} must be a list of strings")
    return value
