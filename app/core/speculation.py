"""Speculative decoding and LoRA adapters as a model's settings: their shape, checks and parsed form.

`model_overrides[<id>].speculative` (and a load body's) is `{"type": ..., knobs}`; `lora` is a list of
adapter files with a scale. Pure: the llama.cpp lane turns these into engine parameters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.core.errors import SettingsError

# "ngram" is the n-gram kind that paid best on copy-heavy output here (docs/performance.md)
NGRAM_DEFAULT = "ngram_mod"
NGRAM_TYPES = ("ngram_simple", "ngram_map_k", "ngram_map_k4v", "ngram_mod", "ngram_cache")
SPEC_TYPES = ("off", "ngram", *NGRAM_TYPES, "draft")
# the knobs each type reads; every one is optional (the engine's default otherwise). Public, with the ranges
# below, so a surface (the Tune page) offers exactly what these checks accept
KNOBS: dict[str, tuple[str, ...]] = {
    "off": (),
    "ngram_simple": ("size_n", "size_m", "min_hits"),
    "ngram_map_k": ("size_n", "size_m", "min_hits"),
    "ngram_map_k4v": ("size_n", "size_m", "min_hits"),
    "ngram_mod": ("n_match", "n_min", "n_max"),
    "ngram_cache": (),
    "draft": ("draft", "n_max", "n_min", "p_min", "max_temperature"),
}
INT_RANGES: dict[str, tuple[int, int]] = {"size_n": (1, 64), "size_m": (1, 256), "min_hits": (1, 64)}
INT_RANGES |= {"n_match": (1, 256), "n_min": (0, 256), "n_max": (1, 256)}
FLOAT_RANGES: dict[str, tuple[float, float]] = {"p_min": (0.0, 1.0), "max_temperature": (0.0, 2.0)}
# a LoRA adapter's scale (0 loads it without applying it)
SCALE_RANGE = (-4.0, 4.0)
# above this temperature a draft model's guesses are mostly rejected (docs/performance.md): it is skipped
DRAFT_MAX_TEMPERATURE = 0.3


@dataclass(frozen=True)
class Speculation:
    """One model's speculative decoding: `type` is "off", an n-gram kind (NGRAM_TYPES) or "draft"."""

    type: str = "off"
    draft: str | None = None  # the draft model's id; None: the library proposes one
    n_max: int | None = None
    n_min: int | None = None
    p_min: float | None = None
    size_n: int | None = None
    size_m: int | None = None
    min_hits: int | None = None
    n_match: int | None = None
    max_temperature: float = DRAFT_MAX_TEMPERATURE

    @property
    def on(self) -> bool:
        return self.type != "off"


def speculation_of(value: Any, *, where: str = "speculative") -> Speculation:
    """The parsed setting; SettingsError naming the key, the allowed types and knobs otherwise. The older
    shape `{"draft": "<id>", "n_max": 16}` (no type) means a draft model."""
    if value is None:
        return Speculation()
    if not isinstance(value, dict):
        raise SettingsError(f'{where} must be an object like {{"type": "ngram"}}, got {value!r}')
    kind = value.get("type", "draft" if "draft" in value else None)
    if kind not in SPEC_TYPES:
        raise SettingsError(f"{where}.type must be one of {', '.join(SPEC_TYPES)}, got {kind!r}")
    kind = NGRAM_DEFAULT if kind == "ngram" else kind
    knobs = {k: v for k, v in value.items() if k != "type"}
    allowed = KNOBS[kind]
    if bad := sorted(set(knobs) - set(allowed)):
        raise SettingsError(
            f"{where} of type {kind!r} has unknown keys {bad}; allowed: {', '.join(allowed) or 'none'}"
        )
    for key, v in knobs.items():
        _check_knob(f"{where}.{key}", key, v)
    if "n_min" in knobs and "n_max" in knobs and knobs["n_min"] > knobs["n_max"]:
        raise SettingsError(f"{where}.n_min ({knobs['n_min']}) must not exceed n_max ({knobs['n_max']})")
    return Speculation(type=kind, **knobs)


def _check_knob(where: str, key: str, value: Any) -> None:
    if key == "draft":
        if not isinstance(value, str) or not value:
            raise SettingsError(f"{where} must be the id of a draft model in the library, got {value!r}")
        return
    if key in FLOAT_RANGES:
        bottom, top = FLOAT_RANGES[key]
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not bottom <= value <= top:
            raise SettingsError(f"{where} must be a number from {bottom:g} to {top}, got {value!r}")
        return
    low, high = INT_RANGES[key]
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise SettingsError(f"{where} must be an integer from {low} to {high}, got {value!r}")


@dataclass(frozen=True)
class Adapter:
    """One LoRA adapter file and the scale it is applied with (0 loads it without applying it)."""

    file: str
    scale: float = 1.0


def adapters_of(value: Any, *, where: str = "lora") -> tuple[Adapter, ...]:
    """The parsed list: each item a path, or {"file" (or "path"), "scale"}; SettingsError otherwise."""
    if value is None:
        return ()
    hint = f'{where} must be a list of adapter files, each a path or {{"file": ..., "scale": 1.0}}'
    if not isinstance(value, list):
        raise SettingsError(f"{hint}, got {value!r}")
    out = []
    for item in value:
        if isinstance(item, str) and item:
            out.append(Adapter(item))
            continue
        path = item.get("file", item.get("path")) if isinstance(item, dict) else None
        scale = item.get("scale", 1.0) if isinstance(item, dict) else None
        ok_keys = isinstance(item, dict) and set(item) <= {"file", "path", "scale"}
        low, high = SCALE_RANGE
        ok_scale = isinstance(scale, int | float) and not isinstance(scale, bool) and low <= scale <= high
        if not (ok_keys and isinstance(path, str) and path and ok_scale):
            raise SettingsError(f"{hint} (scale from {low:g} to {high:g}), got {item!r}")
        out.append(Adapter(path, float(scale)))  # type: ignore[arg-type]
    return tuple(out)
