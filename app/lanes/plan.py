"""What every engine kind hands the Lane: the command to start one engine process and what it will do.

A LaunchPlan is the same for every kind; only its `params` (a dataclass with at least `model_path`) differ.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from app.fit.plan import FitReport


@dataclass(frozen=True)
class PromptBound:
    """The most tokens a request may hold, counted with this tokenizer.json (the gateway's preflight)."""

    tokens: int
    tokenizer: str


# What a lane can be asked to do, named as the 400 for a missing one names it.
CAPABILITIES = (
    "chat",
    "completions",
    "embeddings",
    "rerank",
    "transcription",
    "translation",
    "speech",
    "images",
    "tools",
    "vision",
)
# memory semantics: "planned" (our estimate, checked against the engine's load log), "fraction" (the engine
# takes the share of the card we give it), "runtime-managed" (the engine sizes its caches as it goes: only
# the measured footprint after load is real), "fixed" (small models whose footprint is their files)
MEMORY_KINDS = ("planned", "fraction", "runtime-managed", "fixed")


@dataclass(frozen=True, kw_only=True)
class LaunchPlan:
    """Everything needed to start one engine process; every field by name (ten of them, several alike)."""

    runtime: str
    argv: tuple[str, ...]
    env: dict[str, str]
    health_path: str
    port: int | None  # None: the process reports its port on stdout
    params: Any  # a dataclass with `model_path`
    fit: FitReport | None = None
    engine: str = "llama.cpp"  # the lane id (app/routing/engines.py)
    memory: str = "planned"
    prediction: dict[str, Any] | None = None  # for kinds whose plan is not a FitReport (a GPU share)
    notes: tuple[str, ...] = field(default=())
    cwd: str | None = None  # the engine's working directory; None: the server's
    # what the gateway bounds a prompt by itself, for engines that would take any (MLX): None for the rest
    prompt_bound: PromptBound | None = None

    def public(self) -> dict[str, Any]:
        return {
            "runtime": self.runtime,
            "engine": self.engine,
            "argv": list(self.argv),
            "params": dataclasses.asdict(self.params),
            "memory": self.memory,
        }

    def predicted(self) -> dict[str, Any] | None:
        if self.prediction is not None:
            return self.prediction
        if self.fit is None or self.fit.chosen is None:
            return None
        devices = self.fit.chosen.devices
        return {
            "placement": self.fit.chosen.name,
            "devices": [d.public() for d in devices],
            "total": sum(d.total for d in devices),
        }
